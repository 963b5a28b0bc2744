"""A small HTTP/1.1 server for the coordinator's metrics and dashboard ports.

h11 parses and frames (sans-IO, from the python-hyper project that maintains the HTTP stack under
httpx and uvicorn); this module does the I/O on asyncio streams in the coordinator's own event
loop, so handlers read the coordinator's memory without locks. It bounds what one client can make
the coordinator hold or wait for: a header block of 16 KiB, a body of 64 KiB, 10 s to send a
request (a slow-loris client is cut off), 30 s idle between keep-alive requests, 30 s for a
write to drain, and MAX_CONNECTIONS connections at once, MAX_PER_HOST of them from one client
address (more are closed unanswered).

Handlers get a plain Request and return a Response, or an EventStream for server-sent events:
its chunks are written as they come, and the iterator is closed when the client goes away.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gzip
import logging
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import h11

from gpuq.config.settings import Settings
from gpuq.errors import GpuqError
from gpuq.tls import coordinator_cert_files

log = logging.getLogger(__name__)

MAX_HEADER = 16 * 1024  # bytes of a request line and headers
MAX_BODY = 64 * 1024  # bytes of a request body: the dashboard posts small JSON only
REQUEST_TIMEOUT = 10.0  # seconds to send a whole request once its first byte came
IDLE_TIMEOUT = 30.0  # seconds a kept-alive connection may wait for its next request
WRITE_TIMEOUT = 30.0  # seconds a write may wait for a client that does not read
HANDSHAKE_TIMEOUT = 10.0  # seconds for a TLS handshake
MAX_CONNECTIONS = 512
MAX_PER_HOST = 64  # of them from one client address: one host cannot hold every slot
MAX_QUERY_FIELDS = 50
READ_SIZE = 65536
COMPRESS_MIN = 1024  # bytes of text below which gzip is not worth it
COMPRESSIBLE = frozenset(
    {"application/json", "application/javascript", "image/svg+xml", "application/openmetrics-text"}
)


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
    flushed at once; the connection closes when it ends or the client goes."""

    events: AsyncIterator[bytes]
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[Request], Awaitable[Response | EventStream]]


class HttpServer:
    """One listening HTTP endpoint and its connections."""

    def __init__(self, name: str, address: str) -> None:
        self.name = name  # "metrics" or "web": its key in GPUQ_HOME/coordinator.json
        self.address = address  # HOST:PORT as bound
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.Task[None]] = set()
        self.per_host: collections.Counter[str] = collections.Counter()  # connections per client

    async def close(self) -> None:
        """Stop listening and end every connection, event streams included."""
        if self.server is not None:
            self.server.close()
        for task in list(self.connections):
            task.cancel()
        await asyncio.gather(*self.connections, return_exceptions=True)
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2.0)


def server_ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """TLS for an HTTP port with the coordinator's certificate ([coordinator] tls_cert and
    tls_key, as its gRPC port); None when neither is set."""
    files = coordinator_cert_files(settings)
    if files is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(*files)
    except (OSError, ssl.SSLError) as exc:
        raise GpuqError(
            f"cannot use the certificate {files[0]} with the key {files[1]}: {exc}"
        ) from None
    return context


async def serve_http(
    listen: str,
    handler: Handler,
    ssl_context: ssl.SSLContext | None = None,
    *,
    name: str,
) -> HttpServer:
    """Listen on HOST:PORT (port 0: any free one) and serve `handler`."""
    host, _, port = listen.rpartition(":")
    endpoint = HttpServer(name, listen)

    def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if peer else "?"
        if len(endpoint.connections) >= MAX_CONNECTIONS or endpoint.per_host[host] >= MAX_PER_HOST:
            writer.close()
            return
        task = asyncio.create_task(_serve_connection(reader, writer, handler, ssl_context))
        endpoint.connections.add(task)
        endpoint.per_host[host] += 1

        def done(task: asyncio.Task[None]) -> None:
            endpoint.connections.discard(task)
            endpoint.per_host[host] -= 1
            if not endpoint.per_host[host]:
                del endpoint.per_host[host]

        task.add_done_callback(done)

    try:
        server = await asyncio.start_server(
            accept,
            host=host.strip("[]"),
            port=int(port),
            ssl=ssl_context,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT if ssl_context is not None else None,
            reuse_address=True,
        )
    except OSError as exc:
        raise GpuqError(
            f"cannot listen on {listen}: {exc.strerror or exc}; "
            f"set [coordinator] {name}_listen in the config"
        ) from None
    endpoint.server = server
    bound = server.sockets[0].getsockname()
    shown_host = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    endpoint.address = f"{shown_host}:{bound[1]}"
    return endpoint


class _Closed(Exception):
    """The client closed the connection, or broke the protocol past answering."""


async def _serve_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    handler: Handler,
    ssl_context: ssl.SSLContext | None,
) -> None:
    peer_address = writer.get_extra_info("peername")
    peer = f"{peer_address[0]}:{peer_address[1]}" if peer_address else "?"
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER)
    try:
        first = True
        while True:
            try:
                request = await _read_request(conn, reader, peer, ssl_context is not None, first)
            except _BadRequest as bad:
                if conn.our_state is h11.SEND_RESPONSE or conn.our_state is h11.IDLE:
                    with contextlib.suppress(Exception):
                        await _send(conn, writer, Response(bad.status, bad.text.encode()), "GET")
                return
            if request is None:
                return
            first = False
            try:
                answer = await handler(request)
            except Exception:
                log.exception("internal error serving %s %s", request.method, request.path)
                answer = Response(500, b"internal error\n")
            if isinstance(answer, EventStream):
                await _stream(conn, reader, writer, answer)
                return
            answer = compressed(answer, request.headers.get("accept-encoding", ""))
            await _send(conn, writer, answer, request.method)
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()
    except (_Closed, ConnectionError, TimeoutError, h11.LocalProtocolError, ssl.SSLError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1.0)


