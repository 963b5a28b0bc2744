"""What aiohttp leaves to its user, done around it: a limit on what one client can make an HTTP
port hold or wait for.

aiohttp parses and frames HTTP/1.1 and times out idle kept-alive connections; it has no
connection caps, no deadline for a connection's first request, no bound on a whole header block
(only per line and per count) and no deadline for a write that a client never reads. Each
connection's protocol is therefore wrapped in a ConnectionGuard, a plain asyncio protocol that
passes everything on to aiohttp's and adds:

- connection caps (Connections, below): MAX_CONNECTIONS at once; per person, not per address;
- HEAD_TIMEOUT seconds from accepting a connection to its first whole request head (a
  slow-loris client is cut off, unanswered); later heads get aiohttp's keep-alive timeout;
- MAX_HEADER bytes for a request head, counted as the bytes arrive (before aiohttp buffers
  them): past that, one 431 answer and the connection is closed;
- WRITE_TIMEOUT seconds for the transport to take writes again once its buffer filled (a
  client that stops reading, an event stream's included): then the connection is dropped;
- `closed`, a future done when the connection is lost: an event stream ends with it at once.

The endpoint's request handler tells the guard when a request head was parsed
(`request_started`, with whose request it is) and when the request was answered
(`request_finished`): heads are counted only in between.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
from collections.abc import Callable

MAX_HEADER = 16 * 1024  # bytes of a request line and headers
HEAD_TIMEOUT = 5.0  # seconds from connecting to a whole first request head
REQUEST_TIMEOUT = 10.0  # seconds to send a request's body once its head came
WRITE_TIMEOUT = 30.0  # seconds a write may wait for a client that does not read
MAX_CONNECTIONS = 512
MAX_PER_USER = 64  # connections whose last request was a signed-in user's, per user
MAX_ANONYMOUS = 16  # other connections (not yet a request, or not signed in), per address
HEAD_ENDS = (b"\r\n\r\n", b"\n\n")
TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: 32\r\n"
    b"connection: close\r\n\r\n"
    b"request header fields too large\n"
)
LOOPBACK = "loopback"  # every loopback address is one client address


def client_address(host: str) -> str:
    """The client address limits count by: all of 127.0.0.0/8, ::1 and IPv4-mapped loopback
    are one ("loopback": anyone on this machine can bind any of them), an IPv4-mapped IPv6
    address is its IPv4 address, and an address's zone is dropped."""
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return LOOPBACK if address.is_loopback else str(address)


def anonymous(address: str) -> str:
    """The budget key of connections from `address` that no signed-in request owns."""
    return f"address {address}"


def of_user(user: str) -> str:
    """The budget key of connections a signed-in user's requests own."""
    return f"user {user}"


