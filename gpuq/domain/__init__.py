"""The pure core: data (model), states and units. Nothing here does I/O.

Import from the submodules (gpuq.domain.model, .states, .units); this package re-exports
nothing, so that importing a light module (units) does not load the others.
"""