class _BadRequest(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


async def _read_request(
    conn: h11.Connection,
    reader: asyncio.StreamReader,
    peer: str,
    secure: bool,
    first: bool,
) -> Request | None:
    """The next request, or None when the client closed the connection between requests."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (REQUEST_TIMEOUT if first else IDLE_TIMEOUT)
    event = await _next_event(conn, reader, deadline)
    if isinstance(event, h11.ConnectionClosed):
        return None
    if not isinstance(event, h11.Request):
        raise _BadRequest(400, "bad request\n")
    deadline = loop.time() + REQUEST_TIMEOUT
    # h11 bounds an incomplete header block only: a whole one that came in one read is not
    if len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers) > MAX_HEADER:
        raise _BadRequest(431, "request header fields too large\n")
    headers: dict[str, str] = {}
    for raw_name, raw_value in event.headers:
        key, value = raw_name.decode("ascii").lower(), raw_value.decode("latin-1")
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    length = headers.get("content-length", "0")
    if not length.isdigit() or int(length) > MAX_BODY:
        raise _BadRequest(413, "request body too large\n")
    body = b""
    while True:
        part = await _next_event(conn, reader, deadline)
        if isinstance(part, h11.Data):
            body += part.data
            if len(body) > MAX_BODY:
                raise _BadRequest(413, "request body too large\n")
        elif isinstance(part, h11.EndOfMessage):
            break
        else:
            raise _Closed()
    try:
        target = event.target.decode("ascii")
        split = urllib.parse.urlsplit(target)
        path = urllib.parse.unquote(split.path, errors="strict")
        pairs = urllib.parse.parse_qsl(
            split.query,
            keep_blank_values=True,
            errors="strict",
            max_num_fields=MAX_QUERY_FIELDS,
        )
    except (UnicodeDecodeError, ValueError):
        raise _BadRequest(400, "bad request target\n") from None
    query: dict[str, str] = {}
    for key, value in pairs:
        query.setdefault(key, value)
    return Request(
        method=event.method.decode("ascii").upper(),
        path=path,
        query=query,
        headers=headers,
        body=body,
        peer=peer,
        secure=secure,
    )


async def _next_event(
    conn: h11.Connection, reader: asyncio.StreamReader, deadline: float
) -> object:
    loop = asyncio.get_running_loop()
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise _BadRequest(exc.error_status_hint, "bad request\n") from None
        if event is not h11.NEED_DATA:
            return event
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise _Closed()
        try:
            data = await asyncio.wait_for(reader.read(READ_SIZE), remaining)
        except TimeoutError:
            raise _Closed() from None
        conn.receive_data(data)  # b"": the client closed its side


async def _write(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header admits gzip ("gzip", "gzip;q=0.5", "*"; not q=0)."""
    for part in accept_encoding.lower().split(","):
        name, _, params = part.strip().partition(";")
        if name.strip() not in ("gzip", "*"):
            continue
        quality = params.strip().removeprefix("q=").strip() if params.strip() else "1"
        try:
            return float(quality) > 0
        except ValueError:
            return False
    return False


def compressed(response: Response, accept_encoding: str) -> Response:
    """The response gzipped where it pays (text of COMPRESS_MIN bytes or more) and the client
    takes gzip: the dashboard's script, style and JSON shrink to a third, metrics to a tenth."""
    kind = response.content_type.split(";")[0].strip()
    if not kind.startswith("text/") and kind not in COMPRESSIBLE:
        return response
    response.headers.append(("vary", "accept-encoding"))
    if len(response.body) < COMPRESS_MIN or not accepts_gzip(accept_encoding):
        return response
    if any(name.lower() == "content-encoding" for name, _ in response.headers):
        return response
    response.body = gzip.compress(response.body, compresslevel=6, mtime=0)
    response.headers.append(("content-encoding", "gzip"))
    return response


async def _send(
    conn: h11.Connection, writer: asyncio.StreamWriter, response: Response, method: str
) -> None:
    headers = [
        ("content-type", response.content_type),
        ("content-length", str(len(response.body))),
        *response.headers,
    ]
    data = conn.send(h11.Response(status_code=response.status, headers=headers)) or b""
    if method != "HEAD" and response.body:
        data += conn.send(h11.Data(data=response.body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    await _write(writer, data)


async def _stream(
    conn: h11.Connection,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    stream: EventStream,
) -> None:
    """Write the stream's chunks until it ends or the client goes (a read that returns)."""
    headers = [
        ("content-type", "text/event-stream; charset=utf-8"),
        ("cache-control", "no-store"),
        ("x-accel-buffering", "no"),  # a proxy in front (nginx) must not hold events back
        *stream.headers,
    ]

    async def pump() -> None:
        await _write(writer, conn.send(h11.Response(status_code=200, headers=headers)) or b"")
        async for chunk in stream.events:
            await _write(writer, conn.send(h11.Data(data=chunk)) or b"")

    pumping = asyncio.create_task(pump())
    gone = asyncio.create_task(reader.read(READ_SIZE))  # anything, or EOF, ends the stream
    try:
        await asyncio.wait({pumping, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (pumping, gone):
            task.cancel()
        await asyncio.gather(pumping, gone, return_exceptions=True)
        close = getattr(stream.events, "aclose", None)  # an async generator's cleanup runs now
        if close is not None:
            with contextlib.suppress(Exception):
                await close()
