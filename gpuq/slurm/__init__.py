"""SLURM's own commands on gpuq, opt-in: `gpuq slurm-shims DIR` writes `sbatch`, `squeue`,
`scancel`, `sinfo`, `sacct`, `srun`, `salloc` and `scontrol` into DIR, each one line that runs
gpuq.slurm.commands with this installation's Python. They exist for people and tools that know
only SLURM (submitit, Snakemake's SLURM executor, a lab's old scripts): the flags and output
formats those rely on, SLURM's state names and exit codes, and a one-line refusal for the rest,
so nothing goes on with a wrong answer.

`formats` is pure (SLURM's field codes and names, its state words, its time forms);
`job_commands` and `listing_commands` do the talking, through gpuq.client and the submit path
of `gpuq submit` (gpuq.submission, with sbatch's command line read as `#SBATCH` lines are).
The shims inside a job (gpuq.steps.shims) stay what they are; `srun` here hands over to them
inside a job.
"""
