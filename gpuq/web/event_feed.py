"""The dashboard's live updates (`/api/events`): server-sent events an open page refetches on.

`event: jobs` carries the job events that committed since the last message (at most
MAX_SSE_EVENTS of them, then only how many more); `event: nodes` says the nodes changed (checked
every NODES_CHECK seconds, and sent at least every NODES_EVERY); a `: ping` comment every
PING_EVERY seconds keeps proxies from closing the stream, and with it the session is checked
again: a session that ended (signed out, expired, its token revoked) gets `event: signed-out`
and the stream ends. A stream counts against its user's gRPC stream limit while it is open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from google.protobuf.json_format import MessageToDict

from gpuq.convert import event_to_proto
from gpuq.identity import Caller, Unauthenticated
from gpuq.web.queue_access import QueueAccess
from gpuq.web.sessions import Sessions

MAX_SSE_EVENTS = 200  # events in one `jobs` message; beyond them, only how many more
NODES_CHECK = 2.0  # seconds between checks whether nodes changed (for `event: nodes`)
NODES_EVERY = 5.0  # seconds: `event: nodes` at least this often
PING_EVERY = 15.0  # seconds between `: ping` comments (and session checks)


class EventFeed:
    """The event streams of one dashboard."""

    def __init__(self, access: QueueAccess, sessions: Sessions, clock: Callable[[], float]) -> None:
        self.access = access
        self.sessions = sessions
        self.clock = clock
        self._nodes_memo: tuple[float, tuple[Any, ...]] | None = None  # (loop time, state)

    async def stream(self, caller: Caller, cookie: str) -> AsyncIterator[bytes]:
        """One open page's stream, for `caller` signed in with the session cookie `cookie`:
        the events it may see (other users' job names hidden where the admin hides them)."""
        with self.access.stream_slot(caller.user) as refused:
            if refused:
                yield f"event: refused\ndata: {json.dumps({'error': refused})}\n\n".encode()
                return
            yield b"retry: 2000\n\n"
            queue: asyncio.Queue[list[Any]] = asyncio.Queue()

            async def follow() -> None:
                async for batch in self.access.job_events(caller):
                    queue.put_nowait(batch)

            loop = asyncio.get_running_loop()
            watching = asyncio.create_task(follow())
            try:
                nodes_seen = self._nodes_state()
                nodes_sent = next_check = next_ping = loop.time()
                next_check += NODES_CHECK
                next_ping += PING_EVERY
                while True:
                    timeout = max(0.0, min(next_check, next_ping) - loop.time())
                    try:
                        batch = await asyncio.wait_for(queue.get(), timeout)
                    except TimeoutError:
                        batch = None
                    if batch is not None:
                        while not queue.empty():
                            batch.extend(queue.get_nowait())
                        # a page refetches on any of them: a 10,000-task array's cancel is
                        # not 10,000 events to every open browser
                        events = [_dict(event_to_proto(e)) for e in batch[:MAX_SSE_EVENTS]]
                        more = max(0, len(batch) - MAX_SSE_EVENTS)
                        yield sse("jobs", {"events": events, "more": more})
                    if watching.done():
                        return  # the feed ended (the coordinator stops)
                    now = loop.time()
                    if now >= next_check:
                        next_check = now + NODES_CHECK
                        state = self._nodes_state()
                        if state != nodes_seen or now - nodes_sent >= NODES_EVERY:
                            nodes_seen, nodes_sent = state, now
                            yield b"event: nodes\ndata: {}\n\n"
                    if now >= next_ping:
                        next_ping = now + PING_EVERY
                        try:
                            self.access.caller(self.sessions.check(cookie, self.clock()))
                        except Unauthenticated as exc:
                            yield sse("signed-out", {"error": str(exc)})
                            return
                        yield b": ping\n\n"
            finally:
                watching.cancel()
                with contextlib.suppress(BaseException):
                    await watching

    def _nodes_state(self) -> tuple[Any, ...]:
        """The nodes' state to compare (QueueAccess.nodes_state). Every open stream asks every
        NODES_CHECK seconds: one look serves them all."""
        now = asyncio.get_running_loop().time()
        if self._nodes_memo is not None and now - self._nodes_memo[0] < NODES_CHECK / 2:
            return self._nodes_memo[1]
        state = self.access.nodes_state()
        self._nodes_memo = (now, state)
        return state


def sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _dict(message: Any) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)
