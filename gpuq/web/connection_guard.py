"""What aiohttp leaves to its user, done around it: a limit on what one client can make an HTTP
port hold or wait for.

aiohttp parses and frames HTTP/1.1 and times out idle kept-alive connections; it has no
connection caps, no deadline for a connection's first request, no bound on a whole header block
(only per line and per count) and no deadline for a write that a client never reads. Each
connection's protocol is therefore wrapped in a ConnectionGuard, a plain asyncio protocol that
passes everything on to aiohttp's and adds:

- MAX_CONNECTIONS connections at once, MAX_PER_HOST of them from one client address: more are
  closed unanswered, so one host cannot hold every slot;
- REQUEST_TIMEOUT seconds from accepting a connection to its first whole request head (a
  slow-loris client is cut off, unanswered); later heads get aiohttp's keep-alive timeout;
- MAX_HEADER bytes for a request head, counted as the bytes arrive (before aiohttp buffers
  them): past that, one 431 answer and the connection is closed;
- WRITE_TIMEOUT seconds for the transport to take writes again once its buffer filled (a
  client that stops reading, an event stream's included): then the connection is dropped;
- `closed`, a future done when the connection is lost: an event stream ends with it at once.

The endpoint's request handler tells the guard when a request head was parsed
(`request_started`) and when the request was answered (`request_finished`): heads are counted
only in between.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

MAX_HEADER = 16 * 1024  # bytes of a request line and headers
REQUEST_TIMEOUT = 10.0  # seconds to send a whole request (its head, then its body)
WRITE_TIMEOUT = 30.0  # seconds a write may wait for a client that does not read
MAX_CONNECTIONS = 512
MAX_PER_HOST = 64  # of them from one client address: one host cannot hold every slot
HEAD_ENDS = (b"\r\n\r\n", b"\n\n")
TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: 32\r\n"
    b"connection: close\r\n\r\n"
    b"request header fields too large\n"
)


class Connections:
    """The open connections of one endpoint, counted per client address."""

    def __init__(self) -> None:
        self.per_host: collections.Counter[str] = collections.Counter()
        self.guards: dict[asyncio.BaseTransport, ConnectionGuard] = {}

    def admit(self, host: str) -> bool:
        """Count a connection from `host` in, if there is room for it."""
        if len(self.guards) >= MAX_CONNECTIONS or self.per_host[host] >= MAX_PER_HOST:
            return False
        self.per_host[host] += 1
        return True

    def release(self, host: str) -> None:
        self.per_host[host] -= 1
        if self.per_host[host] <= 0:
            del self.per_host[host]

    def guard_of(self, transport: asyncio.BaseTransport | None) -> ConnectionGuard | None:
        return self.guards.get(transport) if transport is not None else None

    def abort_all(self) -> None:
        for guard in list(self.guards.values()):
            guard.abort()


class ConnectionGuard(asyncio.Protocol):
    """One connection: aiohttp's protocol (made by `inner`) within the limits above."""

    def __init__(self, inner: Callable[[], asyncio.Protocol], connections: Connections) -> None:
        self._make_inner = inner
        self.connections = connections
        self.inner: asyncio.Protocol | None = None  # None: refused (or not yet connected)
        self.transport: asyncio.Transport | None = None
        self.host = "?"
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._refused = False  # answered 431: the rest is dropped
        self._between = True  # no request is being served: bytes now are a head's
        self._head_bytes = 0  # of the head being received (while _between)
        self._head_seen = False  # its end came (the rest is its body: not counted)
        self._tail = b""  # the last bytes seen, for a head's end split between two reads
        self._first: asyncio.TimerHandle | None = None  # the first request's deadline
        self._write: asyncio.TimerHandle | None = None  # a blocked write's deadline

    # ---- asyncio's side ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        peer = transport.get_extra_info("peername")
        self.host = str(peer[0]) if peer else "?"
        if not self.connections.admit(self.host):
            transport.close()  # unanswered: no slot for it
            return
        self.transport = transport
        self.connections.guards[transport] = self
        loop = asyncio.get_running_loop()
        self._first = loop.call_later(REQUEST_TIMEOUT, self.abort)
        self.inner = self._make_inner()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.inner is None or self.transport is None:
            return
        if self._refused:
            return
        if self._between and not self._head_seen and not self._count_head(data):
            self._refused = True  # nothing more reaches aiohttp; it learns of the close
            self.transport.write(TOO_LARGE)
            self.transport.close()
            return
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._first, self._write):
            if timer is not None:
                timer.cancel()
        if not self.closed.done():
            self.closed.set_result(None)
        if self.transport is None:
            return  # refused: never counted
        self.connections.guards.pop(self.transport, None)
        self.connections.release(self.host)
        self.transport = None
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._write is None:
            self._write = asyncio.get_running_loop().call_later(WRITE_TIMEOUT, self.abort)
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._write is not None:
            self._write.cancel()
            self._write = None
        if self.inner is not None:
            self.inner.resume_writing()

    # ---- the endpoint's side -------------------------------------------------------------

    def request_started(self) -> None:
        """A request's head was parsed: its handler runs (the body has its own deadline)."""
        if self._first is not None:
            self._first.cancel()
            self._first = None
        self._between = False

    def request_finished(self) -> None:
        """The request was answered: what comes next is the next request's head."""
        self._between, self._head_seen, self._head_bytes, self._tail = True, False, 0, b""

    def abort(self) -> None:
        """Drop the connection at once, unanswered."""
        if self.transport is not None:
            self.transport.abort()

    def _count_head(self, data: bytes) -> bool:
        """Count `data` into the head being received; False once it is too large."""
        seen = self._tail + data
        ends = [at for at in (seen.find(end) for end in HEAD_ENDS) if at >= 0]
        if ends:
            end = min(ends)
            length = end + (4 if seen.startswith(b"\r\n\r\n", end) else 2) - len(self._tail)
            self._head_seen = True
        else:
            length = len(data)
            self._tail = seen[-3:]
        self._head_bytes += length
        return self._head_bytes <= MAX_HEADER
