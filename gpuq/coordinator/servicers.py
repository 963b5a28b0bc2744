"""Thin gRPC servicers: learn who calls, convert proto <-> domain, call the coordinator.

Who may do what (README "Security"): everyone sees every job in listings, but a job's script,
arguments and environment only its owner and admins; cancel, hold, release, requeue and
update: the owner or an admin (what an admin does to another's job is logged; an owner's update
may only lower what admins limit); drain, resume and tokens: admins.

Errors become status codes in one place (`_STATUS`), and the client turns them back into
the same exception types.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import grpc
from sqlalchemy.exc import InterfaceError, OperationalError

from gpuq.convert import event_to_proto, job_to_proto, spec_from_proto, spec_to_proto
from gpuq.coordinator.agents import AgentLink
from gpuq.coordinator.authority import Authority
from gpuq.coordinator.cluster import AgentSession, UnitState, drained_text, unit_states
from gpuq.coordinator.core import Coordinator, Outcome
from gpuq.coordinator.cron import CronService, next_fire
from gpuq.coordinator.edits import Filters, Update
from gpuq.coordinator.listing import list_filters
from gpuq.coordinator.passes import Passes, PendingDetail
from gpuq.coordinator.terminals import check_interactive_spec, relay
from gpuq.domain.dependencies import Dependency, DependencyKind
from gpuq.domain.limits import MAX_JOB_ID, check_reason, check_text
from gpuq.domain.model import CronEntry, Job, NodeState, output_paths
from gpuq.domain.states import JobState, parse_states
from gpuq.errors import (
    Conflict,
    DoubleBooking,
    GpuqError,
    IllegalTransition,
    InvalidInput,
    NotFound,
    PermissionDenied,
    StorageUnavailable,
    Unsatisfiable,
)
from gpuq.identity import METADATA_KEY, Caller, Unauthenticated
from gpuq.store.records import JobQuery
from gpuq.tls import peer_common_name
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import agent_pb2_grpc, queue_pb2, queue_pb2_grpc
from gpuq.v1 import types_pb2 as pb

log = logging.getLogger(__name__)
R = TypeVar("R")

_STATUS: dict[type[GpuqError], grpc.StatusCode] = {
    InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    Unsatisfiable: grpc.StatusCode.FAILED_PRECONDITION,
    NotFound: grpc.StatusCode.NOT_FOUND,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    IllegalTransition: grpc.StatusCode.FAILED_PRECONDITION,
    Conflict: grpc.StatusCode.ALREADY_EXISTS,
    DoubleBooking: grpc.StatusCode.INTERNAL,
    StorageUnavailable: grpc.StatusCode.UNAVAILABLE,
}
CONNECT_METHOD = "/gpuq.v1.AgentLink/Connect"
MAX_STREAMS_PER_USER = 128  # Submit and Watch streams one user may keep open at once
MAX_IDS = 10_000  # job ids in one request (cancel, hold, release, list, watch)
STORAGE_PREFIX = "storage unavailable: "  # how a client tells this UNAVAILABLE from no server


class StreamCount:
    """Open Submit and Watch streams per user: they last, and one user must not take every
    call the server allows (maximum_concurrent_rpcs) from the others."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: Counter[str] = Counter()

    @contextlib.contextmanager
    def opened(self, user: str) -> Iterator[str]:
        """'' while the stream may stay open; else why not (nothing is counted then)."""
        if self.open[user] >= self.limit:
            yield f"{user} has {self.limit} submit and watch streams open already (the most)"
            return
        self.open[user] += 1
        try:
            yield ""
        finally:
            self.open[user] -= 1
            if not self.open[user]:
                del self.open[user]


def status_for(error: GpuqError) -> grpc.StatusCode:
    for kind in type(error).__mro__:
        if kind in _STATUS:
            return _STATUS[kind]
    return grpc.StatusCode.UNKNOWN


class _Guard:
    """Who calls (the interceptor has let the call in already), and error mapping."""

    def __init__(self, authority: Authority) -> None:
        self.authority = authority

    async def caller(self, context: grpc.aio.ServicerContext, method: str = "") -> Caller:
        metadata = dict(context.invocation_metadata() or ())
        try:
            return self.authority.caller(method, metadata.get(METADATA_KEY))
        except Unauthenticated as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        except PermissionDenied as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        raise AssertionError("unreachable")  # abort raises

    async def fail(self, context: grpc.aio.ServicerContext, error: Exception) -> None:
        await context.abort(*error_status(error))


