"""Everything the dashboard asks of the coordinator, in one place: the only gpuq.web module
that imports gpuq.coordinator.

Queries and changes go through the coordinator's front door (QueueQueries, QueueCommands:
the same calls the gRPC servicer makes) with the session's Caller, so the dashboard shows and
does exactly what `gpuq` would for that user (who sees scripts, hidden names, who may cancel).
One method per thing the dashboard needs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractContextManager
from typing import Any

import grpc

from gpuq.coordinator.access.authority import Authority, user_uid
from gpuq.coordinator.access.permissions import check_reads_log
from gpuq.coordinator.front.cluster_history import ClusterView
from gpuq.coordinator.front.ranked_queue import MAX_RANKED, queue_filter
from gpuq.coordinator.front.rpc_calls import StreamCount, error_status
from gpuq.coordinator.server import Coordinator
from gpuq.domain.model import JobEvent, SeriesPoint
from gpuq.identity import Caller, Unauthenticated
from gpuq.v1 import queue_pb2
from gpuq.web.sessions import Session, token_stands, token_user

HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
}


class QueueAccess:
    """The coordinator as the dashboard sees it."""

    def __init__(
        self, coordinator: Coordinator, streams: StreamCount, authority: Authority
    ) -> None:
        self._queries = coordinator.queries
        self._commands = coordinator.commands
        self._streams = streams  # the Watch RPC's: a user's streams count together
        self._authority = authority

    # ---- who calls -----------------------------------------------------------------------

    @property
    def signing_key(self) -> bytes:
        """The coordinator's key (GPUQ_HOME/auth.key): tickets and cookies are signed with it."""
        return self._authority.key

    def token_owner(self, token: str) -> tuple[str, int | None, str]:
        """(user, uid, digest part) of a pasted per-user token; Unauthenticated unless live."""
        user, digest = token_user(self._authority.tokens, token)
        return user, user_uid(user), digest

    async def revoked_web_credentials(self, now: float) -> dict[str, float]:
        """The used tickets and ended sessions the store keeps (digest -> expiry)."""
        return await self._queries.writer.read(lambda s: s.revoked_web_credentials(now))

    async def keep_revoked(self, revoked: dict[str, float], now: float) -> None:
        """Keep used tickets and ended sessions in the store (and prune the expired); fails
        fast (StorageUnavailable) when the store cannot take it."""
        write = self._queries.writer.write
        await write(lambda tx: tx.revoke_web_credentials(revoked, now), fail_fast=True)

    def caller(self, session: Session) -> Caller:
        """The session's Caller, as the coordinator serves it now (admin decided now)."""
        authority = self._authority
        if not token_stands(authority.tokens, session):
            raise Unauthenticated("the token this session was opened with was revoked")
        if authority.own_uid != 0 and session.user != authority.own_user:
            raise Unauthenticated(
                f"this coordinator runs as {authority.own_user} and serves only "
                f"{authority.own_user}"
            )
        admin = authority.is_admin(session.user, session.uid)
        return Caller(session.user, session.uid, admin=admin, how=f"web {session.how}")

    @staticmethod
    def check_reads_log(caller: Caller, owner: str, job_id: int) -> None:
        """A job's output is its owner's and admins' (gpuq.coordinator.access.permissions)."""
        check_reads_log(caller, owner, job_id)

    def user_uid(self, user: str) -> int | None:
        """A user's uid on the coordinator's machine (whose files a job's output must be)."""
        return user_uid(user)

    # ---- queries -------------------------------------------------------------------------

    async def nodes(self, caller: Caller) -> queue_pb2.ListNodesReply:
        return self._queries.list_nodes()

    async def jobs_json(
        self, caller: Caller, request: queue_pb2.ListJobsRequest
    ) -> tuple[list[str], str]:
        """A page of jobs as JSON texts (kept from page to page), and the next page's token."""
        return await self._queries.list_jobs_json(caller, request)

    def job_counts(self) -> dict[str, int]:
        """Live jobs in each state (an array's waiting tasks one each), every one counted."""
        return self._queries.job_counts()

    async def job(self, caller: Caller, request: queue_pb2.GetJobRequest) -> queue_pb2.JobDetail:
        return await self._queries.get_job(caller, request)

    async def series(self, caller: Caller, request: queue_pb2.GetJobRequest) -> list[SeriesPoint]:
        """A job's chart (only of a job the caller may see): its stored series, then its
        recent points not stored yet."""
        detail = await self.job(caller, request)
        return await self._queries.series(int(detail.job.id))

    async def cluster_history(self, caller: Caller, range_name: str) -> ClusterView:
        """Each GPU's history and each user's GPU time over the range, as `caller` may see."""
        return await self._queries.cluster_history(caller, range_name)

    async def ranked_queue_json(
        self, caller: Caller, words: dict[str, str], limit: int
    ) -> tuple[list[str], bool]:
        """Live jobs in rank order, filtered by `words` (user, state, partition, name: ""
        any), at most `limit` (and MAX_RANKED); whether more match."""
        wanted = queue_filter(words["user"], words["state"], words["partition"], words["name"])
        return await self._queries.ranked_queue_json(caller, wanted, min(limit, MAX_RANKED))

    async def report(self, caller: Caller, user: str) -> queue_pb2.ReportReply:
        return await self._queries.report(caller, queue_pb2.ReportRequest(user=user))

    def sees_usage(self, caller: Caller, user: str) -> bool:
        """Whether the user page shows `user`'s fair share and GPUs to `caller`."""
        return self._queries.sees_usage(caller, user)

    def fair_share(self, user: str, now: float) -> tuple[float, float]:
        """(decayed GPU-seconds, fair-share factor) of `user`, as the scheduler ranks now."""
        return self._queries.fair_share(user, now)

    def running_gpus(self, user: str) -> int:
        """Units `user`'s running jobs hold."""
        return self._queries.running_gpus(user)

    def nodes_state(self) -> tuple[Any, ...]:
        """What `gpuq nodes` shows that heartbeats change (not when each was seen), to compare
        by value: a heartbeat replaces a node's usage messages, never changes them."""
        return self._queries.nodes_state()

    # ---- changes -------------------------------------------------------------------------

    async def cancel(self, caller: Caller, job_id: str) -> queue_pb2.ActionReply:
        return await self._change("Cancel", caller, job_id)

    async def hold(self, caller: Caller, job_id: str) -> queue_pb2.ActionReply:
        return await self._change("Hold", caller, job_id)

    async def release(self, caller: Caller, job_id: str) -> queue_pb2.ActionReply:
        return await self._change("Release", caller, job_id)

    # ---- live updates --------------------------------------------------------------------

    @property
    def stream_limit(self) -> int:
        """Streams one user may keep open (gRPC's Watch and Submit, and the dashboard's)."""
        return self._streams.limit

    def streams_open(self, user: str) -> int:
        return self._streams.open[user]

    def stream_slot(self, user: str) -> AbstractContextManager[str]:
        """Counts an open stream of `user` while entered; yields '' or why it is refused."""
        return self._streams.opened(user)

    def job_events(self, caller: Caller) -> AsyncIterator[list[JobEvent]]:
        """Every job's events as they commit, in batches, as `caller` may see them (names
        hidden where the admin hides them); ends when the coordinator stops."""
        return self._queries.job_events(caller)

    # ---- errors --------------------------------------------------------------------------

    @staticmethod
    def http_error(error: Exception) -> tuple[int, str]:
        """The HTTP status and message for an error a call raised, as gRPC would map it
        (an unexpected one is logged: 500)."""
        rpc = error_status(error)
        status, message = HTTP_STATUS.get(rpc.code, 500), rpc.message
        if status == 500:
            message = "internal error (see the coordinator's log)"
        return status, message

    async def _change(self, verb: str, caller: Caller, job_id: str) -> queue_pb2.ActionReply:
        selection = queue_pb2.JobSelection(job_ids=[job_id])
        return await self._commands.act(verb, caller, selection)
