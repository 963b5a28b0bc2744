"""Per-GPU history from the agents' heartbeats (issue 26; gpuq.domain.gpu_history): each
running job's UnitSamples are summed in memory into its units' current 5-minute bucket; once
a bucket is over, its rows (one per unit and job) go to the store in one write of the
coordinator's writer (its group commit), never a write per heartbeat. Reads add the buckets
not stored yet, so the map shows what GPUs do now. Buckets past [coordinator]
gpu_history_days are pruned by a chore (gpuq.coordinator.serving).

Only a unit of the reporting node that the job holds is taken, with each figure checked: a
heartbeat is never refused for its samples, and an agent cannot write rows for another node's
units or another job's.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence

from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.node_table import NodeTable
from gpuq.domain.gpu_history import BUCKET, UnitUse, bucket_of
from gpuq.domain.limits import MAX_NODE_UNITS
from gpuq.domain.states import JobState
from gpuq.v1 import agent_pb2 as apb

log = logging.getLogger(__name__)
FINAL_WRITE = 5.0  # seconds the last buckets may take to be stored when the coordinator stops
MAX_MEMORY = 2**62  # bytes: anything more is an agent's nonsense


class GpuHistory:
    def __init__(
        self,
        writer: StoreWriter,
        jobs: LiveJobs,
        nodes: NodeTable,
        days: float,
        clock: Callable[[], float],
    ) -> None:
        self.writer = writer
        self.jobs = jobs
        self.nodes = nodes
        self.days = days
        self.clock = clock
        self._open: dict[tuple[str, str, int, int], UnitUse] = {}  # buckets being summed
        self._oldest: int | None = None  # the oldest bucket in _open
        self._writing: list[UnitUse] = []  # over, on their way to the store
        self._flushing: asyncio.Task[None] | None = None

    def heard(self, node: str, samples: Sequence[apb.JobSample]) -> None:
        """A heartbeat's samples of the jobs running on `node`: of each job, the units it
        holds there."""
        entry = self.nodes.nodes.get(node)
        if entry is None or not samples:
            return
        bucket = bucket_of(self.clock())
        units = {u.uuid for u in entry.node.units}
        for sample in samples[:MAX_NODE_UNITS]:
            job = self.jobs.jobs.get(sample.job_id)
            if job is None or job.state is not JobState.RUNNING or node not in job.node_names:
                continue
            held = units.intersection(job.gpus)
            for unit in sample.units[:MAX_NODE_UNITS]:
                if unit.uuid not in held:
                    continue
                key = (node, unit.uuid, bucket, job.id)
                use = self._open.get(key)
                if use is None:
                    use = self._open[key] = UnitUse(node, unit.uuid, bucket, job.id, job.user)
                    self._oldest = min(bucket, self._oldest if self._oldest is not None else bucket)
                use.add(_util(unit), min(unit.memory, MAX_MEMORY))
        if self._flushing is None and self._oldest is not None and self._oldest < bucket:
            self._flushing = asyncio.get_running_loop().create_task(self._flush(bucket))

    def unstored(self) -> list[UnitUse]:
        """The buckets not in the store yet (being summed, or being written)."""
        return [*self._writing, *self._open.values()]

    async def _flush(self, bucket: int) -> None:
        """Store the buckets that are over (one write; a failed one is logged and dropped:
        history is worth less than a coordinator that keeps going)."""
        try:
            over = [key for key in self._open if key[2] < bucket]
            self._writing = [self._open.pop(key) for key in over]
            self._oldest = min((key[2] for key in self._open), default=None)
            uses = self._writing
            await self.writer.write(lambda tx: tx.add_gpu_usage(uses))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("GPU history was not stored")
        finally:
            self._writing = []
            self._flushing = None

    async def prune(self) -> None:
        """A chore: drop buckets older than [coordinator] gpu_history_days."""
        before = self.clock() - self.days * 86400
        gone = await self.writer.write(lambda tx: tx.prune_gpu_usage(before))
        if gone:
            log.info("GPU history: %d buckets older than %g days pruned", gone, self.days)

    async def close(self) -> None:
        """Store what was summed so far, the current buckets too (the next coordinator adds
        the rest of them to these rows), within FINAL_WRITE seconds."""
        if self._flushing is not None:
            await asyncio.gather(self._flushing, return_exceptions=True)
        uses = list(self._open.values())
        self._open.clear()
        self._oldest = None
        if not uses:
            return
        try:
            write = self.writer.write(lambda tx: tx.add_gpu_usage(uses), fail_fast=True)
            await asyncio.wait_for(write, FINAL_WRITE)
        except Exception as error:
            log.warning("GPU history of the last %d s was not stored: %s", BUCKET, error)


def _util(unit: apb.UnitSample) -> float | None:
    if not unit.HasField("util"):
        return None
    util = unit.util
    return util if math.isfinite(util) and 0.0 <= util <= 100.0 else None
