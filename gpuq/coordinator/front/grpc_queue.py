"""The Queue service (gpuq.v1.Queue) over gRPC: thin. Each RPC takes its caller (resolved
once by the interceptor, gpuq.coordinator.front.rpc_calls) and its request to the front door
(QueueQueries, QueueCommands), and an error ends the call with its status.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc

from gpuq.coordinator.front.queue_commands import QueueCommands
from gpuq.coordinator.front.queue_queries import QueueQueries
from gpuq.coordinator.front.rpc_calls import StreamCount, current_caller, end_call, unary
from gpuq.coordinator.terminal_relay import Terminals, relay
from gpuq.identity import METADATA_KEY, Caller
from gpuq.v1 import queue_pb2, queue_pb2_grpc

MAX_STREAMS_PER_USER = 128  # Submit and Watch streams one user may keep open at once


class QueueServicer(queue_pb2_grpc.QueueServicer):  # type: ignore[misc]
    def __init__(
        self,
        queries: QueueQueries,
        commands: QueueCommands,
        terminals: Terminals,
        streams: StreamCount,
    ) -> None:
        self.queries = queries
        self.commands = commands
        self.terminals = terminals
        self.streams = streams  # shared with the dashboard's event streams

    @contextlib.contextmanager
    def _stream(self, caller: Caller) -> Iterator[str]:
        with self.streams.opened(caller.user) as refused:
            yield refused

    async def Submit(
        self, requests: AsyncIterator[queue_pb2.SubmitRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[queue_pb2.SubmitResult]:
        """Submit, once per message; an error ends that submission, not the stream."""
        caller = current_caller()
        with self._stream(caller) as refused:
            if refused:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
            async for request in requests:
                yield await self.commands.submit(caller, request)

    async def Watch(
        self, request: queue_pb2.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[queue_pb2.JobEvents]:
        caller = current_caller()
        with self._stream(caller) as refused:
            if refused:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
            try:
                async for events in self.queries.watch(caller, request.job_ids):
                    yield events
            except Exception as error:
                await end_call(context, error)

    async def Attach(
        self, requests: AsyncIterator[queue_pb2.AttachRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[queue_pb2.AttachReply]:
        """An interactive job's terminal (gpuq.coordinator.terminal_relay): the owner's only."""
        caller = current_caller()
        with self._stream(caller) as refused:
            if refused:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
            try:
                waits = self.queries.messages.waits
                async for reply in relay(self.terminals, requests, caller.user, waits):
                    yield reply
            except Exception as error:
                await end_call(context, error)

    @unary
    async def GetJob(self, request: queue_pb2.GetJobRequest, caller: Caller) -> Any:
        return await self.queries.get_job(caller, request)

    @unary
    async def ListJobs(self, request: queue_pb2.ListJobsRequest, caller: Caller) -> Any:
        return await self.queries.list_jobs(caller, request)

    @unary
    async def ListNodes(self, request: queue_pb2.ListNodesRequest, caller: Caller) -> Any:
        return self.queries.list_nodes()

    @unary
    async def Report(self, request: queue_pb2.ReportRequest, caller: Caller) -> Any:
        return await self.queries.report(caller, request)

    @unary
    async def ListCron(self, request: queue_pb2.ListCronRequest, caller: Caller) -> Any:
        return self.queries.list_cron(caller)

    @unary
    async def AddCron(self, request: queue_pb2.AddCronRequest, caller: Caller) -> Any:
        return await self.commands.add_cron(caller, request)

    @unary
    async def RemoveCron(self, request: queue_pb2.RemoveCronRequest, caller: Caller) -> Any:
        return await self.commands.remove_cron(caller, request)

    @unary
    async def Cancel(self, request: queue_pb2.JobSelection, caller: Caller) -> Any:
        return await self.commands.act("Cancel", caller, request)

    @unary
    async def Hold(self, request: queue_pb2.JobSelection, caller: Caller) -> Any:
        return await self.commands.act("Hold", caller, request)

    @unary
    async def Release(self, request: queue_pb2.JobSelection, caller: Caller) -> Any:
        return await self.commands.act("Release", caller, request)

    @unary
    async def Requeue(self, request: queue_pb2.JobSelection, caller: Caller) -> Any:
        return await self.commands.act("Requeue", caller, request)

    @unary
    async def FailJob(self, request: queue_pb2.FailJobRequest, caller: Caller) -> Any:
        return await self.commands.fail_job(caller, request)

    @unary
    async def Update(self, request: queue_pb2.UpdateRequest, caller: Caller) -> Any:
        return await self.commands.update(caller, request)

    @unary
    async def Drain(self, request: queue_pb2.DrainRequest, caller: Caller) -> Any:
        return await self.commands.drain(caller, request)

    @unary
    async def Resume(self, request: queue_pb2.DrainRequest, caller: Caller) -> Any:
        return await self.commands.resume(caller, request)

    @unary
    async def IssueToken(self, request: queue_pb2.TokenRequest, caller: Caller) -> Any:
        return await self.commands.issue_token(caller, request)

    @unary
    async def RevokeTokens(self, request: queue_pb2.TokenRequest, caller: Caller) -> Any:
        return await self.commands.revoke_tokens(caller, request)

    async def WebLogin(
        self, request: queue_pb2.WebLoginRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        """A one-time link that signs the caller in to the dashboard (gpuq web): the link
        carries the caller's own credential, read from the call's metadata."""
        try:
            metadata = dict(context.invocation_metadata() or ())
            return self.commands.login_link(current_caller(), metadata.get(METADATA_KEY))
        except Exception as error:
            await end_call(context, error)
            raise
