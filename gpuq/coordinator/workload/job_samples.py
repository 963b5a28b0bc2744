"""Running jobs' samples from their agents' heartbeats: fed to the idle and hung rules
(gpuq.coordinator.workload.idle_rules), to the running jobs' GPU telemetry and to the per-GPU
history (gpuq.coordinator.workload.history_buckets) (and their progress readings to
gpuq.coordinator.workload.running_progress), and acted on: a
flag set or cleared is noted in the job's events, and a job its QOS says to cancel is
cancelled through the normal cancel path, by the coordinator itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.access.permissions import SYSTEM
from gpuq.coordinator.background_tasks import Background
from gpuq.coordinator.changes.effects import Cause, Effects, Note
from gpuq.coordinator.changes.job_changes import JobChanges
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.nodes.agent_input import MAX_JOB_SAMPLES, sample_from_proto
from gpuq.coordinator.workload.history_buckets import GpuHistory
from gpuq.coordinator.workload.idle_rules import Decision, IdleWatch
from gpuq.coordinator.workload.job_actions import JobActions
from gpuq.coordinator.workload.running_progress import RunningProgress
from gpuq.coordinator.workload.running_telemetry import RunningTelemetry
from gpuq.coordinator.workload.selection import Selection
from gpuq.domain.limits import clean_line
from gpuq.domain.model import Job
from gpuq.domain.states import JobState
from gpuq.store.api import StoreTx
from gpuq.v1 import agent_pb2 as apb

log = logging.getLogger(__name__)
MAX_OUTPUT_PATH_TEXT = 1000  # characters of an output file's path in a note


class JobSamples:
    def __init__(
        self,
        settings: CoordinatorSettings,
        jobs: LiveJobs,
        idle: IdleWatch,
        telemetry: RunningTelemetry,
        history: GpuHistory,
        progress: RunningProgress,
        actions: JobActions,
        changes: JobChanges,
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.jobs = jobs
        self.idle = idle
        self.telemetry = telemetry
        self.history = history
        self.progress = progress
        self.actions = actions
        self.changes = changes
        self.clock = clock
        self._background = Background("acting on a job's idle or hung flag")
        # output files noted as gone, by job: (its start, the path), each noted once
        self._gone: dict[int, set[tuple[int, str]]] = {}

    def heard(
        self, node: str, samples: Sequence[apb.JobSample], progress: Sequence[apb.JobProgress] = ()
    ) -> None:
        """A heartbeat's samples of the jobs running on `node`, and their progress."""
        self._idle_rules(node, samples)
        self.telemetry.running(node, samples)  # GPU telemetry so far
        self.history.heard(node, samples)  # each unit's history
        if progress:
            self.progress.heard(node, progress)

    def _idle_rules(self, node: str, samples: Sequence[apb.JobSample]) -> None:
        """Samples of jobs running here (and not being stopped) go to the idle and hung
        rules, and what they decide is acted on; others are ignored."""
        now = self.clock()
        for message in samples[:MAX_JOB_SAMPLES]:
            job = self.jobs.jobs.get(message.job_id)
            if job is None or job.state is not JobState.RUNNING or job.node != node:
                continue
            tier = self.settings.qos.get(job.qos)
            if tier is None or job.stop is not None:
                continue
            sample = sample_from_proto(message, job.gpus, now)
            decisions = self.idle.observe(sample, job.start_count, tier)
            if decisions:
                self._background.spawn(self._act_on(job, decisions))
        if self.idle.tracks:
            jobs = self.jobs.jobs
            self.idle.prune(lambda i: i in jobs and jobs[i].state is JobState.RUNNING)

    def outputs_gone(self, node: str, gone: Sequence[apb.OutputGone]) -> None:
        """Output files of jobs running on `node` that vanished while they ran: each is noted
        once in its job's events (the agent says so in every heartbeat while it is so)."""
        notes: list[Note] = []
        now = self.clock()
        for message in gone[:MAX_JOB_SAMPLES]:
            job = self.jobs.jobs.get(message.job_id)
            if job is None or job.state is not JobState.RUNNING or node not in job.node_names:
                continue
            if message.attempt and job.start_count and message.attempt != job.start_count:
                continue  # about an earlier start
            key = (job.start_count, clean_line(message.path, MAX_OUTPUT_PATH_TEXT))
            seen = self._gone.setdefault(job.id, set())
            if key in seen or len(seen) >= 2:  # stdout and stderr at most
                continue
            seen.add(key)
            text = output_gone_note(key[1], message.folder, message.replaced)
            log.warning("job %d on node %s: %s", job.id, node, text)
            notes.append(Note(job.id, now, text))
        jobs = self.jobs.jobs
        for job_id in [i for i in self._gone if i not in jobs or not jobs[i].state.is_live]:
            del self._gone[job_id]
        if notes:
            self._background.spawn(
                self._note(Effects(notes=notes), Cause.chore(f"report from node {node}"))
            )

    async def _note(self, noted: Effects, cause: Cause) -> None:
        await self.changes.commit(partial(_as_decided, noted), cause)

    async def _act_on(self, job: Job, decisions: Sequence[Decision]) -> None:
        """Log a flag set or cleared and note it in the job's events; cancel the job where its
        QOS says so (the normal cancel path, as the admin "gpuq")."""
        cause = Cause.chore("idle check")
        for d in decisions:
            if d.action == "cancel":
                log.warning("job %d: %s", job.id, d.text)
                await self.actions.cancel(Selection((str(job.id),)), SYSTEM, cause, d.text)
                continue
            note = d.text if d.action == "flag" else f"flag cleared: {d.text}"
            if d.action == "flag":
                log.warning("job %d of %s on node %s: %s", job.id, job.user, job.node, d.text)
            else:
                log.info("job %d: %s", job.id, note)
            noted = Effects(notes=[Note(job.id, self.clock(), note)])
            await self.changes.commit(partial(_as_decided, noted), cause)

    async def close(self) -> None:
        await self._background.cancel()


def output_gone_note(path: str, folder: bool, replaced: bool) -> str:
    """The job's event for an output file that vanished while it ran."""
    if folder:
        return f"output file {path} was removed while the job ran (its folder is gone)"
    if replaced:
        return f"output file {path} was removed while the job ran (another file is there now)"
    return f"output file {path} was removed while the job ran"


def _as_decided(effects: Effects, tx: StoreTx, now: float) -> tuple[Effects, None]:
    """Effects decided before the transaction (a note needs no reading)."""
    return effects, None
