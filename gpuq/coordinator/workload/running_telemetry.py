"""Running jobs' GPU telemetry, from their agents' heartbeats (issue 12).

Each heartbeat's JobSamples carry what a job's GPUs did so far (`so_far`) and a sample of now.
The latest `so_far` of each running job is kept here; every FLUSH_EVERY seconds the changed
ones are stored with the job (so `gpuq show` of a running job has them, at most that old), and
the series points gathered since (at most one per job per SERIES_STEP seconds) are appended,
in one write of the coordinator's writer. A job's end report carries its final figures, which
the end's own transaction stores (gpuq.coordinator.workload.job_endings); the latest `so_far`
stands in when an end comes without them (a node lost, an agent that does not measure).

Only a job the coordinator runs on the reporting node is taken, and every figure is checked
(gpuq.convert.telemetry_from_proto): a heartbeat is never refused for its telemetry.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from gpuq.convert import telemetry_from_proto
from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.domain.limits import MAX_NODE_UNITS
from gpuq.domain.model import JobTelemetry, SeriesPoint
from gpuq.domain.node_telemetry import combined
from gpuq.domain.states import JobState
from gpuq.store.api import StoreTx
from gpuq.v1 import agent_pb2 as apb

log = logging.getLogger(__name__)

SERIES_STEP = 30.0  # seconds: at most one series point per job this often
SERIES_CAP = 2880  # points per job (a day at SERIES_STEP); older ones are thinned past it
FLUSH_EVERY = 30.0  # seconds between writes of running jobs' telemetry and series
# the dashboard's chart of a running job (gpuq.web): its latest points, not yet stored
RECENT_STEP = 2.0  # seconds: at most one recent point per job this often
RECENT_POINTS = 90  # recent points kept per running job (3 minutes at RECENT_STEP)


class RunningTelemetry:
    def __init__(self, writer: StoreWriter, jobs: LiveJobs, clock: Callable[[], float]) -> None:
        self.writer = writer
        self.jobs = jobs
        self.clock = clock
        self._so_far: dict[int, tuple[int, JobTelemetry]] = {}  # job -> (attempt, figures)
        # a multi-node job's figures so far from each node, combined into _so_far
        self._by_node: dict[int, dict[str, tuple[int, JobTelemetry]]] = {}
        self._changed: set[int] = set()
        self._last_point: dict[int, float] = {}
        self._points: list[SeriesPoint] = []
        self._flush_at = 0.0
        self._flushing: asyncio.Task[None] | None = None
        self._recent: dict[int, deque[SeriesPoint]] = {}  # running job -> latest points

    def running(self, node: str, samples: Sequence[apb.JobSample]) -> None:
        """A heartbeat's samples of the jobs on `node`."""
        now = self.clock()
        for sample in samples[:MAX_NODE_UNITS]:
            job = self.jobs.jobs.get(sample.job_id)
            if job is None or job.state is not JobState.RUNNING or node not in job.node_names:
                continue
            if sample.HasField("so_far"):
                self._keep(job.id, job.start_count, node, telemetry_from_proto(sample.so_far))
            if node != job.node:
                continue  # the series (a line per job) follows the first node's GPUs
            at = sample.at if math.isfinite(sample.at) and 0 < sample.at <= now + 60 else now
            point = SeriesPoint(job.id, at, min(sample.gpu_mem, 2**62), _mean_util(sample))
            recent = self._recent.setdefault(job.id, deque(maxlen=RECENT_POINTS))
            if not recent or at - recent[-1].at >= RECENT_STEP or at < recent[-1].at:
                recent.append(point)
            last = self._last_point.get(job.id)
            if last is None or at - last >= SERIES_STEP or at < last:
                self._last_point[job.id] = at
                self._points.append(point)
        if (self._changed or self._points) and now >= self._flush_at and self._flushing is None:
            self._flush_at = now + FLUSH_EVERY
            self._flushing = asyncio.get_running_loop().create_task(self._flush())

    def _keep(self, job_id: int, attempt: int, node: str, figures: JobTelemetry) -> None:
        nodes = self._by_node.setdefault(job_id, {})
        nodes[node] = (attempt, figures)
        parts = [f for a, f in nodes.values() if a == attempt]
        self._so_far[job_id] = (attempt, combined(parts) or figures)
        self._changed.add(job_id)

    def with_final(
        self, job_id: int, attempt: int, node: str, final: JobTelemetry | None
    ) -> JobTelemetry | None:
        """A multi-node job's figures once `node` reported its end with `final`: that node's
        final figures with the other nodes' latest (None: no node measured anything)."""
        parts = {n: f for n, (a, f) in self._by_node.get(job_id, {}).items() if a == attempt}
        if final is not None:
            parts[node] = final  # else that node's latest stands in, as for one node
        return combined(list(parts.values()))

    def latest(self, job_id: int, attempt: int) -> JobTelemetry | None:
        """The latest figures of start `attempt` of a job (0: whichever start)."""
        kept = self._so_far.get(job_id)
        if kept is None or (attempt and kept[0] != attempt):
            return None
        return kept[1]

    def forget(self, job_ids: Iterable[int]) -> None:
        """These jobs ended: their final figures are stored with the end, and their recent
        points after the last series point are stored with the next flush, so a short job's
        chart keeps its detail (at most RECENT_POINTS more points per job)."""
        for job_id in job_ids:
            self._so_far.pop(job_id, None)
            self._by_node.pop(job_id, None)
            self._changed.discard(job_id)
            last = self._last_point.pop(job_id, None)
            recent = self._recent.pop(job_id, None) or ()
            self._points.extend(p for p in recent if last is None or p.at > last)

    def recent(self, job_id: int) -> list[SeriesPoint]:
        """A job's points not stored yet, oldest first: a running job's latest (at most one
        per RECENT_STEP; its stored series lags by up to FLUSH_EVERY + SERIES_STEP), or an
        ended job's that wait for the next flush."""
        ring = self._recent.get(job_id)
        if ring is not None:
            return list(ring)
        return [p for p in self._points if p.job_id == job_id]

    async def close(self) -> None:
        if self._flushing is not None:
            self._flushing.cancel()
            await asyncio.gather(self._flushing, return_exceptions=True)

    async def _flush(self) -> None:
        try:
            figures = {i: self._so_far[i] for i in self._changed if i in self._so_far}
            points, self._points = self._points, []
            self._changed.clear()
            await self.writer.write(lambda tx: store_running(tx, figures, points))
        except asyncio.CancelledError:
            raise
        except Exception:  # a bad batch must not stop later ones
            log.exception("running jobs' telemetry was not stored")
        finally:
            self._flushing = None


def store_running(
    tx: StoreTx, figures: dict[int, tuple[int, JobTelemetry]], points: Sequence[SeriesPoint]
) -> None:
    """Store running jobs' figures so far (only for a job still running that start: an end
    stored meanwhile keeps its own) and series points (of jobs that exist)."""
    ids = set(figures) | {p.job_id for p in points}
    states = tx.job_states(ids)
    starts = tx.start_counts(figures)
    for job_id, (attempt, telemetry) in sorted(figures.items()):
        if states.get(job_id) is JobState.RUNNING and starts.get(job_id) == attempt:
            tx.set_telemetry(job_id, attempt, telemetry)
    tx.add_series([p for p in points if p.job_id in states], SERIES_CAP)


def _mean_util(sample: apb.JobSample) -> float | None:
    """Mean percent busy over the sample's units; unknown if any unit's is unknown."""
    utils = [u.util for u in sample.units if u.HasField("util")]
    if not utils or len(utils) != len(sample.units):
        return None
    if not all(math.isfinite(u) and 0.0 <= u <= 100.0 for u in utils):
        return None
    return sum(utils) / len(utils)
