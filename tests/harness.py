"""An in-process coordinator for tests of coordinator logic: the real assembled coordinator
(gpuq.coordinator.server.assemble) over a real store, its real scheduling loop and memory, and
agents that speak to its AgentLink directly (an AgentSession stands for the stream) instead of
over gRPC from another process. Real-process tests (tests/e2e) keep what crosses processes:
gRPC, identity, agents, supervisors, signals.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.changes.effects import Cause
from gpuq.coordinator.changes.transitions import Ending
from gpuq.coordinator.jobs.job_actions import Outcome
from gpuq.coordinator.jobs.selection import Filters, Selection
from gpuq.coordinator.memory.node_table import NodeEntry
from gpuq.coordinator.nodes.agent_session import AgentSession
from gpuq.coordinator.server import Coordinator, assemble
from gpuq.domain.model import JobResult, JobSpec, Node
from gpuq.domain.states import JobState
from gpuq.identity import Caller
from gpuq.store.api import Store
from gpuq.v1 import agent_pb2 as apb

TEST = Cause("test")


@dataclass
class Clock:
    """A clock a test moves by hand."""

    now: float = 1_000_000.0
    moves: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.moves.append(seconds)


def run(
    store: Store,
    body: Callable[[Coordinator], Awaitable[None]],
    settings: CoordinatorSettings | None = None,
    clock: Callable[[], float] | None = None,
) -> None:
    """Assemble and start a coordinator over `store`, run `body`, close it."""

    async def main() -> None:
        co = assemble(store, settings or CoordinatorSettings(), *([clock] if clock else []))
        await co.start()
        try:
            await body(co)
        finally:
            await co.close()

    asyncio.run(main())


async def until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    """Poll for a condition with a deadline (the event loop runs meanwhile)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def user(name: str, admin: bool = False) -> Caller:
    return Caller(name, None, admin=admin)


async def submit(co: Coordinator, spec: JobSpec, owner: str, key: str | None = None) -> list[int]:
    return await co.submissions.submit(spec, owner, TEST, key)


async def cancel(
    co: Coordinator,
    ids: Iterable[str],
    owner: str,
    reason: str = "",
    *,
    admin: bool = False,
    filters: Filters | None = None,
) -> list[Outcome]:
    caller = user(owner, admin)
    cause = Cause.request("Cancel", owner)
    return await co.actions.cancel(Selection(tuple(ids), filters), caller, cause, reason)


async def save_node(co: Coordinator, node: Node) -> None:
    await co.writer.write(lambda tx: tx.save_node(node))


async def connect(co: Coordinator, node: Node) -> AgentSession:
    """A node whose agent is connected and heard from, without the agent link: for tests of
    what the coordinator does with nodes (drains, scheduling), not of the agent protocol."""
    await save_node(co, node)
    session = AgentSession(node.name)
    co.nodes.nodes[node.name] = NodeEntry(node, co.clock(), session, heard=True)
    return session


async def record_ends(
    co: Coordinator, node: str, ends: Iterable[tuple[int, JobState, JobResult, float | None]]
) -> None:
    """Jobs whose processes are gone, as the agent on `node` reports them."""
    endings = [Ending(i, s, r.reason or s.value, r, at) for i, s, r, at in ends]
    await co.endings.record(endings, Cause.agent(node))


async def message_with(session: AgentSession, kind: str) -> apb.CoordinatorMessage:
    """The next message to the agent that carries `kind` (start, stop, ack)."""
    while True:
        message = await asyncio.wait_for(session.next_message(), 10)
        assert message is not None
        if getattr(message, kind):
            return message
