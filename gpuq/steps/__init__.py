"""Job steps: `srun` and `gpuq run` inside a job, the follower nodes' step workers, and the
`srun`/`scontrol` shims that scripts written for SLURM find first on a job's PATH.

This module stays light (the CLI imports it to decide whether `gpuq run` is a step).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SHIMS = ("srun", "scontrol")


def shim_dir() -> str:
    """The folder holding the `srun` and `scontrol` shims (POSIX sh scripts that exec
    `${GPUQ_PYTHON:-python3} -m gpuq.steps...`): the agent puts it first on a job's PATH."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "shims")


def inside_job(environ: Mapping[str, str]) -> bool:
    """Whether this process runs inside a gpuq job that can run steps (the agent set the
    job's id and its step variables): then `gpuq run` starts a step instead of a new job."""
    return bool(environ.get("GPUQ_JOB_ID")) and bool(
        environ.get("GPUQ_STEP_KEY") or environ.get("GPUQ_JOB_NODES")
    )
