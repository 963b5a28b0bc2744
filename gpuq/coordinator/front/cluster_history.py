"""The cluster's history as the dashboard shows it (issue 26): each GPU's utilisation and
memory over the last hours or days (gpuq.domain.gpu_history: the stored buckets summed into at
most MAX_COLUMNS columns, with those not stored yet), and each user's GPU time over the same
range, running jobs included.

Privacy (access.permissions.sees, "usage"): where `[coordinator] private_data` holds "usage",
a caller who is not an admin sees other users' cells without their user and job, and only
their own row of the per-user table; every GPU's figures stay (the cluster view shows them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from gpuq.coordinator.access.permissions import sees
from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.node_table import NodeTable
from gpuq.coordinator.workload.history_buckets import GpuHistory
from gpuq.domain.gpu_history import (
    RANGES,
    HistoryMap,
    Row,
    Unit,
    UnitUse,
    frame,
    history_map,
)
from gpuq.domain.states import JobState
from gpuq.errors import InvalidInput
from gpuq.identity import Caller
from gpuq.store.api import Store


@dataclass(frozen=True, slots=True)
class UserUsage:
    """One user over a range: GPU-seconds held in it (ended and running jobs), the GPUs and
    jobs running now, and the mean utilisation of the GPUs they held (None: unknown)."""

    user: str
    gpu_seconds: float
    running_gpus: int
    running_jobs: int
    util_mean: float | None


@dataclass(frozen=True, slots=True)
class ClusterView:
    range: str
    now: float
    map: HistoryMap
    users: tuple[UserUsage, ...]  # most GPU time first


class ClusterHistory:
    def __init__(
        self,
        writer: StoreWriter,
        jobs: LiveJobs,
        nodes: NodeTable,
        history: GpuHistory,
        private_data: tuple[str, ...],
        clock: Callable[[], float],
    ) -> None:
        self.writer = writer
        self.jobs = jobs
        self.nodes = nodes
        self.history = history
        self.private_data = private_data
        self.clock = clock

    async def view(self, caller: Caller, range_name: str) -> ClusterView:
        """The map and the per-user table over the last `range_name` (a RANGES key)."""
        span = RANGES.get(range_name)
        if span is None:
            raise InvalidInput("range", range_name[:20], f"expected one of {', '.join(RANGES)}")
        now = self.clock()
        columns = frame(span, now)
        since = now - span

        def read(store: Store) -> tuple[list[UnitUse], dict[str, float]]:
            return store.gpu_history(columns), store.held_seconds(since)

        stored, held = await self.writer.read(read)
        mapped = history_map(columns, self._units(), [*stored, *self.history.unstored()])
        return ClusterView(
            range_name, now, self._private(caller, mapped), self._users(caller, mapped, held, since)
        )

    def _units(self) -> list[Unit]:
        return [
            Unit(name, u.uuid, u.index, f"{u.name} {u.mig_profile or ''}".strip(), u.memory)
            for name, entry in self.nodes.nodes.items()
            for u in entry.node.units
        ]

    def _users(
        self, caller: Caller, mapped: HistoryMap, held: dict[str, float], since: float
    ) -> tuple[UserUsage, ...]:
        now = self.clock()
        seconds = dict(held)
        gpus: dict[str, int] = {}
        running: dict[str, int] = {}
        for job in self.jobs.in_state(JobState.RUNNING):
            if not job.gpus:
                continue
            start = max(job.start_time or now, since)
            seconds[job.user] = seconds.get(job.user, 0.0) + len(job.gpus) * max(0.0, now - start)
            gpus[job.user] = gpus.get(job.user, 0) + len(job.gpus)
            running[job.user] = running.get(job.user, 0) + 1
        rows = []
        for user in seconds.keys() | mapped.users.keys():
            if not sees(caller, user, "usage", self.private_data):
                continue
            total, known = mapped.users.get(user, (0.0, 0))
            rows.append(
                UserUsage(
                    user,
                    seconds.get(user, 0.0),
                    gpus.get(user, 0),
                    running.get(user, 0),
                    total / known if known else None,
                )
            )
        return tuple(sorted(rows, key=lambda r: (-r.gpu_seconds, r.user)))

    def _private(self, caller: Caller, mapped: HistoryMap) -> HistoryMap:
        """The map less the holders `caller` may not see."""
        if "usage" not in self.private_data or caller.admin:
            return mapped

        def shown(user: str) -> bool:
            return sees(caller, user, "usage", self.private_data)

        rows = tuple(
            Row(
                row.unit,
                tuple(c if shown(c.user) else replace(c, user="", job_id=0) for c in row.cells),
            )
            for row in mapped.rows
        )
        users = {u: v for u, v in mapped.users.items() if shown(u)}
        return replace(mapped, rows=rows, users=users)
