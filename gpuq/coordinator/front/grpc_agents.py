"""The agent stream (gpuq.v1.AgentLink.Connect) over gRPC: thin. The interceptor resolved the
caller from its node key; the stream must register as that node (and, on the mutual-TLS port,
as the node its certificate names), then each message's parts go to the AgentLink.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from gpuq.coordinator.front.rpc_calls import current_caller, end_call
from gpuq.coordinator.nodes.agent_input import peer_address
from gpuq.coordinator.nodes.agent_link import AgentLink
from gpuq.coordinator.nodes.agent_session import AgentSession
from gpuq.errors import GpuqError
from gpuq.tls import peer_common_name
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import agent_pb2_grpc


class AgentLinkServicer(agent_pb2_grpc.AgentLinkServicer):  # type: ignore[misc]
    def __init__(self, link: AgentLink) -> None:
        self.link = link

    async def Connect(
        self, request_iterator: AsyncIterator[apb.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[apb.CoordinatorMessage]:
        caller = current_caller()
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
        session = AgentSession(node, peer_address=peer_address(context.peer()))
        try:
            await self.link.register(first.register, session)
        except BaseException as error:
            self.link.disconnected(node, session)  # never leave this session installed
            if isinstance(error, GpuqError):
                await end_call(context, error)
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
                    self.link.heartbeat(node, message.heartbeat, session)
                if message.pty:  # before the reports: a job's output comes before its end
                    self.link.pty(node, message.pty)
                if message.reports:
                    self.link.reports(node, message.reports)
        except grpc.aio.AioRpcError:
            pass
        finally:
            session.close()