def error_status(error: Exception) -> tuple[grpc.StatusCode, str]:
    """The status and message an error ends an RPC (or one submission of a stream) with."""
    if isinstance(error, OperationalError | InterfaceError):  # the database, not the call
        log.error("the job store failed: %s", error)
        lines = str(getattr(error, "orig", None) or error).strip().splitlines()
        error = StorageUnavailable(f"the job store failed: {lines[0] if lines else error}")
    if isinstance(error, StorageUnavailable):
        return grpc.StatusCode.UNAVAILABLE, STORAGE_PREFIX + str(error)
    if isinstance(error, GpuqError):
        return status_for(error), str(error)
    log.exception("internal error in an RPC", exc_info=error)
    return grpc.StatusCode.INTERNAL, f"internal error: {error}"


def unary(
    method: Callable[[Any, Any, grpc.aio.ServicerContext, Caller], Awaitable[R]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]:
    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        caller = await self.guard.caller(context)
        try:
            return await method(self, request, context, caller)
        except Exception as error:
            await self.guard.fail(context, error)
            raise

    return wrapper


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


def job_message(job: Job, flags: Sequence[str] = ()) -> pb.Job:
    array: tuple[int, int | str] | None = None
    if job.array_job_id is not None:
        task = job.array_task_id
        array = (job.array_job_id, "%a" if task is None or job.tasks else task)
    stdout, stderr = output_paths(job.spec, job.id, job.user, job.node, array)
    message = job_to_proto(job, stdout, stderr)
    message.flags[:] = flags  # idle, possibly hung (gpuq.coordinator.idle)
    return message


class QueueServicer(queue_pb2_grpc.QueueServicer):  # type: ignore[misc]
    def __init__(
        self, coordinator: Coordinator, passes: Passes, cron: CronService, guard: _Guard
    ) -> None:
        self.co = coordinator
        self.passes = passes
        self.cron = cron
        self.guard = guard
        self.streams = StreamCount(MAX_STREAMS_PER_USER)
        # the web dashboard's sign-in links (gpuq.web.app.WebApp.login_link), when it is on
        self.web_login: Callable[[Caller, str | None], tuple[str, float]] | None = None

    @unary
    async def AddCron(self, request: queue_pb2.AddCronRequest, context: Any, caller: Caller) -> Any:
        self._may_submit(caller)
        entry = await self.cron.add(request.schedule, spec_from_proto(request.spec), caller.user)
        return cron_message(entry)

    @unary
    async def ListCron(
        self, request: queue_pb2.ListCronRequest, context: Any, caller: Caller
    ) -> Any:
        """A user's own entries (they carry scripts and environments); an admin's: all."""
        entries = [e for e in self.cron.list() if caller.admin or e.user == caller.user]
        return queue_pb2.ListCronReply(entries=[cron_message(e) for e in entries])

    @unary
    async def RemoveCron(
        self, request: queue_pb2.RemoveCronRequest, context: Any, caller: Caller
    ) -> Any:
        return cron_message(await self.cron.remove(request.id, caller.user, caller.admin))

    def _may_submit(self, caller: Caller) -> None:
        """Root's jobs would run as root: only where the admin allows it."""
        if (caller.uid == 0 or caller.user == "root") and not self.co.settings.allow_root_jobs:
            raise PermissionDenied(
                "root may not submit jobs here (they would run as root); submit as an ordinary "
                "user, or an admin sets [coordinator] allow_root_jobs = true"
            )

    def _shown(self, message: pb.Job, caller: Caller, owner: str) -> pb.Job:
        """What `caller` may see of another user's job: no script, arguments or environment
        (they hold secrets), and no name where the admin hides names."""
        if caller.admin or owner == caller.user:
            return message
        message.spec.ClearField("script")
        message.spec.ClearField("args")
        message.spec.ClearField("env")
        # a webhook URL or an address may carry a secret (a token in the URL)
        message.spec.ClearField("notify_url")
        message.spec.ClearField("mail_user")
        if self.co.settings.hide_job_names:
            message.spec.name = "(hidden)"
        return message

    def _with_pending(self, job: Job, explained: Job | None = None) -> pb.Job:
        """The job with why it waits (an array's record: why its first waiting task does)."""
        running = job.state is JobState.RUNNING
        message = job_message(job, self.co.idle.flags(job.id, job.start_count) if running else ())
        first = explained or job
        detail = self.passes.pending_detail(first) if first.state is JobState.PENDING else None
        if detail is not None:
            message.pending.CopyFrom(_pending_info(detail))
        return message

    async def Submit(
        self,
        requests: AsyncIterator[queue_pb2.SubmitRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[queue_pb2.SubmitResult]:
        """Submit, once per message; an error ends that submission, not the stream."""
        caller = await self.guard.caller(context)
        with self.streams.opened(caller.user) as refused:
            if refused:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
            async for request in requests:
                yield await self._submit_one(request, caller)

    async def _submit_one(
        self, request: queue_pb2.SubmitRequest, caller: Caller
    ) -> queue_pb2.SubmitResult:
        """The ids, or the error with the status code a call would have ended with."""
        try:
            self._may_submit(caller)
            key = request.request_key or None  # empty: no key
            spec = spec_from_proto(request.spec)
            check_interactive_spec(spec)
            ids = await self.co.submit(spec, caller.user, key)
        except Exception as error:
            code, message = error_status(error)
            return queue_pb2.SubmitResult(code=code.value[0], message=message)
        return queue_pb2.SubmitResult(job_ids=ids)

    @unary
    async def GetJob(self, request: queue_pb2.GetJobRequest, context: Any, caller: Caller) -> Any:
        task = request.task if request.HasField("task") else None
        if not 1 <= request.job_id <= MAX_JOB_ID:  # beyond any id (and any database integer)
            raise NotFound(f"no job {request.job_id}")
        job, events, counts = await self.co.get_job(request.job_id, task)
        message = self._with_pending(job, self.co.arrays.first_waiting(job))
        return queue_pb2.JobDetail(
            job=self._shown(message, caller, job.user),
            events=[event_to_proto(e) for e in events],
            array_states={state.value: n for state, n in counts.items()},
        )

    @unary
    async def ListJobs(
        self, request: queue_pb2.ListJobsRequest, context: Any, caller: Caller
    ) -> Any:
        check_count("job ids", len(request.job_ids))
        ids = [
            *request.job_ids,
            *([request.array_job_id] if request.HasField("array_job_id") else []),
        ]
        if any(not 1 <= i <= MAX_JOB_ID for i in ids):
            raise InvalidInput("job id", max(ids), f"job ids go from 1 to {MAX_JOB_ID}")
        filters = list_filters(request)
        if self.co.settings.hide_job_names and not caller.admin:
            filters = filters.hiding_names(caller.user)
        owner = request.user or None if filters.users is None else None  # else in users
        states = parse_states(request.states) if request.states else None
        if (
            request.finished
            or request.job_ids
            or request.HasField("array_job_id")
            or (
                states is not None
                and not states <= {JobState.PENDING, JobState.HELD, JobState.RUNNING}
            )
        ):
            query = JobQuery(
                states=states
                if states is not None
                else (
                    frozenset(s for s in JobState if not s.is_live) if request.finished else None
                ),
                user=owner,
                job_ids=tuple(request.job_ids) or None,
                array_job_id=request.array_job_id if request.HasField("array_job_id") else None,
                limit=request.limit or None,
                newest_first=request.finished,
                users=filters.users,
                names=filters.names,
                nodes=filters.nodes,
                since=filters.since,
                until=filters.until,
                by_end=request.finished,
            )
            jobs = await self.co.list_jobs(query)
        else:
            jobs = [
                j
                for j in self.co.live_jobs(owner)
                if (states is None or j.state in states) and filters.matches(j)
            ]
            if not request.expand_arrays:
                return queue_pb2.ListJobsReply(
                    jobs=[self._brief(j, caller, first) for j, first in collapse_arrays(jobs)][
                        : request.limit or None
                    ]
                )
            if request.limit:
                jobs = jobs[: request.limit]
        return queue_pb2.ListJobsReply(jobs=[self._brief(j, caller) for j in jobs])

    def _brief(self, job: Job, caller: Caller, explained: Job | None = None) -> pb.Job:
        """A listing leaves out the job's script, arguments, environment, webhook and mail
        address (anyone's: they are most of a job's size, and a queue of thousands must fit in a
        reply), and of the
        array's task list keeps the tasks the entry stands for (GetJob has them all).
        A collapsed array's entry waits for the reasons of its first waiting task."""
        message = self._with_pending(job, explained)
        # a webhook URL or a mail address may carry a secret too: GetJob has them for the owner
        for part in ("script", "args", "env", "notify_url", "mail_user"):
            message.spec.ClearField(part)
        if self.co.settings.hide_job_names and not caller.admin and job.user != caller.user:
            message.spec.name = "(hidden)"
        if job.array_job_id is not None:  # an entry carries the tasks it stands for
            message.spec.array.indices[:] = job.tasks or (job.array_task_id or 0,)
        return message

    async def _action(self, name: str, request: queue_pb2.JobSelection, caller: Caller) -> Any:
        check_count("job ids", len(request.job_ids))
        check_reason(request.reason)
        filters = selection_filters(request)
        action = getattr(self.co, name)
        if name == "cancel":
            outcomes = await action(
                list(request.job_ids),
                caller.user,
                request.reason,
                admin=caller.admin,
                filters=filters,
            )
        elif name == "requeue":
            outcomes = await action(
                list(request.job_ids),
                caller.user,
                admin=caller.admin,
                filters=filters,
                hold=request.hold,
            )
        else:
            outcomes = await action(
                list(request.job_ids), caller.user, admin=caller.admin, filters=filters
            )
        return action_reply(outcomes)

    @unary
    async def Update(self, request: queue_pb2.UpdateRequest, context: Any, caller: Caller) -> Any:
        check_count("job ids", len(request.job_ids))
        outcomes = await self.co.update(
            list(request.job_ids), update_from_proto(request), caller.user, admin=caller.admin
        )
        return action_reply(outcomes)

    @unary
    async def Requeue(self, request: queue_pb2.JobSelection, context: Any, caller: Caller) -> Any:
        return await self._action("requeue", request, caller)

    @unary
    async def Cancel(self, request: queue_pb2.JobSelection, context: Any, caller: Caller) -> Any:
        return await self._action("cancel", request, caller)

    @unary
    async def Hold(self, request: queue_pb2.JobSelection, context: Any, caller: Caller) -> Any:
        return await self._action("hold", request, caller)

    @unary
    async def Release(self, request: queue_pb2.JobSelection, context: Any, caller: Caller) -> Any:
        return await self._action("release", request, caller)

    async def Watch(
        self, request: queue_pb2.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[queue_pb2.JobEvents]:
        caller = await self.guard.caller(context)
        with self.streams.opened(caller.user) as refused:
            if refused:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
            try:
                check_count("job ids", len(request.job_ids))
                async for batch in self.co.watch(request.job_ids):
                    yield queue_pb2.JobEvents(events=[event_to_proto(e) for e in batch])
            except Exception as error:
                await self.guard.fail(context, error)

    async def Attach(
        self,
        requests: AsyncIterator[queue_pb2.AttachRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[queue_pb2.AttachReply]:
        """An interactive job's terminal (gpuq.coordinator.terminals): the owner's only."""
        caller = await self.guard.caller(context)
        with self.streams.opened(caller.user) as refused:
            if refused:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
            try:
                async for reply in relay(self.co.terminals, requests, caller.user, self._waits):
                    yield reply
            except Exception as error:
                await self.guard.fail(context, error)

    def _waits(self, job: Job) -> str:
        """Why a pending job waits, as one line (every reason)."""
        detail = self.passes.pending_detail(job)
        return "; ".join(detail.waiting.reasons) if detail is not None else ""

    @unary
    async def Drain(self, request: queue_pb2.DrainRequest, context: Any, caller: Caller) -> Any:
        self._admin_only(caller, "drain nodes")
        check_drain_request(request)
        units, message = await self.co.drain(request.node, request.gpu, request.reason, caller.user)
        return queue_pb2.DrainReply(units=units, message=message)

    @unary
    async def Resume(self, request: queue_pb2.DrainRequest, context: Any, caller: Caller) -> Any:
        self._admin_only(caller, "resume nodes")
        check_drain_request(request)
        units, message = await self.co.resume(request.node, request.gpu, caller.user)
        return queue_pb2.DrainReply(units=units, message=message)

    @unary
    async def ListNodes(
        self, request: queue_pb2.ListNodesRequest, context: Any, caller: Caller
    ) -> Any:
        cluster = self.co.cluster
        views = {v.name: v for v in cluster.node_views()}
        infos = []
        for name, entry in sorted(cluster.nodes.items()):
            node, view = entry.node, views[name]
            admin = cluster.drains.get((name, ""))
            drained = entry.drained_by_agent or (admin is not None and node.state is NodeState.UP)
            states = unit_states(entry, cluster.drains)
            infos.append(
                queue_pb2.NodeInfo(
                    name=name,
                    # "drained": up, running its jobs, but taking no new ones (an admin's
                    # drain, or its agent cannot start jobs)
                    state="drained" if drained else node.state.value,
                    cpus=node.cpus,
                    mem=node.mem,
                    gpus=[_unit(u) for u in node.units],
                    fake=node.fake,
                    last_seen=entry.last_seen,
                    reason=node.reason
                    or ("" if entry.session is not None else "agent not connected")
                    or (drained_text(admin) if admin is not None else "")
                    or (f"drained by its agent: {entry.drained}" if entry.drained else ""),
                    usage=list(entry.usage),
                    running_jobs=[j.id for j in self.co.cluster.running_on(name)],
                    cpus_used=node.cpus - view.cpus_free,
                    mem_used=node.mem - view.mem_free,
                    gpus_used=sorted({u.uuid for u in node.units} - view.free_units),
                    health=[_unit_health(u.uuid, states[u.uuid]) for u in node.units],
                    isolation=node.isolation,
                    driver=node.driver,
                    gpu_problem=node.gpu_problem,
                    drain_reason=admin.reason if admin is not None else "",
                    drained_by=admin.by if admin is not None else "",
                    drained_at=admin.at if admin is not None else None,
                    features=list(node.features),
                )
            )
        return queue_pb2.ListNodesReply(nodes=infos)

    def _admin_only(self, caller: Caller, what: str) -> None:
        if not caller.admin:
            raise PermissionDenied(
                f"only admins may {what} (members of the group "
                f"{self.co.settings.admin_group}, or root)"
            )

    @unary
    async def IssueToken(
        self, request: queue_pb2.TokenRequest, context: Any, caller: Caller
    ) -> Any:
        self._admin_only(caller, "issue tokens")
        token = await self.co.issue_token(request.user, caller.user)
        return queue_pb2.TokenReply(token=token)

    @unary
    async def RevokeTokens(
        self, request: queue_pb2.TokenRequest, context: Any, caller: Caller
    ) -> Any:
        self._admin_only(caller, "revoke tokens")
        count = await self.co.revoke_tokens(request.user, caller.user)
        return queue_pb2.TokenReply(revoked=count)

    @unary
    async def Report(self, request: queue_pb2.ReportRequest, context: Any, caller: Caller) -> Any:
        """Usage per user (gpuq report): anyone may see anyone's, as sreport shows by default,
        since listings already show every job's times, GPUs and telemetry."""
        check_text("user", request.user, 64)
        since = request.since if request.HasField("since") else None
        if since is not None and not math.isfinite(since):
            raise InvalidInput("--since", str(since), "expected a time")
        user = request.user or None
        rows = await self.co.writer.read(lambda s: s.usage_report(user, since))
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
            ]
        )

    @unary
    async def WebLogin(
        self, request: queue_pb2.WebLoginRequest, context: Any, caller: Caller
    ) -> Any:
        """A one-time link that signs the caller in to the dashboard (gpuq web)."""
        if self.web_login is None:
            raise Unsatisfiable(
                "the web dashboard is off on this coordinator (an admin sets "
                "[coordinator] web_listen)"
            )
        metadata = dict(context.invocation_metadata() or ()) if context is not None else {}
        url, expires = self.web_login(caller, metadata.get(METADATA_KEY))
        return queue_pb2.WebLoginReply(url=url, expires=expires)


def _unit_health(uuid: str, state: UnitState) -> queue_pb2.UnitHealth:
    drain = state.drain
    return queue_pb2.UnitHealth(
        uuid=uuid,
        health=state.health.value,
        reason=state.reason,
        drained_by=drain.by if drain is not None else "",
        drained_at=drain.at if drain is not None else None,
    )


MAX_NODE_NAME = 128  # as the store keeps node names


def check_drain_request(request: queue_pb2.DrainRequest) -> None:
    """Bounded at the edge: a node name, a GPU index or UUID, a reason."""
    if not request.node:
        raise InvalidInput("node", "", "name a node, e.g. gpuq drain NODE[:GPU] --reason TEXT")
    check_text("node", request.node, MAX_NODE_NAME)
    check_text("GPU", request.gpu, 96)
    check_reason(request.reason)


def action_reply(outcomes: Sequence[Outcome]) -> queue_pb2.ActionReply:
    return queue_pb2.ActionReply(
        outcomes=[
            queue_pb2.ActionOutcome(job_id=o.job_id, done=o.done, message=o.message)
            for o in outcomes
        ]
    )


def selection_filters(request: queue_pb2.JobSelection) -> Filters | None:
    """The bulk filters of a selection (None: ids only); ids or a filter are required."""
    check_text("user", request.user, 64)
    check_text("--name", request.name, 128)
    check_count("states", len(request.states))
    filters = Filters(
        user=request.user or None,
        states=parse_states(request.states) if request.states else None,
        name=request.name or None,
    )
    if not request.job_ids and not filters:
        raise InvalidInput(
            "job ids", "none", "name jobs, or select them with a user, states or a name pattern"
        )
    return filters or None


def update_from_proto(request: queue_pb2.UpdateRequest) -> Update:
    """The wire's update as the domain's (each value is checked when the new spec is built)."""

    def given(field: str) -> Any:
        return getattr(request, field) if request.HasField(field) else None

    return Update(
        time_limit=given("time_limit"),
        qos=given("qos"),
        nice=given("nice"),
        set_dependencies=request.set_dependencies,
        dependencies=tuple(
            Dependency(d.job_id, _kind(d.kind), d.task if d.HasField("task") else None)
            for d in request.dependencies
        ),
        hold=given("hold"),
        name=given("name"),
        set_begin_time=request.set_begin_time,
        begin_time=given("begin_time"),
        gpus=given("gpus"),
        gpu_type=given("gpu_type"),
        cpus=given("cpus"),
        mem=given("mem"),
        gpu_mem=given("gpu_mem"),
        set_nodelist=request.set_nodelist,
        nodelist=tuple(request.nodelist),
        set_exclude=request.set_exclude,
        exclude=tuple(request.exclude),
        constraint=given("constraint"),
    )


def _kind(text: str) -> DependencyKind:
    try:
        return DependencyKind(text or "ok")
    except ValueError:
        raise InvalidInput("--after", text, "expected ok, any or notok") from None


def check_count(what: str, count: int) -> None:
    """One request names at most MAX_IDS jobs (a store query or a loop per id otherwise
    grows without bound)."""
    if count > MAX_IDS:
        raise InvalidInput(what, count, f"at most {MAX_IDS} in one request")


def _pending_info(detail: PendingDetail) -> pb.PendingInfo:
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


def _unit(unit: Any) -> pb.GpuUnit:
    from gpuq.convert import unit_to_proto

    return unit_to_proto(unit)


class AgentLinkServicer(agent_pb2_grpc.AgentLinkServicer):  # type: ignore[misc]
    def __init__(self, link: AgentLink, guard: _Guard) -> None:
        self.link = link
        self.guard = guard

    async def Connect(
        self, request_iterator: AsyncIterator[apb.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[apb.CoordinatorMessage]:
        caller = await self.guard.caller(context, CONNECT_METHOD)
        first = await anext(aiter(request_iterator), None)
        if first is None or not first.HasField("register"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first message must register")
            return
        node = first.register.node
        certified = peer_common_name(context)  # agent_listen: mutual TLS names the node
        if node != caller.node or certified not in (None, node):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"this agent's credentials are node {certified or caller.node}'s; it may not "
                "register as another node",
            )
            return
        session = AgentSession(node)
        try:
            await self.link.register(first.register, session)
        except BaseException as error:
            self.link.disconnected(node, session)  # never leave this session installed
            if isinstance(error, GpuqError):
                await self.guard.fail(context, error)
                return
            raise
        reader = asyncio.create_task(self._read(node, request_iterator, session))
        try:
            while (message := await session.next_message()) is not None:
                yield message
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            self.link.disconnected(node, session)

    async def _read(
        self, node: str, messages: AsyncIterator[apb.AgentMessage], session: AgentSession
    ) -> None:
        try:
            async for message in messages:
                # the heartbeat first: when a job ends, one message can carry its end and the
                # heartbeat that marks its units dirty; applied in this order, the pass that
                # the end wakes never gives a dirty unit out
                if message.HasField("heartbeat"):
                    self.link.heartbeat(node, message.heartbeat)
                if message.pty:  # before the reports: a job's output comes before its end
                    self.link.pty(node, message.pty)
                if message.reports:
                    self.link.reports(node, message.reports)
        except grpc.aio.AioRpcError:
            pass
        finally:
            session.close()
