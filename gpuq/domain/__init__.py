"""The pure core: data (model), states and units. Nothing here does I/O.

Import from the submodules (gpuq.domain.model, .arrays, .dependencies, .limits, .parsing,
.states, .units, .codec); this package re-exports nothing, so that importing a light module
(units) does not load the others.
"""
