"""Memory from the store: what a starting coordinator loads (live jobs, nodes, fair-share
usage, drains, how arrays that live jobs wait on ended so far), the reload after a failed
scheduling pass, when memory may have parted from the store, and the measured run times that
estimated starts use (read again every few minutes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.node_table import NodeEntry, NodeTable
from gpuq.coordinator.memory.scheduler_inputs import SchedulerInputs
from gpuq.domain.model import Job
from gpuq.domain.right_sizing import MEASURED_DAYS, MEASURED_RUNS, run_time_table
from gpuq.domain.states import JobState
from gpuq.store.records import JobQuery

log = logging.getLogger(__name__)

LIVE = frozenset({JobState.PENDING, JobState.HELD, JobState.RUNNING})
MAX_RUN_KEYS = 2000  # (user, name)s whose run times one read asks for, at most


class MemoryLoader:
    def __init__(
        self,
        writer: StoreWriter,
        jobs: LiveJobs,
        nodes: NodeTable,
        inputs: SchedulerInputs,
        clock: Callable[[], float],
        steady: Callable[[], float],
    ) -> None:
        self.writer = writer
        self.jobs = jobs
        self.nodes = nodes
        self.inputs = inputs
        self.clock = clock
        self.steady = steady  # what nodes' silences are measured by (NodeEntry.heard_at)

    async def load(self) -> list[Job]:
        """Everything memory holds, at start; nodes get a full heartbeat timeout to
        reconnect. The live jobs loaded."""
        jobs = await self.writer.read(lambda s: s.list_jobs(JobQuery(states=LIVE)))
        nodes = await self.writer.read(lambda s: s.list_nodes())
        self.inputs.usage = await self.writer.read(lambda s: s.usage())
        now = self.clock()
        self.inputs.refresh_shares({j.user for j in jobs}, now)
        self.jobs.reset(jobs)
        await self.load_outcomes({j.array_job_id for j in jobs} - {None})
        for node in nodes:
            self.nodes.nodes[node.name] = NodeEntry(node, last_seen=now, heard_at=self.steady())
        drains = await self.writer.read(lambda s: s.drains())
        self.nodes.drains = {(d.node, d.unit): d for d in drains}
        log.info("coordinator started: %d live jobs, %d known nodes", len(jobs), len(nodes))
        return jobs

    async def reload_jobs(self) -> None:
        jobs = await self.writer.read(lambda s: s.list_jobs(JobQuery(states=LIVE)))
        self.jobs.reset(jobs)
        await self.load_outcomes({j.array_job_id for j in jobs} - {None})

    async def load_outcomes(self, arrays: set[int | None]) -> None:
        """The worst ending so far of each array's ended tasks (see SchedulerInputs)."""
        wanted = sorted(a for a in arrays if a is not None)
        if not wanted:
            return
        counts = await self.writer.read(lambda s: s.array_states(wanted))
        for array, by_state in counts.items():
            failed = sorted(s for s in by_state if not s.is_live and s is not JobState.COMPLETED)
            if failed:
                self.inputs.array_worst[array] = failed[0]

    async def read_run_times(self) -> None:
        """The measured run times of the live jobs without --time, per (user, name): the p90
        of their latest completed runs of the last MEASURED_DAYS (SchedulerInputs.run_times).
        At most MAX_RUN_KEYS (user, name)s, by user and state in the store (indexed)."""
        inputs = self.inputs
        inputs.run_times_missing = False
        inputs.run_times_at = self.clock()
        wanted = sorted(
            {
                (j.user, j.spec.name)
                for j in self.jobs.jobs.values()
                if not j.spec.resources.time_limit
            }
        )[:MAX_RUN_KEYS]
        users = sorted({u for u, _ in wanted})
        names = sorted({n for _, n in wanted})
        since = inputs.run_times_at - MEASURED_DAYS * 86400
        rows = await self.writer.read(lambda s: s.run_times(users, names, since, MEASURED_RUNS))
        keys = set(wanted)
        inputs.run_times = run_time_table(r for r in rows if (r[0], r[1]) in keys)
        inputs.run_times_read = keys
