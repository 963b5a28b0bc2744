"""What a start is given beyond its units: a MASTER_PORT and the secret of its steps.

torch.distributed's rendezvous listens on MASTER_ADDR:MASTER_PORT on a job's first node, and
gpuq's step workers listen one port above on every other node. Two jobs that share a node must
not pick the same port, so the coordinator picks per start, from a range kept for jobs
(SLURM's MpiParams ports=... is the same idea), avoiding the ports of the jobs already running
on any of the start's nodes. The pick is pseudo-random from the job id, so jobs started one
after another do not walk the range in lockstep with a port someone else holds.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

FIRST_PORT = 20000  # the range kept for jobs' rendezvous: [FIRST_PORT, LAST_PORT]
LAST_PORT = 29999
_PAIRS = (LAST_PORT - FIRST_PORT + 1) // 2  # even ports: MASTER_PORT; odd: the step workers'


def choose_master_port(job_id: int, attempt: int, taken: Iterable[int]) -> int:
    """An even port in the range that no job in `taken` (MASTER_PORTs of jobs on the same
    nodes) holds. When every pair is taken (25,000 jobs on one node) the job still gets one:
    it shares it, and the rendezvous of one of them fails with "address in use"."""
    used = set(taken)
    first = (job_id * 7919 + attempt * 104729) % _PAIRS
    for offset in range(_PAIRS):
        port = FIRST_PORT + 2 * ((first + offset) % _PAIRS)
        if port not in used:
            return port
    return FIRST_PORT + 2 * first


def new_step_key() -> str:
    """A start's secret for srun and its step workers: 32 random bytes, hex."""
    return secrets.token_hex(32)
