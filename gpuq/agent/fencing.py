"""Fencing: a job must never run in two places, and the coordinator gives a silent node's jobs
to other nodes. So the job's own supervisor stops it when its lease runs out, whatever became
of this agent (dead, frozen, or cut off); the agent only extends the leases.

A lease runs to `mark + fence_time`, where `mark` is the latest moment (this host's monotonic
clock) at which the agent sent a message the coordinator has confirmed taking as a sign of life
(it echoes Heartbeat.sent and Register.sent as CoordinatorMessage.seen). The coordinator's
last sign of life from the node is never earlier than that mark, so once it has waited
`fence_time` plus the kill grace past it, every supervisor has stopped its job (see
gpuq.coordinator.nodes.node_admin and the supervisor's "Fencing" comment). An agent that
restarts gives no lease until the coordinator confirms it again; until then its supervisors
keep the leases the last agent gave them, so a restart inside fence_time costs no job.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from gpuq.agent.jobs.supervisors import Supervisors

LEASE_STEP_MAX = 1.0  # seconds a lease may lag the latest confirmation, at most (fewer messages)


class Fence:
    def __init__(
        self,
        fence_time: float,
        supervisors: Supervisors,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = fence_time
        self.supervisors = supervisors
        self.clock = clock
        self.confirmed: float | None = None  # the latest mark the coordinator confirmed
        self._given: float | None = None  # the lease last given to supervisors
        self._step = min(LEASE_STEP_MAX, fence_time / 10)

    def confirm(self, mark: float) -> None:
        """The coordinator took a message this agent sent at `mark` as a sign of life: leases
        run to mark + fence_time. A mark that cannot be one of this agent's (in the future,
        not a number) changes nothing."""
        if not math.isfinite(mark) or mark <= 0 or mark > self.clock():
            return
        if self.confirmed is not None and mark <= self.confirmed:
            return
        self.confirmed = mark
        until = mark + self.limit
        if self._given is None or until - self._given >= self._step:
            self._given = until
            self.supervisors.lease(until)

    def lost(self) -> None:
        """The connection to the coordinator is gone: the leases stand (they run out
        fence_time after the last confirmation), now with the reason a fenced job will give."""
        if self.confirmed is None:
            return
        self._given = self.confirmed + self.limit
        why = f"no word from the coordinator for {self.limit:g} s"
        self.supervisors.lease(self._given, why)