class Connections:
    """The open connections of one endpoint, each counted in one budget (its `owner`).

    Per person, not per address: many people share one address (everyone on this machine has
    all of loopback; a proxy or NAT carries many), so a connection counts against the budget of
    whoever its last request was from:

    - a connection starts anonymous, in its client address's budget: MAX_ANONYMOUS at once;
    - a request with a valid session (the endpoint's `owner_of` names its user) moves its
      connection to that user's budget, MAX_PER_USER at once, wherever they connect from; a
      request without one moves it back;
    - a newcomer to a full anonymous budget displaces the connection of that budget that has
      waited longest for its next request (never one being answered): a flood of
      connections that send nothing, or nothing signed in, churns only its own address's
      anonymous slots, and a signed-in user's new connection, whose head follows its connect,
      gets in and leaves that budget with its first request (to push it out first, a flood
      would have to open MAX_ANONYMOUS connections in the moment between its connect and its
      first bytes);
    - a request whose user's budget is full is answered 429 and its connection closed;
    - MAX_CONNECTIONS at once in all: more are closed unanswered.

    So one person cannot hold every slot: unauthenticated, at most MAX_ANONYMOUS per address,
    each cut off HEAD_TIMEOUT after connecting unless a request head came; signed in, at most
    MAX_PER_USER for their user.
    """

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.guards: dict[asyncio.BaseTransport, ConnectionGuard] = {}

    def admit(self, guard: ConnectionGuard) -> bool:
        """Count a new connection in, anonymous, if there is room for it (made by displacing
        a waiting connection of the same address where its budget is full)."""
        key = anonymous(guard.address)
        if len(self.guards) >= MAX_CONNECTIONS:
            return False
        if self.counts[key] >= MAX_ANONYMOUS and not self._displace(key, guard):
            return False
        guard.owner = key
        self.counts[key] += 1
        return True

    def assign(self, guard: ConnectionGuard, user: str | None) -> bool:
        """Count `guard` in the budget of its request's `user` (None: its address's
        anonymous one); False (and unmoved) when that budget is full."""
        key = of_user(user) if user is not None else anonymous(guard.address)
        if key == guard.owner:
            return True
        limit = MAX_PER_USER if user is not None else MAX_ANONYMOUS
        if self.counts[key] >= limit and (user is not None or not self._displace(key, guard)):
            return False
        self._uncount(guard.owner)
        guard.owner = key
        self.counts[key] += 1
        return True

    def release(self, guard: ConnectionGuard) -> None:
        self._uncount(guard.owner)
        guard.owner = ""

    def guard_of(self, transport: asyncio.BaseTransport | None) -> ConnectionGuard | None:
        return self.guards.get(transport) if transport is not None else None

    def abort_all(self) -> None:
        for guard in list(self.guards.values()):
            guard.abort()

    def _uncount(self, key: str) -> None:
        if not key:
            return
        self.counts[key] -= 1
        if self.counts[key] <= 0:
            del self.counts[key]

    def _displace(self, key: str, newcomer: ConnectionGuard) -> bool:
        """Drop the connection in budget `key` that has waited longest for a request (its head
        or body; not one being answered); False when every one of them is being answered."""
        waiting = [
            guard
            for guard in self.guards.values()
            if guard.owner == key and guard.waiting and guard is not newcomer
        ]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda guard: guard.waiting_since)
        self.release(oldest)  # its slot is the newcomer's now, before the transport goes
        if oldest.transport is not None:
            self.guards.pop(oldest.transport, None)
        oldest.abort()
        return True


class ConnectionGuard(asyncio.Protocol):
    """One connection: aiohttp's protocol (made by `inner`) within the limits above."""

    def __init__(self, inner: Callable[[], asyncio.Protocol], connections: Connections) -> None:
        self._make_inner = inner
        self.connections = connections
        self.inner: asyncio.Protocol | None = None  # None: refused (or not yet connected)
        self.transport: asyncio.Transport | None = None
        self.host = "?"
        self.address = "?"  # the host as limits count it (client_address)
        self.owner = ""  # the budget it is counted in (Connections); "": none
        self.waiting = True  # for a request (head or body): none is being answered
        self.waiting_since = 0.0  # loop time it began to wait
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
        self.address = client_address(self.host)
        loop = asyncio.get_running_loop()
        self.waiting_since = loop.time()
        if not self.connections.admit(self):
            transport.close()  # unanswered: no slot for it
            return
        self.transport = transport
        self.connections.guards[transport] = self
        self._first = loop.call_later(HEAD_TIMEOUT, self.abort)
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
        self.connections.release(self)
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

    def request_started(self, user: str | None = None) -> bool:
        """A request's head was parsed: its handler runs (the body has its own deadline).
        `user`: whose valid session it carries (None: none); False when that budget is full
        (the request is answered 429 and the connection closed)."""
        if self._first is not None:
            self._first.cancel()
            self._first = None
        self._between = False
        return self.connections.assign(self, user) if self.owner else True

    def answering(self) -> None:
        """The request was read whole (its body too): its handler answers it now. Until then
        an anonymous connection may be displaced (a body trickled slowly holds nothing)."""
        self.waiting = False

    def request_finished(self) -> None:
        """The request was answered: what comes next is the next request's head."""
        self._between, self._head_seen, self._head_bytes, self._tail = True, False, 0, b""
        self.waiting, self.waiting_since = True, asyncio.get_running_loop().time()

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
