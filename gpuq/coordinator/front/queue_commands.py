"""The front door's write side: what callers may ask to change (submissions, actions on jobs,
drains, tokens, cron entries), from the wire's messages, with the caller's rights checked
(gpuq.coordinator.access.permissions) before anything changes. The gRPC servicer and the web
dashboard both call these with the caller already resolved; each change's cause names the
request and who made it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpuq.config.settings import CoordinatorSettings
from gpuq.convert import spec_from_proto
from gpuq.coordinator.access.permissions import (
    check_acts_on,
    check_admin,
    check_may_submit,
    check_sets_nice,
)
from gpuq.coordinator.access.user_tokens import UserTokens
from gpuq.coordinator.changes.effects import Cause
from gpuq.coordinator.changes.transitions import Ending
from gpuq.coordinator.cron_service import CronService
from gpuq.coordinator.front.job_messages import cron_message
from gpuq.coordinator.front.queue_queries import check_count
from gpuq.coordinator.front.rpc_calls import error_status
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.nodes.node_admin import NodeAdmin
from gpuq.coordinator.terminal_relay import check_interactive_spec
from gpuq.coordinator.workload.job_actions import JobActions, Outcome
from gpuq.coordinator.workload.job_endings import JobEndings
from gpuq.coordinator.workload.selection import Filters, Selection
from gpuq.coordinator.workload.submissions import Submissions
from gpuq.coordinator.workload.update_rules import Update
from gpuq.domain.dependencies import Dependency, DependencyKind
from gpuq.domain.limits import check_reason, check_text
from gpuq.domain.states import JobState, parse_states
from gpuq.errors import InvalidInput, Unsatisfiable
from gpuq.identity import Caller
from gpuq.v1 import queue_pb2

MAX_NODE_NAME = 128  # as the store keeps node names


def request_cause(verb: str, caller: Caller) -> Cause:
    """`Cancel by alice`, or `Cancel by alice via web` for the dashboard's."""
    return Cause.request(verb, caller.user, "web" if caller.how.startswith("web") else "")


