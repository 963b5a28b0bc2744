"""Running jobs' progress and throughput, from their agents' heartbeats (README "Progress and
throughput").

Each heartbeat carries the newest progress line of each running job's output and when it was
read (gpuq.agent.progress_watch). Each job's readings go into a ThroughputTrack
(gpuq.domain.progress): its rate, its ETA, and when the rate collapsed ("throughput fell from
3.2 to 0.1 it/s at 14:02", the clock as the idle flags write it). Memory only, for the job's
current start: forgotten when it stops running (gpuq.coordinator.server.stopped_running), and
a restarted coordinator starts afresh.

Only the node that runs a job's script is heard, for the job's current start; every figure is
checked (gpuq.coordinator.nodes.agent_input.progress_from_proto). What is shown is built once
per reading (`shown`): the job's pages (gpuq.coordinator.front) only copy it, and only for
those who may see the job's output (its owner and admins).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuq.convert import throughput_to_proto
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.nodes.agent_input import MAX_JOB_SAMPLES, progress_from_proto
from gpuq.coordinator.workload.idle_rules import clock_text
from gpuq.domain.progress import ThroughputTrack
from gpuq.domain.states import JobState
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

RUNNING = JobState.RUNNING
FUTURE_SLACK = 60.0  # seconds an agent's reading time may be ahead of the coordinator's clock


@dataclass(slots=True)
class _Tracked:
    start: int  # the job's start the readings are of
    track: ThroughputTrack
    shown: pb.JobThroughput  # what the latest reading says, on the wire (a new one each time)


class RunningProgress:
    def __init__(
        self,
        jobs: LiveJobs,
        clock: Callable[[], float],
        when: Callable[[float], str] = clock_text,
    ) -> None:
        self.jobs = jobs
        self.clock = clock
        self.when = when  # a collapse's time as its line shows it
        self._tracked: dict[int, _Tracked] = {}

    def heard(self, node: str, readings: Sequence[apb.JobProgress]) -> None:
        """A heartbeat's progress readings of the jobs on `node`."""
        now = self.clock()
        for message in readings[:MAX_JOB_SAMPLES]:
            job = self.jobs.jobs.get(message.job_id)
            if job is None or job.state is not RUNNING or job.node != node:
                continue  # only the node that runs its script reads its output
            if message.attempt and job.start_count and message.attempt != job.start_count:
                continue  # about an earlier start
            progress = progress_from_proto(message)
            if progress is None:
                continue
            at = message.at
            if not (math.isfinite(at) and 0 < at <= now + FUTURE_SLACK):
                at = now
            tracked = self._tracked.get(job.id)
            if tracked is None or tracked.start != job.start_count:
                tracked = _Tracked(job.start_count, ThroughputTrack(), pb.JobThroughput())
                self._tracked[job.id] = tracked
            tracked.track.add(at, progress)
            throughput = tracked.track.now()
            if throughput is None:
                continue
            collapse = ""
            if throughput.fell_at is not None:
                collapse = throughput.collapse_line(self.when(throughput.fell_at))
            tracked.shown = throughput_to_proto(throughput, tracked.track.readings[-1].at, collapse)
        if self._tracked:
            jobs = self.jobs.jobs
            gone = [i for i in self._tracked if i not in jobs or jobs[i].state is not RUNNING]
            for job_id in gone:
                del self._tracked[job_id]

    def shown(self, job_id: int, start: int) -> pb.JobThroughput | None:
        """The job's progress as its latest reading says it (of that start), or None. Not to
        be changed: copy it."""
        tracked = self._tracked.get(job_id)
        if tracked is None or tracked.start != start or not tracked.track.readings:
            return None
        return tracked.shown

    def forget(self, job_id: int) -> None:
        self._tracked.pop(job_id, None)
