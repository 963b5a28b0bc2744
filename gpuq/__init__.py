"""gpuq: a SLURM-style batch queue for shared GPU servers."""