class QueueCommands:
    def __init__(
        self,
        settings: CoordinatorSettings,
        submissions: Submissions,
        actions: JobActions,
        node_admin: NodeAdmin,
        tokens: UserTokens,
        cron: CronService,
        jobs: LiveJobs,
        endings: JobEndings,
    ) -> None:
        self.settings = settings
        self.jobs = jobs
        self.endings = endings
        self.submissions = submissions
        self.actions = actions
        self.node_admin = node_admin
        self.tokens = tokens
        self.cron = cron
        # the web dashboard's sign-in links (gpuq web), when it is on: set once it listens
        self.web_login: Callable[[Caller, str | None], tuple[str, float]] | None = None

    async def submit(
        self, caller: Caller, request: queue_pb2.SubmitRequest
    ) -> queue_pb2.SubmitResult:
        """The ids, or the error with the status code a call would have ended with (one
        submission of a stream fails, not the stream)."""
        try:
            check_may_submit(caller, self.settings.allow_root_jobs)
            key = request.request_key or None  # empty: no key
            spec = spec_from_proto(request.spec)
            check_sets_nice(caller.admin, spec.nice)
            check_interactive_spec(spec)
            cause = request_cause("Submit", caller)
            ids = await self.submissions.submit(spec, caller.user, cause, key, fail_fast=True)
        except Exception as error:
            status = error_status(error)
            return queue_pb2.SubmitResult(
                code=status.code.value[0], message=status.message, error_kind=status.kind
            )
        return queue_pb2.SubmitResult(job_ids=ids)

    async def act(
        self, verb: str, caller: Caller, request: queue_pb2.JobSelection
    ) -> queue_pb2.ActionReply:
        """Cancel, Hold, Release or Requeue the jobs a selection names."""
        check_count("job ids", len(request.job_ids))
        check_reason(request.reason)
        selection = Selection(tuple(request.job_ids), selection_filters(request))
        cause = request_cause(verb, caller)
        actions = self.actions
        if verb == "Cancel":
            outcomes = await actions.cancel(selection, caller, cause, request.reason)
        elif verb == "Hold":
            outcomes = await actions.hold(selection, caller, cause)
        elif verb == "Release":
            outcomes = await actions.release(selection, caller, cause)
        elif verb == "Requeue":
            outcomes = await actions.requeue(selection, caller, cause, hold=request.hold)
        else:
            raise ValueError(f"no action {verb}")
        return action_reply(outcomes)

    async def fail_job(
        self, caller: Caller, request: queue_pb2.FailJobRequest
    ) -> queue_pb2.ActionReply:
        """A step of a running job failed (srun's KillOnBadExit): the job ends failed with the
        step's reason on every node at once. The owner or an admin; a job that is not running
        (or runs another start than `attempt`) is left as it is."""
        reason = check_reason(request.reason, "reason")
        job = self.jobs.jobs.get(request.job_id)
        named = str(request.job_id)
        if job is None or job.state is not JobState.RUNNING:
            return action_reply([Outcome(named, False, "not running")])
        check_acts_on(caller, job.user, named)
        if request.attempt and request.attempt != job.start_count:
            return action_reply([Outcome(named, False, "started again since")])
        cause = request_cause("FailJob", caller)
        lost = self.node_admin.out_of_touch(job.node_names)
        if lost:  # its part there was fenced: the node failed, not the step
            await self.endings.parts_lost(job, lost, reason or "a step failed", cause)
            return action_reply([Outcome(named, True, "ends node_fail")])
        ending = Ending(job.id, JobState.FAILED, reason or "a step failed", attempt=job.start_count)
        await self.endings.record([ending], cause)
        return action_reply([Outcome(named, True, "ends failed")])

    async def update(
        self, caller: Caller, request: queue_pb2.UpdateRequest
    ) -> queue_pb2.ActionReply:
        check_count("job ids", len(request.job_ids))
        selection = Selection(tuple(request.job_ids))
        cause = request_cause("Update", caller)
        outcomes = await self.actions.update(selection, update_from_proto(request), caller, cause)
        return action_reply(outcomes)

    async def drain(self, caller: Caller, request: queue_pb2.DrainRequest) -> queue_pb2.DrainReply:
        check_admin(caller, "drain nodes", self.settings.admin_group)
        check_drain_request(request)
        units, message = await self.node_admin.drain(
            request.node, request.gpu, request.reason, caller.user
        )
        return queue_pb2.DrainReply(units=units, message=message)

    async def resume(self, caller: Caller, request: queue_pb2.DrainRequest) -> queue_pb2.DrainReply:
        check_admin(caller, "resume nodes", self.settings.admin_group)
        check_drain_request(request)
        units, message = await self.node_admin.resume(request.node, request.gpu, caller.user)
        return queue_pb2.DrainReply(units=units, message=message)

    async def issue_token(
        self, caller: Caller, request: queue_pb2.TokenRequest
    ) -> queue_pb2.TokenReply:
        check_admin(caller, "issue tokens", self.settings.admin_group)
        return queue_pb2.TokenReply(token=await self.tokens.issue(request.user, caller.user))

    async def revoke_tokens(
        self, caller: Caller, request: queue_pb2.TokenRequest
    ) -> queue_pb2.TokenReply:
        check_admin(caller, "revoke tokens", self.settings.admin_group)
        return queue_pb2.TokenReply(revoked=await self.tokens.revoke(request.user, caller.user))

    async def add_cron(
        self, caller: Caller, request: queue_pb2.AddCronRequest
    ) -> queue_pb2.CronEntry:
        check_may_submit(caller, self.settings.allow_root_jobs)
        spec = spec_from_proto(request.spec)
        check_sets_nice(caller.admin, spec.nice)
        entry = await self.cron.add(request.schedule, spec, caller.user)
        return cron_message(entry)

    async def remove_cron(
        self, caller: Caller, request: queue_pb2.RemoveCronRequest
    ) -> queue_pb2.CronEntry:
        return cron_message(await self.cron.remove(request.id, caller))

    def login_link(self, caller: Caller, credential: str | None) -> queue_pb2.WebLoginReply:
        """A one-time link that signs the caller in to the dashboard (gpuq web)."""
        if self.web_login is None:
            raise Unsatisfiable(
                "the web dashboard is off on this coordinator (an admin sets "
                "[coordinator] web_listen)"
            )
        url, expires = self.web_login(caller, credential)
        return queue_pb2.WebLoginReply(url=url, expires=expires)


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
            queue_pb2.ActionOutcome(
                job_id=o.job_id, done=o.done, message=o.message, error_kind=o.kind
            )
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
