"""The metrics and dashboard ports: aiohttp's HTTP/1.1 server on the coordinator's event loop.

aiohttp (its low-level server: no application, router or middleware) parses and frames
requests and responses, keeps connections alive and speaks TLS; handlers run on the
coordinator's own event loop, so they read its memory without locks. This module turns each
request into a plain Request (gpuq.web.http_types), its body read whole and bounded, and the
handler's Response or EventStream back into aiohttp's. gpuq.web.connection_guard adds the limits
aiohttp lacks (connections per person, the first request's deadline, the head's size, blocked
writes); `owner_of` (the dashboard's) names the signed-in user of a request from its headers,
so its connection counts against that user's budget, not its address's. Here: a body of
64 KiB, read within 10 s of its head, and 30 s of keep-alive between requests (aiohttp's own
timer). Text is gzipped here, not by aiohttp, whose choice of encoding does not honour `q=0`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import ssl
import urllib.parse
from collections.abc import Callable
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from gpuq.config.settings import Settings
from gpuq.errors import GpuqError
from gpuq.tls import coordinator_cert_files
from gpuq.web.connection_guard import (
    MAX_HEADER,
    REQUEST_TIMEOUT,
    ConnectionGuard,
    Connections,
)
from gpuq.web.http_types import EventStream, Handler, Request, Response

log = logging.getLogger(__name__)
# aiohttp logs each malformed request and each dropped connection as an error, with a
# traceback: a client's bad bytes are not the coordinator's error, and are not logged
quiet = logging.getLogger(f"{__name__}.protocol")
quiet.setLevel(logging.CRITICAL)

MAX_BODY = 64 * 1024  # bytes of a request body: the dashboard posts small JSON only
IDLE_TIMEOUT = 30.0  # seconds a kept-alive connection may wait for its next request
HANDSHAKE_TIMEOUT = 10.0  # seconds for a TLS handshake
CLOSE_GRACE = 1.0  # seconds a request in progress may finish in when the port closes
MAX_QUERY_FIELDS = 50
COMPRESS_MIN = 1024  # bytes of text below which gzip is not worth it
COMPRESSIBLE = frozenset(
    {"application/json", "application/javascript", "image/svg+xml", "application/openmetrics-text"}
)
SERVER_NAME = "gpuq"  # instead of aiohttp's name and version
OwnerOf = Callable[[dict[str, str]], str | None]  # a request's signed-in user, from its headers


class HttpEndpoint:
    """One listening HTTP port and its connections."""

    def __init__(
        self,
        name: str,
        address: str,
        handler: Handler,
        secure: bool,
        owner_of: OwnerOf | None = None,
    ) -> None:
        self.name = name  # "metrics" or "web": its key in GPUQ_HOME/coordinator.json
        self.address = address  # HOST:PORT as bound
        self.handler = handler
        self.owner_of = owner_of  # a request's signed-in user, from its headers; None: none
        self.secure = secure  # served over TLS
        self.server: asyncio.Server | None = None
        self.connections = Connections()
        self.closing = asyncio.Event()  # set on close: event streams end
        self.protocol = web.Server(
            self._serve,
            keepalive_timeout=IDLE_TIMEOUT,
            max_line_size=MAX_HEADER,  # the guard bounds the whole head
            max_field_size=MAX_HEADER,
            max_headers=MAX_HEADER // 4,  # "a:" CRLF: as many as fit
            lingering_time=0,  # a body not read (too large) is not waited for: close
            auto_decompress=False,  # a body is what was sent, as before
            access_log=None,
            logger=quiet,
        )

    async def close(self) -> None:
        """Stop listening and end every connection, event streams included."""
        if self.server is not None:
            self.server.close()
        self.closing.set()
        self.protocol.pre_shutdown()  # idle kept-alive connections close now
        with contextlib.suppress(Exception):
            await self.protocol.shutdown(CLOSE_GRACE)
        self.connections.abort_all()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2.0)

    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        guard = self.connections.guard_of(request.transport)
        if guard is None:  # gone already
            raise ConnectionResetError("the client went away")
        headers = _headers(request)
        user = self.owner_of(headers) if self.owner_of is not None else None
        admitted = guard.request_started(user)
        try:
            if not admitted:  # the user's connections are all taken
                full = _response(Response(429, b"too many connections open\n"))
                full.force_close()
                return full
            try:
                plain = await self._read(request, headers)
            except _BadRequest as bad:
                answer = _response(Response(bad.status, bad.text.encode()))
                answer.force_close()
                return answer
            except TimeoutError:
                guard.abort()  # its body never came whole: closed unanswered
                raise ConnectionResetError("the request's body was too slow") from None
            guard.answering()
            try:
                result = await self.handler(plain)
            except Exception:
                log.exception("internal error serving %s %s", plain.method, plain.path)
                result = Response(500, b"internal error\n")
            if isinstance(result, EventStream):
                return await self._stream(request, result, guard)
            return _response(compressed(result, plain.headers.get("accept-encoding", "")))
        finally:
            guard.request_finished()

    async def _read(self, request: web.BaseRequest, headers: dict[str, str]) -> Request:
        """The request as plain data, its body read whole within REQUEST_TIMEOUT."""
        target = request.raw_path
        if len(target) + sum(len(k) + len(v) + 4 for k, v in request.raw_headers) > MAX_HEADER:
            # a head the guard did not count (it came pipelined behind another request)
            raise _BadRequest(431, "request header fields too large\n")
        length = headers.get("content-length", "0")
        if not length.isdigit() or int(length) > MAX_BODY:
            raise _BadRequest(413, "request body too large\n")
        try:
            target.encode("ascii")
            split = urllib.parse.urlsplit(target)
            path = urllib.parse.unquote(split.path, errors="strict")
            pairs = urllib.parse.parse_qsl(
                split.query,
                keep_blank_values=True,
                errors="strict",
                max_num_fields=MAX_QUERY_FIELDS,
            )
        except (UnicodeError, ValueError):
            raise _BadRequest(400, "bad request target\n") from None
        query: dict[str, str] = {}
        for key, value in pairs:
            query.setdefault(key, value)
        body = bytearray()
        async with asyncio.timeout(REQUEST_TIMEOUT):
            while chunk := await request.content.readany():
                body += chunk
                if len(body) > MAX_BODY:
                    raise _BadRequest(413, "request body too large\n")
        peer = request.transport.get_extra_info("peername") if request.transport else None
        return Request(
            method=request.method.upper(),
            path=path,
            query=query,
            headers=headers,
            body=bytes(body),
            peer=f"{peer[0]}:{peer[1]}" if peer else "?",
            secure=self.secure,
        )

    async def _stream(
        self, request: web.BaseRequest, stream: EventStream, guard: ConnectionGuard
    ) -> web.StreamResponse:
        """Write the stream's chunks until it ends, the client goes or the port closes."""
        headers = CIMultiDict(
            [
                ("content-type", "text/event-stream; charset=utf-8"),
                ("cache-control", "no-store"),
                ("x-accel-buffering", "no"),  # a proxy in front (nginx) must not hold events back
                ("server", SERVER_NAME),
                *stream.headers,
            ]
        )
        response = web.StreamResponse(status=200, headers=headers)
        response.force_close()  # the connection ends with the stream

        async def pump() -> None:
            await response.prepare(request)
            async for chunk in stream.events:
                await response.write(chunk)

        pumping = asyncio.create_task(pump())
        closing = asyncio.create_task(self.closing.wait())
        ends: set[asyncio.Future[Any]] = {pumping, closing, guard.closed}
        try:
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pumping, closing):
                task.cancel()
            await asyncio.gather(pumping, closing, return_exceptions=True)
            close = getattr(stream.events, "aclose", None)  # an async generator's cleanup runs now
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()
        if not response.prepared or guard.closed.done():
            guard.abort()
            raise ConnectionResetError("the event stream's client went away")
        return response


def _headers(request: web.BaseRequest) -> dict[str, str]:
    """A request's headers: lower-case names, repeated ones joined with ", "."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in request.raw_headers:
        key, value = raw_name.decode("ascii", "replace").lower(), raw_value.decode("latin-1")
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return headers


class _BadRequest(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def _response(answer: Response) -> web.Response:
    headers = CIMultiDict([("content-type", answer.content_type), ("server", SERVER_NAME)])
    for name, value in answer.headers:
        headers.add(name, value)
    return web.Response(status=answer.status, body=answer.body, headers=headers)


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
    owner_of: OwnerOf | None = None,
) -> HttpEndpoint:
    """Listen on HOST:PORT (port 0: any free one) and serve `handler`. `owner_of`: the
    signed-in user a request's headers name (its connection counts against that user's
    budget: gpuq.web.connection_guard.Connections); without it every connection counts
    against its client address's."""
    host, _, port = listen.rpartition(":")
    endpoint = HttpEndpoint(name, listen, handler, ssl_context is not None, owner_of)
    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(
            lambda: ConnectionGuard(endpoint.protocol, endpoint.connections),
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
