"""The pure core: what a job, a node and a GPU are, and the rules about them. Nothing here does
I/O, and nothing here imports anything of gpuq but gpuq.domain and gpuq.errors.

Import from the submodules (gpuq.domain.model, .states, .units, .limits, .array_specs,
.dependencies, .gpu_types, .node_constraints, .interactive_jobs, .policy, .parsing, .notify,
.notices, .patterns, .codec); this package re-exports nothing, so that importing a light module
(units) does not load the others.
"""
