"""What a handler of the metrics or dashboard port gets and returns: plain data, no framework.

The server (gpuq.web.http_endpoint, on aiohttp) reads each request whole (its body bounded)
into a Request and writes back the Response, or the EventStream of server-sent events, that the
handler returns. Handlers stay plain functions of plain data: the dashboard's and the metrics'
tests call them without a socket, and the framework stays in one module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Request:
    method: str  # "GET", "POST", ...
    path: str  # percent-decoded, without the query: "/api/jobs/12"
    query: dict[str, str]  # the first value of each parameter
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    peer: str  # the client's "host:port"
    secure: bool  # it came over TLS


@dataclass(slots=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)


@dataclass(slots=True)
class EventStream:
    """Server-sent events (text/event-stream): each chunk `events` yields is written and
    flushed at once; the connection closes when it ends or the client goes, and then the
    iterator is closed (an async generator's `finally` runs at once)."""

    events: AsyncIterator[bytes]
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[Request], Awaitable[Response | EventStream]]
