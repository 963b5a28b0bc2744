"""The front door's read side: what callers may ask (a job, listings, nodes, usage, cron
entries), answered as the wire's messages. The gRPC servicer and the web dashboard both call
these with the caller already resolved, so the dashboard shows exactly what `gpuq` would show
that user.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any

from gpuq.config.settings import CoordinatorSettings
from gpuq.convert import event_to_proto
from gpuq.coordinator.access.permissions import sees
from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.changes.watchers import Watchers
from gpuq.coordinator.cron_service import CronService
from gpuq.coordinator.front.cluster_history import ClusterHistory, ClusterView
from gpuq.coordinator.front.job_diagnosis import JobDiagnoses
from gpuq.coordinator.front.job_messages import (
    JobMessages,
    cron_message,
    unit_health,
    unit_message,
)
from gpuq.coordinator.front.job_pages import JobPages, Wanted
from gpuq.coordinator.front.listing_filters import ListFilters, list_filters
from gpuq.coordinator.front.ranked_queue import QueueFilter, ranked
from gpuq.coordinator.front.sizing_queries import SizingQueries
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.node_table import NodeTable, drained_text, unit_states
from gpuq.coordinator.memory.scheduler_inputs import SchedulerInputs
from gpuq.coordinator.workload.array_tasks import ArrayTasks
from gpuq.coordinator.workload.running_telemetry import RunningTelemetry
from gpuq.domain.limits import MAX_JOB_ID, check_text
from gpuq.domain.model import Job, JobEvent, NodeState, SeriesPoint
from gpuq.domain.partitions import default_in, node_partitions
from gpuq.domain.states import JobState, parse_states
from gpuq.errors import InvalidInput, NotFound
from gpuq.identity import Caller
from gpuq.store.records import JobQuery
from gpuq.v1 import queue_pb2

MAX_IDS = 10_000  # job ids in one request (cancel, hold, release, list, watch)
LIVE_ORDER = (JobState.RUNNING, JobState.PENDING, JobState.HELD)
LIVE = frozenset(LIVE_ORDER)


class QueueQueries:
    def __init__(
        self,
        settings: CoordinatorSettings,
        writer: StoreWriter,
        jobs: LiveJobs,
        nodes: NodeTable,
        arrays: ArrayTasks,
        telemetry: RunningTelemetry,
        watchers: Watchers,
        cron: CronService,
        messages: JobMessages,
        inputs: SchedulerInputs,
        history: ClusterHistory,
        diagnoses: JobDiagnoses,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.writer = writer
        self.jobs = jobs
        self.nodes = nodes
        self.arrays = arrays
        self.telemetry = telemetry
        self.watchers = watchers
        self.cron = cron
        self.messages = messages
        self.inputs = inputs
        self.history = history
        self.diagnoses = diagnoses
        self.pages = JobPages(settings.list_page_size, jobs, writer, messages)
        self.sizing = SizingQueries(
            settings, writer, nodes, inputs, messages, self.job_detail, clock
        )

    async def get_job(
        self, caller: Caller, request: queue_pb2.GetJobRequest
    ) -> queue_pb2.JobDetail:
        task = request.task if request.HasField("task") else None
        if not 1 <= request.job_id <= MAX_JOB_ID:  # beyond any id (and any database integer)
            raise NotFound(f"no job {request.job_id}")
        job, events, counts = await self.job_detail(request.job_id, task)
        detail = queue_pb2.JobDetail(
            job=self.messages.full(job, caller, self.arrays.first_waiting(job)),
            events=self.messages.events(job, events, caller),
            array_states={state.value: n for state, n in counts.items()},
        )
        if request.diagnose:
            seen = [self.messages.event(e, job.user, caller) for e in events]
            detail.diagnosis.CopyFrom(await self.diagnoses.diagnosis(job, seen, caller))
        return detail

    async def job_detail(
        self, job_id: int, task: int | None = None
    ) -> tuple[Job, list[JobEvent], dict[JobState, int]]:
        """A job (or task `task` of array `job_id`), its history and, for an array's id (or a
        task still in its record), how many of the array's tasks are in each state."""
        if task is not None:
            job_id = (await self.arrays.find_task(job_id, task)).id
        job, events = await self.writer.read(lambda s: (s.get_job(job_id), s.events(job_id)))
        if job.state is JobState.RUNNING:  # the figures of its latest heartbeat, not yet stored
            latest = self.telemetry.latest(job.id, job.start_count)
            if latest is not None:
                job = replace(job, telemetry=latest)
        counts: dict[JobState, int] = {}
        if job.array_job_id == job.id:
            array = job.id
            counts = (await self.writer.read(lambda s: s.array_states([array]))).get(array, {})
        return job, events, counts

    async def list_jobs(self, caller: Caller, request: queue_pb2.ListJobsRequest) -> bytes:
        """A page of a listing (gpuq.coordinator.front.job_pages), a ListJobsReply as the
        wire carries it: live jobs from memory (no database round trip); ended jobs, ids and
        arrays from the store. Everyone sees every job, less what is private
        (JobMessages.listed). A page kept as it would be built now is answered first: its
        request passed the same checks when it was built."""
        kept = self.pages.kept(caller, request)
        if kept is not None:
            return kept
        return await self.pages.page(caller, request, self._wanted(caller, request))

    async def list_jobs_json(
        self, caller: Caller, request: queue_pb2.ListJobsRequest
    ) -> tuple[list[str], str]:
        """The same page as the dashboard's JSON: each entry's text, and the next token."""
        return await self.pages.page_json(caller, request, self._wanted(caller, request))

    def _wanted(self, caller: Caller, request: queue_pb2.ListJobsRequest) -> Wanted:
        """Which jobs a listing wants, checked: live ones (a test of each; None: all), or the
        store's query."""
        check_count("job ids", len(request.job_ids))
        ids = [
            *request.job_ids,
            *([request.array_job_id] if request.HasField("array_job_id") else []),
        ]
        if any(not 1 <= i <= MAX_JOB_ID for i in ids):
            raise InvalidInput("job id", max(ids), f"job ids go from 1 to {MAX_JOB_ID}")
        filters = list_filters(request)
        if "names" in self.settings.private_data and not caller.admin:
            filters = filters.hiding_names(caller.user)
        owner = request.user or None if filters.users is None else None  # else in users
        states = parse_states(request.states) if request.states else None
        if (
            request.finished
            or request.job_ids
            or request.HasField("array_job_id")
            or (states is not None and not states <= LIVE)
        ):
            ended = frozenset(s for s in JobState if not s.is_live) if request.finished else None
            query = JobQuery(
                states=states if states is not None else ended,
                user=owner,
                job_ids=tuple(request.job_ids) or None,
                array_job_id=request.array_job_id if request.HasField("array_job_id") else None,
                newest_first=request.finished,
                users=filters.users,
                names=filters.names,
                nodes=filters.nodes,
                since=filters.since,
                until=filters.until,
                by_end=request.finished,
            )
            return query

        if owner is None and states is None and filters == ListFilters():
            return None  # every live job: nothing to test

        def wanted(job: Job) -> bool:
            return (
                (owner is None or job.user == owner)
                and (states is None or job.state in states)
                and filters.matches(job)
            )

        return wanted

    def live_jobs(self, user: str | None = None) -> list[Job]:
        """From memory: what `gpuq queue` shows, without a database round trip."""
        jobs = sorted(self.jobs.jobs.values(), key=lambda j: j.id)
        return [j for j in jobs if user is None or j.user == user]

    def list_nodes(self) -> queue_pb2.ListNodesReply:
        views = {v.name: v for v in self.nodes.views(self.jobs.in_state(JobState.RUNNING))}
        infos = []
        for name, entry in sorted(self.nodes.nodes.items()):
            node, view = entry.node, views[name]
            admin = self.nodes.drains.get((name, ""))
            drained = entry.drained_by_agent or (admin is not None and node.state is NodeState.UP)
            states = unit_states(entry, self.nodes.drains)
            infos.append(
                queue_pb2.NodeInfo(
                    name=name,
                    # "drained": up, running its jobs, but taking no new ones (an admin's
                    # drain, or its agent cannot start jobs)
                    state="drained" if drained else node.state.value,
                    cpus=node.cpus,
                    mem=node.mem,
                    gpus=[unit_message(u) for u in node.units],
                    fake=node.fake,
                    last_seen=entry.last_seen,
                    reason=node.reason
                    or ("" if entry.session is not None else "agent not connected")
                    or (drained_text(admin) if admin is not None else "")
                    or (f"drained by its agent: {entry.drained}" if entry.drained else ""),
                    usage=list(entry.usage),
                    running_jobs=[j.id for j in self.jobs.running_on(name)],
                    cpus_used=node.cpus - view.cpus_free,
                    mem_used=node.mem - view.mem_free,
                    gpus_used=sorted({u.uuid for u in node.units} - view.free_units),
                    health=[unit_health(u.uuid, states[u.uuid]) for u in node.units],
                    isolation=node.isolation,
                    driver=node.driver,
                    gpu_problem=node.gpu_problem,
                    drain_reason=admin.reason if admin is not None else "",
                    drained_by=admin.by if admin is not None else "",
                    drained_at=admin.at if admin is not None else None,
                    features=list(node.features),
                    partitions=node_partitions(self.nodes.partitions, name),
                    default_partition=default_in(self.nodes.partitions, name),
                )
            )
        return queue_pb2.ListNodesReply(nodes=infos)

    async def report(
        self, caller: Caller, request: queue_pb2.ReportRequest
    ) -> queue_pb2.ReportReply:
        """Usage per user (gpuq report): anyone may see anyone's, as sreport shows by default,
        since listings already show every job's times, GPUs and telemetry; where private_data
        holds "usage", others' rows only admins (permissions.sees). With `job_id`: that job's
        efficiency alone (gpuq eff); with `advice`: right-sizing too (SizingQueries)."""
        check_text("user", request.user, 64)
        since = request.since if request.HasField("since") else None
        if since is not None and not math.isfinite(since):
            raise InvalidInput("--since", str(since), "expected a time")
        if request.job_id:
            if request.job_id > MAX_JOB_ID:
                raise NotFound(f"no job {request.job_id}")
            efficiency = await self.sizing.efficiency(caller, request.job_id)
            return queue_pb2.ReportReply(efficiency=efficiency)
        user = request.user or None
        advice: tuple[list[queue_pb2.SizingAdvice], list[queue_pb2.IdleHolder]] = ([], [])
        if request.advice:
            advice = await self.sizing.advice(caller, user or caller.user, since)
        rows = await self.writer.read(lambda s: s.usage_report(user, since))
        return queue_pb2.ReportReply(
            rows=[
                queue_pb2.ReportRow(
                    user=r.user,
                    jobs=r.jobs,
                    gpu_seconds=r.gpu_seconds,
                    energy=r.energy,
                    util_mean=r.util_mean,
                    util_gpu_seconds=r.util_gpu_seconds,
                )
                for r in rows
                if sees(caller, r.user, "usage", self.settings.private_data)
            ],
            advice=advice[0],
            idle=advice[1],
        )

    def list_cron(self, caller: Caller) -> queue_pb2.ListCronReply:
        """A user's own entries (they carry scripts and environments); an admin's: all."""
        entries = [e for e in self.cron.list() if caller.admin or e.user == caller.user]
        return queue_pb2.ListCronReply(entries=[cron_message(e) for e in entries])

    # ---- what only the dashboard asks ----------------------------------------------------

    async def series(self, job_id: int) -> list[SeriesPoint]:
        """A job's telemetry over time: what is stored, then what is not stored yet."""
        stored = await self.writer.read(lambda s: s.series(job_id))
        last = stored[-1].at if stored else float("-inf")
        return [*stored, *(p for p in self.telemetry.recent(job_id) if p.at > last)]

    async def cluster_history(self, caller: Caller, range_name: str) -> ClusterView:
        """Each GPU's history and each user's GPU time over the last `range_name` ("6h",
        "24h", "7d"), less what `caller` may not see (gpuq.coordinator.front.cluster_history)."""
        return await self.history.view(caller, range_name)

    async def ranked_queue_json(
        self, caller: Caller, wanted: QueueFilter, limit: int
    ) -> tuple[list[str], bool]:
        """Live jobs in the order the scheduler ranks them (gpuq.coordinator.front.ranked_queue),
        as the dashboard's JSON texts, and whether more than `limit` match."""
        found, more = await ranked(
            self.jobs, wanted.for_caller(caller, self.settings.private_data), limit
        )
        return await self.pages.entries_json(caller, [(job, None) for job in found]), more

    def sees_usage(self, caller: Caller, user: str) -> bool:
        """May `caller` see `user`'s usage (private_data "usage": only the user and admins)."""
        return sees(caller, user, "usage", self.settings.private_data)

    def fair_share(self, user: str, now: float) -> tuple[float, float]:
        """The user's fair-share usage at `now` (GPU-seconds, decayed) and factor."""
        inputs = self.inputs
        return inputs.current_usage(now).get(user, 0.0), inputs.shares.get(user, 1.0)

    def job_counts(self) -> dict[str, int]:
        """Live jobs in each state, each array task not yet split off counted: kept as jobs
        change (LiveJobs.tally), so it costs the same for 10 jobs or 200,000."""
        counts = dict.fromkeys((s.value for s in LIVE_ORDER), 0)
        for (state, _), count in self.jobs.tally.items():
            counts[state.value] += count
        return counts

    def running_gpus(self, user: str) -> int:
        running = self.jobs.in_state(JobState.RUNNING)  # not every live job: a page's cost
        return sum(len(j.gpus) for j in running if j.user == user)

    def nodes_state(self) -> tuple[Any, ...]:
        """What `gpuq nodes` shows that heartbeats change (not when each was seen), to compare
        by value: a heartbeat replaces a node's usage messages, never changes them."""
        nodes = [
            (
                name,
                entry.node.state,
                entry.session is None,
                entry.drained,
                entry.usage,
                len(self.jobs.running_on(name)),
            )
            for name, entry in sorted(self.nodes.nodes.items())
        ]
        return (*nodes, len(self.nodes.drains))

    async def watch(
        self, caller: Caller, job_ids: Sequence[int]
    ) -> AsyncIterator[queue_pb2.JobEvents]:
        """Events as they commit (gpuq.coordinator.changes.watchers), as the wire has them and
        as `caller` may see them."""
        check_count("job ids", len(job_ids))
        async for batch in self.job_events(caller, job_ids):
            yield queue_pb2.JobEvents(events=[event_to_proto(e) for e in batch])

    def job_events(
        self, caller: Caller, job_ids: Sequence[int] = ()
    ) -> AsyncIterator[list[JobEvent]]:
        """Events as they commit, in batches, as `caller` may see them (no job: every job's)."""

        def view(event: JobEvent, owner: str) -> JobEvent:
            return self.messages.event(event, owner, caller)

        return self.watchers.watch(job_ids, view)


def check_count(what: str, count: int) -> None:
    """One request names at most MAX_IDS jobs (a store query or a loop per id otherwise
    grows without bound)."""
    if count > MAX_IDS:
        raise InvalidInput(what, count, f"at most {MAX_IDS} in one request")
