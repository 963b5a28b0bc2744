"""`gpuq slurm-shims DIR`: SLURM's commands on gpuq, for a PATH (gpuq.slurm)."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command("slurm-shims")
@click.argument("folder", metavar="DIR", type=click.Path(path_type=Path))
def slurm_shims(folder: Path) -> int:
    """Write sbatch, squeue, scancel, sinfo, sacct, srun, salloc and scontrol into DIR (made
    if missing), each running gpuq with this Python, for people and tools that know only
    SLURM: put DIR on their PATH. Never on a machine that runs a real SLURM. A file in DIR
    that is not gpuq's shim is never replaced."""
    from gpuq.slurm.shim_files import write_shims

    paths = write_shims(folder.absolute(), sys.executable)
    click.echo(
        f"wrote {len(paths)} SLURM commands to {folder.absolute()}: "
        + " ".join(p.name for p in paths)
    )
    return 0
