"""One connected agent's stream, coordinator side: the outbox its commands wait in.

Commands accumulate and leave as one message when the stream's writer next runs: under load
one message per scheduling pass, not per job.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable

from gpuq.domain.limits import MAX_AGENT_MESSAGE_BYTES
from gpuq.v1 import agent_pb2

ACK_DELAY = 0.05  # seconds an acknowledgement may wait for a command to travel with


class AgentSession:
    """One connected agent stream. Commands accumulate here and leave as one message when the
    stream's writer next runs: under load, one message per scheduling pass, not per job.
    A message stays within `max_bytes` (the agent's receive limit): launches beyond it start
    the next message, which follows at once (a launch of the largest valid job fits alone).

    Acknowledgements are not urgent (they only let the agent forget a recorded end), so they
    wait up to ACK_DELAY for the next command instead of costing a message of their own: a
    job's end is then acknowledged by the message that starts the job after it."""

    def __init__(
        self, node: str, max_bytes: int = MAX_AGENT_MESSAGE_BYTES, peer_address: str = ""
    ) -> None:
        self.node = node
        # the IP address the agent's connection comes from ("": unknown, e.g. in process)
        self.peer_address = peer_address
        self.closed = False
        self.max_bytes = max_bytes
        self._full: deque[agent_pb2.CoordinatorMessage] = deque()  # filled, to leave first
        self._pending = agent_pb2.CoordinatorMessage()
        self._size = 0  # about what _pending takes on the wire (never less)
        self._ready = asyncio.Event()
        self._ack_timer: asyncio.TimerHandle | None = None

    def registered(self, heartbeat_interval: float, node_timeout: float = 0.0) -> None:
        self._pending.registered.heartbeat_interval = heartbeat_interval
        self._pending.registered.node_timeout = node_timeout
        self._size += 32
        self._ready.set()

    def start(self, launches: Iterable[agent_pb2.JobLaunch]) -> None:
        for launch in launches:
            self._room(launch.ByteSize() + _FRAMING)
            self._pending.start.append(launch)
        self._ready.set()

    def stop(self, stops: Iterable[agent_pb2.StopJob]) -> None:
        for stop in stops:
            self._room(stop.ByteSize() + _FRAMING)
            self._pending.stop.append(stop)
        self._ready.set()

    def pty(self, inputs: Iterable[agent_pb2.PtyInput]) -> None:
        """Interactive jobs' terminal traffic (gpuq.coordinator.terminal_relay)."""
        for entry in inputs:
            self._room(entry.ByteSize() + _FRAMING)
            self._pending.pty.append(entry)
        self._ready.set()

    def signal(self, signals: Iterable[agent_pb2.SignalJob]) -> None:
        for entry in signals:
            self._room(entry.ByteSize() + _FRAMING)
            self._pending.signal.append(entry)
        self._ready.set()

    def seen(self, mark: float) -> None:
        """Echo an agent's Heartbeat.sent (or Register.sent): it extends its jobs' leases to
        that mark plus its fence_time (gpuq.agent.fencing). Not urgent at the scale of a
        lease, so it waits up to ACK_DELAY for a command to travel with, as acks do."""
        if mark > self._pending.seen:
            if not self._pending.seen:
                self._room(_FRAMING)
            self._pending.seen = mark
        if self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(ACK_DELAY, self._ready.set)

    def backlog(self) -> int:
        """About how many bytes wait to leave (an agent that reads slowly has many)."""
        return self._size + len(self._full) * self.max_bytes

    def ack(self, job_ids: Iterable[int]) -> None:
        for job_id in job_ids:
            self._room(_FRAMING)
            self._pending.ack.append(job_id)
        if self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(ACK_DELAY, self._ready.set)

    def _room(self, size: int) -> None:
        """Make room for an entry of `size` bytes: a message that would outgrow max_bytes is
        finished and queued, and the entry starts the next one."""
        if self._size and self._size + size > self.max_bytes:
            self._full.append(self._pending)
            self._pending = agent_pb2.CoordinatorMessage()
            self._size = 0
        self._size += size

    async def next_message(self) -> agent_pb2.CoordinatorMessage | None:
        """What accumulated, once there is something; None when the session closed."""
        await self._ready.wait()
        self._ready.clear()
        self._cancel_ack_timer()  # the acks leave with this message
        if self.closed:
            return None
        if self._full:  # a batch too large for one message: the rest follow at once
            message = self._full.popleft()
            if self._full or self._size:
                self._ready.set()
            return message
        message, self._pending = self._pending, agent_pb2.CoordinatorMessage()
        self._size = 0
        return message

    def close(self) -> None:
        self.closed = True
        self._cancel_ack_timer()
        self._ready.set()

    def _cancel_ack_timer(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None


_FRAMING = 11  # bytes a repeated entry may add to its own size: a tag and a length (or a varint)
