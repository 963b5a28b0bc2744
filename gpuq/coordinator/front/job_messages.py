"""Jobs as callers see them on the wire: what a caller may see of another user's job (no
script, arguments, environment, webhook or mail address, no progress; no name where the admin
hides names), what a listing carries (nothing private, for anyone, but a running job's progress
for its owner and admins), why a pending job waits, and an array's waiting tasks collapsed into
one entry as squeue shows them.

A running job's progress (gpuq.coordinator.workload.running_progress) is read from its output,
which only its owner and admins may read (permissions.check_reads_log): so is its progress,
and the flag that says its throughput collapsed.

Where the admin hides job names (`[coordinator] private_data` holds "names"), a caller who is
neither the owner nor an admin sees `(hidden)` wherever another user's job name would show: the
spec's name, `%x` in its output paths, its pending reasons ("named X"), and its events' reasons
(an update's "name X -> Y"), in GetJob, listings, Watch streams and the dashboard's feed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from gpuq.convert import event_to_proto, job_to_proto, spec_to_proto, unit_to_proto
from gpuq.coordinator.access.permissions import hides_name, is_owner_or_admin
from gpuq.coordinator.cron_service import next_fire
from gpuq.coordinator.memory.node_table import UnitState
from gpuq.coordinator.scheduling.scheduling_pass import PendingDetail
from gpuq.domain.limits import NAME_IN_TEXT
from gpuq.domain.model import CronEntry, GpuUnit, Job, JobEvent, output_paths
from gpuq.domain.states import JobState
from gpuq.identity import Caller
from gpuq.scheduler.snapshot import Waiting
from gpuq.v1 import queue_pb2
from gpuq.v1 import types_pb2 as pb

# the parts of a job's spec only its owner and admins see: they hold secrets (a token in a
# webhook's URL, an environment's keys)
PRIVATE = ("script", "args", "env", "notify_url", "mail_user")
HIDDEN = "(hidden)"  # a job name shown to a caller from whom names are hidden
_NAME = NAME_IN_TEXT  # a job name as reasons write it (gpuq.domain.limits.name_in_text)
_NAMED = re.compile(rf"\b(?:name {_NAME} -> {_NAME}|named {_NAME})")


def hide_names(text: str) -> str:
    """A reason with the job names it names hidden: an update's "name X -> Y", a singleton's
    "job 4 named X is running"."""
    return _NAMED.sub(
        lambda m: "named " + HIDDEN if m[0].startswith("named ") else f"name {HIDDEN} -> {HIDDEN}",
        text,
    )


class JobMessages:
    def __init__(
        self,
        private_data: tuple[str, ...],
        flags: Callable[[int, int], tuple[str, ...]],
        pending_detail: Callable[[Job], PendingDetail | None],
        explanation: Callable[[], Mapping[int, Waiting]] = dict,
        progress: Callable[[int, int], pb.JobThroughput | None] = lambda job_id, start: None,
    ) -> None:
        self.private_data = private_data  # what others' jobs hide (permissions.sees)
        self.flags = flags  # a running job's idle and hung flags (job id, its start)
        self.pending_detail = pending_detail
        # why each queued job waits now (SchedulingPass.explained: a new object each time
        # it is made anew): a job's "why it waits" built from the same Waiting, at the same
        # priority, is the same
        self.explanation = explanation
        self.progress = progress  # a running job's progress (job id, its start), not to change

    def full(self, job: Job, caller: Caller, explained: Job | None = None) -> pb.Job:
        """GetJob's: everything `caller` may see of the job."""
        hidden = hides_name(caller, job.user, self.private_data)
        message = self.with_pending(job, explained, hidden)
        if is_owner_or_admin(caller, job.user):
            shown = self.progress_of(job, caller)
            if shown is not None:
                message.MergeFrom(progress_part(shown))
            return message
        for part in PRIVATE:
            message.spec.ClearField(part)
        return message

    def listed(self, job: Job, hidden: bool) -> pb.Job:
        """A listing's entry, but why it waits (`pending`: it changes without the job
        changing, so gpuq.coordinator.front.job_pages keeps the rest and adds it): no script,
        arguments, environment, webhook or mail address (anyone's: they are most of a job's
        size), and of the array's task list the tasks the entry stands for (GetJob has them
        all)."""
        message = self.bare(job, hidden)
        for part in PRIVATE:
            message.spec.ClearField(part)
        if job.array_job_id is not None:  # an entry carries the tasks it stands for
            message.spec.array.indices[:] = job.tasks or (job.array_task_id or 0,)
        return message

    def progress_of(self, job: Job, caller: Caller) -> pb.JobThroughput | None:
        """What a running job's output says of its progress, for those who may read its
        output (None for others, and when nothing is known): the coordinator's own message,
        to copy (progress_part), never to change."""
        if job.state is not JobState.RUNNING or not is_owner_or_admin(caller, job.user):
            return None
        return self.progress(job.id, job.start_count)

    def with_pending(self, job: Job, explained: Job | None = None, hidden: bool = False) -> pb.Job:
        """The job with why it waits (an array's record: why its first waiting task does);
        `hidden`: with its name hidden (its spec's, `%x` in its paths, its reasons')."""
        message = self.bare(job, hidden)
        pending = self.pending(job, explained, hidden)
        if pending is not None:
            message.pending.CopyFrom(pending)
        return message

    def bare(self, job: Job, hidden: bool) -> pb.Job:
        """The job on the wire with its flags, its name hidden if `hidden`; no reasons."""
        running = job.state is JobState.RUNNING
        flags = self.flags(job.id, job.start_count) if running else ()
        message = job_message(job, flags, HIDDEN if hidden else None)
        if hidden:
            message.spec.name = HIDDEN
        return message

    def pending(
        self, job: Job, explained: Job | None = None, hidden: bool = False
    ) -> pb.PendingInfo | None:
        """Why the job (or `explained`, an array's first waiting task) waits, if pending."""
        first = explained or job
        detail = self.pending_detail(first) if first.state is JobState.PENDING else None
        if detail is None:
            return None
        info = pending_info(detail)
        if hidden:
            info.reasons[:] = [hide_names(r) for r in info.reasons]
        return info

    def event(self, event: JobEvent, owner: str, caller: Caller) -> JobEvent:
        """An event of a job of `owner` as `caller` may see it (its reason's names hidden)."""
        if hides_name(caller, owner, self.private_data):
            return replace(event, reason=hide_names(event.reason))
        return event

    def events(self, job: Job, events: Sequence[JobEvent], caller: Caller) -> list[pb.JobEvent]:
        """A job's history as `caller` may see it."""
        return [event_to_proto(self.event(e, job.user, caller)) for e in events]

    def waits(self, job: Job) -> str:
        """Why a pending job waits, as one line (every reason)."""
        detail = self.pending_detail(job)
        return "; ".join(detail.waiting.reasons) if detail is not None else ""


def job_message(job: Job, flags: Sequence[str] = (), name: str | None = None) -> pb.Job:
    """The job on the wire; `name`: what `%x` in its output paths shows instead of its name."""
    array: tuple[int, int | str] | None = None
    if job.array_job_id is not None:
        task = job.array_task_id
        array = (job.array_job_id, "%a" if task is None or job.tasks else task)
    stdout, stderr = output_paths(job.spec, job.id, job.user, job.node, array, name)
    message = job_to_proto(job, stdout, stderr)
    message.flags[:] = flags  # idle, possibly hung (gpuq.coordinator.workload.idle_rules)
    return message


def progress_part(shown: pb.JobThroughput) -> pb.Job:
    """A Job message holding only a running job's progress, and the line that says its
    throughput collapsed in its flags: merged into the job's message after its other flags."""
    return pb.Job(progress=shown, flags=[shown.collapse] if shown.collapse else [])


def pending_info(detail: PendingDetail) -> pb.PendingInfo:
    return pb.PendingInfo(
        reasons=list(detail.waiting.reasons),
        estimated_start=detail.waiting.estimated_start,
        priority=detail.priority,
        factors=[pb.PriorityFactor(name=n, value=v) for n, v in detail.factors.as_pairs()],
    )


def collapse_arrays(jobs: list[Job]) -> list[tuple[Job, Job | None]]:
    """An array's waiting tasks (pending, or held) as one entry, as squeue shows them:
    `40_[3-99%8]`, with the first of them, whose reasons the entry shows. Each entry takes
    the place of the array's first waiting task; other jobs are listed as they are."""
    groups: dict[tuple[int, JobState], list[Job]] = {}
    for job in jobs:
        if job.array_job_id is not None and job.state in (JobState.PENDING, JobState.HELD):
            groups.setdefault((job.array_job_id, job.state), []).append(job)
    entries: list[tuple[Job, Job | None]] = []
    for job in jobs:
        group = groups.get((job.array_job_id or 0, job.state)) if job.array_job_id else None
        if group is None or (len(group) == 1 and not job.tasks):
            entries.append((job, None))
        elif group[0] is job:
            tasks = sorted(t for j in group for t in (j.tasks or (j.array_task_id or 0,)))
            record = next((j for j in group if j.id == job.array_job_id), job)
            waiting = [j for j in group if not j.tasks]
            first = min(waiting, key=lambda j: j.array_task_id or 0) if waiting else None
            entries.append((replace(record, tasks=tuple(tasks), array_task_id=None), first))
    return entries


def cron_message(entry: CronEntry) -> queue_pb2.CronEntry:
    return queue_pb2.CronEntry(
        id=entry.id,
        user=entry.user,
        schedule=entry.schedule,
        spec=spec_to_proto(entry.spec),
        created_at=entry.created_at,
        last_fire=entry.last_fire,
        next_fire=next_fire(entry.schedule, entry.last_fire or entry.created_at),
    )


def unit_message(unit: GpuUnit) -> pb.GpuUnit:
    return unit_to_proto(unit)


def unit_health(uuid: str, state: UnitState) -> queue_pb2.UnitHealth:
    drain = state.drain
    return queue_pb2.UnitHealth(
        uuid=uuid,
        health=state.health.value,
        reason=state.reason,
        drained_by=drain.by if drain is not None else "",
        drained_at=drain.at if drain is not None else None,
    )
