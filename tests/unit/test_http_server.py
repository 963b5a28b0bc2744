"""gpuq.web.http_endpoint and gpuq.web.connection_guard: the metrics and dashboard ports' HTTP
server (aiohttp, with the limits it lacks added around it), over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import http.client
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from gpuq.errors import GpuqError
from gpuq.web import connection_guard, http_endpoint
from gpuq.web.http_endpoint import serve_http
from gpuq.web.http_types import EventStream, Request, Response


def run(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """A coroutine test run to completion in a fresh event loop."""

    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return wrapper


async def echo(request: Request) -> Response | EventStream:
    if request.path == "/boom":
        raise RuntimeError("handler bug")
    text = f"{request.method} {request.path} {sorted(request.query.items())} {len(request.body)}"
    return Response(200, text.encode(), headers=[("x-peer-secure", str(request.secure))])


def fetch(address: str, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def status_of(reply: bytes) -> int:
    """The status of the one response in `reply` (nothing may follow it)."""
    version, status, _ = reply.split(b" ", 2)
    assert version in (b"HTTP/1.0", b"HTTP/1.1") and reply.count(b"HTTP/1.") == 1, reply
    return int(status)


def raw(address: str, data: bytes, timeout: float = 10.0) -> bytes:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


@run
async def test_requests_are_parsed_and_answered() -> None:
    server = await serve_http("127.0.0.1:0", echo, name="web")
    try:
        status, body = await asyncio.to_thread(fetch, server.address, "GET", "/a%20b/c?x=1&x=2&y=")
        assert status == 200
        assert body == b"GET /a b/c [('x', '1'), ('y', '')] 0"
        status, body = await asyncio.to_thread(fetch, server.address, "POST", "/p", b"12345")
        assert (status, body) == (200, b"POST /p [] 5")
        status, body = await asyncio.to_thread(fetch, server.address, "HEAD", "/h")
        assert (status, body) == (200, b"")
        status, body = await asyncio.to_thread(fetch, server.address, "GET", "/boom")
        assert (status, body) == (500, b"internal error\n")
    finally:
        await server.close()


@run
async def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    server = await serve_http("127.0.0.1:0", echo, name="web")
    try:
        two = (
            b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        reply = await asyncio.to_thread(raw, server.address, two)
        assert reply.count(b"HTTP/1.1 200") == 2
        assert b"GET /1 []" in reply and b"GET /2 []" in reply
    finally:
        await server.close()


@run
async def test_bad_and_oversized_requests_get_one_error_and_a_close() -> None:
    server = await serve_http("127.0.0.1:0", echo, name="web")
    try:
        reply = await asyncio.to_thread(raw, server.address, b"NONSENSE\r\n\r\n")
        assert status_of(reply) == 400  # no version to answer in: aiohttp says HTTP/1.0
        big = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n"
        reply = await asyncio.to_thread(raw, server.address, big)
        assert reply.startswith(b"HTTP/1.1 413")
        # over MAX_HEADER, yet within one read of the server's: it has read all of it when
        # it answers (closing with bytes unread is a reset, which may discard the answer)
        over = connection_guard.MAX_HEADER + 1024
        huge_header = b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * over + b"\r\n\r\n"
        reply = await asyncio.to_thread(raw, server.address, huge_header)
        assert reply.startswith(b"HTTP/1.1 431")
        bad_utf8 = b"GET /%ff HTTP/1.1\r\nHost: x\r\n\r\n"
        reply = await asyncio.to_thread(raw, server.address, bad_utf8)
        assert reply.startswith(b"HTTP/1.1 400")
    finally:
        await server.close()


@run
async def test_a_client_that_never_finishes_its_request_is_cut_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connection_guard, "HEAD_TIMEOUT", 0.3)
    server = await serve_http("127.0.0.1:0", echo, name="web")
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        reply = await asyncio.to_thread(raw, server.address, b"GET / HTTP/1.1\r\nHost: x\r\n")
        assert reply == b""  # closed without an answer
        assert loop.time() - started < 5.0
    finally:
        await server.close()


@run
async def test_an_event_stream_ends_when_the_client_goes() -> None:
    closed = asyncio.Event()
    sent = asyncio.Event()

    async def events() -> AsyncIterator[bytes]:
        try:
            yield b"retry: 2000\n\n"
            sent.set()
            while True:
                await asyncio.sleep(0.05)
                yield b": ping\n\n"
        finally:
            closed.set()

    async def handler(request: Request) -> Response | EventStream:
        return EventStream(events())

    server = await serve_http("127.0.0.1:0", handler, name="web")
    try:
        host, _, port = server.address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"retry: 2000"), 5.0)
        assert b"text/event-stream" in head
        await asyncio.wait_for(sent.wait(), 5.0)
        writer.close()
        await asyncio.wait_for(closed.wait(), 5.0)  # the generator's cleanup ran
    finally:
        await server.close()


@run
async def test_close_ends_open_streams_and_stops_listening() -> None:
    closed = asyncio.Event()

    async def forever() -> AsyncIterator[bytes]:
        try:
            while True:
                yield b": ping\n\n"
                await asyncio.sleep(0.05)
        finally:
            closed.set()

    async def handler(request: Request) -> Response | EventStream:
        return EventStream(forever())

    server = await serve_http("127.0.0.1:0", handler, name="web")
    host, _, port = server.address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(reader.readuntil(b": ping"), 5.0)
    await asyncio.wait_for(server.close(), 5.0)
    assert closed.is_set()
    writer.close()
    with pytest.raises(OSError):
        await asyncio.open_connection(host, int(port))


@run
async def test_a_port_in_use_is_one_clear_error() -> None:
    server = await serve_http("127.0.0.1:0", echo, name="metrics")
    try:
        with pytest.raises(GpuqError, match=r"cannot listen on .*metrics_listen"):
            await serve_http(server.address, echo, name="metrics")
    finally:
        await server.close()


@run
async def test_one_client_cannot_hold_every_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unauthenticated, MAX_ANONYMOUS connections per address being answered: another is
    closed unanswered (waiting ones would be displaced: tests/unit/test_web_limits.py)."""
    monkeypatch.setattr(connection_guard, "MAX_ANONYMOUS", 3)
    go = asyncio.Event()

    async def slow(request: Request) -> Response | EventStream:
        await go.wait()
        return Response(200, b"late")

    server = await serve_http("127.0.0.1:0", slow, name="web")
    try:
        host, _, port = server.address.rpartition(":")
        held = [await asyncio.open_connection(host, int(port)) for _ in range(3)]
        for _, held_writer in held:
            held_writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await wait_until(lambda: all(not g.waiting for g in server.connections.guards.values()))
        reader, writer = await asyncio.open_connection(host, int(port))
        assert await asyncio.wait_for(reader.read(10), 5.0) == b""  # closed unanswered
        writer.close()
        go.set()
        for held_reader, held_writer in held:
            assert (await asyncio.wait_for(held_reader.readuntil(b"late"), 5.0)).startswith(
                b"HTTP/1.1 200"
            )
            held_writer.close()
        # once they are answered, the client is served again
        status, body = await asyncio.to_thread(fetch, server.address, "GET", "/again")
        assert (status, body) == (200, b"late")
    finally:
        await server.close()


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)


@run
async def test_text_is_gzipped_for_clients_that_take_it() -> None:
    text = ('gpuq_jobs{state="pending"} 1\n' * 200).encode()

    async def handler(request: Request) -> Response | EventStream:
        if request.path == "/small":
            return Response(200, b"tiny")
        if request.path == "/png":
            return Response(200, b"\x89PNG" * 1000, "image/png")
        return Response(200, text, "text/plain; version=0.0.4")

    def get(path: str, accept: str | None) -> tuple[bytes, dict[str, str]]:
        host, _, port = server.address.rpartition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request("GET", path, headers={"Accept-Encoding": accept} if accept else {})
            reply = conn.getresponse()
            return reply.read(), {k.lower(): v for k, v in reply.getheaders()}
        finally:
            conn.close()

    server = await serve_http("127.0.0.1:0", handler, name="metrics")
    try:
        body, headers = await asyncio.to_thread(get, "/metrics", "gzip, deflate")
        assert headers["content-encoding"] == "gzip" and headers["vary"] == "accept-encoding"
        assert gzip.decompress(body) == text and len(body) < len(text) / 5
        for refused in (None, "identity", "gzip;q=0", "br"):
            body, headers = await asyncio.to_thread(get, "/metrics", refused)
            assert body == text and "content-encoding" not in headers, refused
        body, headers = await asyncio.to_thread(get, "/small", "gzip")
        assert body == b"tiny" and "content-encoding" not in headers
        body, headers = await asyncio.to_thread(get, "/png", "gzip")
        assert "content-encoding" not in headers and "vary" not in headers
    finally:
        await server.close()


def address_of(server: Any) -> tuple[str, int]:
    host, _, port = server.address.rpartition(":")
    return host, int(port)


async def read_all(reader: asyncio.StreamReader, timeout: float = 5.0) -> bytes:
    """Everything until the server closes the connection."""
    return await asyncio.wait_for(reader.read(), timeout)


@run
async def test_a_slow_loris_is_cut_off_while_its_bytes_still_trickle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HEAD_TIMEOUT bounds the whole first head, not the gap between two of its bytes."""
    monkeypatch.setattr(connection_guard, "HEAD_TIMEOUT", 0.5)
    server = await serve_http("127.0.0.1:0", echo, name="web")
    try:
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection(*address_of(server))
        started = loop.time()
        writer.write(b"GET / HTTP/1.1\r\n")
        closed_at = None
        for i in range(100):  # a header line every 50 ms: 5 s if it were let through
            await asyncio.sleep(0.05)
            if reader.at_eof() or writer.is_closing():
                break
            try:
                writer.write(f"X-{i}: y\r\n".encode())
                await writer.drain()
            except ConnectionError:
                break
            with contextlib.suppress(TimeoutError):
                if await asyncio.wait_for(reader.read(1), 0.001) == b"":
                    break
        closed_at = loop.time() - started
        assert await read_all(reader) == b""  # unanswered
        assert 0.4 < closed_at < 2.0, closed_at
        writer.close()
    finally:
        await server.close()


@run
async def test_a_body_that_never_comes_whole_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_endpoint, "REQUEST_TIMEOUT", 0.3)
    server = await serve_http("127.0.0.1:0", echo, name="web")
    try:
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection(*address_of(server))
        started = loop.time()
        writer.write(b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        assert await read_all(reader) == b""
        assert loop.time() - started < 3.0
        writer.close()
    finally:
        await server.close()


@run
async def test_a_kept_alive_connection_idle_too_long_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http_endpoint, "IDLE_TIMEOUT", 0.5)
    server = await serve_http("127.0.0.1:0", echo, name="web")
    try:
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection(*address_of(server))
        writer.write(b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"GET /1 []" in await asyncio.wait_for(reader.readuntil(b"GET /1 [] 0"), 5.0)
        answered = loop.time()
        assert await read_all(reader) == b""
        assert 0.3 < loop.time() - answered < 3.0
        writer.close()
    finally:
        await server.close()


@run
async def test_a_header_block_is_bounded_however_it_comes() -> None:
    """16 KiB of request head: a 20 KiB block of small headers is refused (431) whether it
    comes in one write or in pieces, first on a connection or after a kept-alive request; a
    15 KiB one is served."""
    fields = b"".join(b"X-%d: %s\r\n" % (i, b"v" * 1000) for i in range(20))  # 20 KiB
    head = b"GET /h HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n"
    server = await serve_http("127.0.0.1:0", echo, name="web")
    try:
        reply = await asyncio.to_thread(raw, server.address, head)
        assert status_of(reply) == 431
        reader, writer = await asyncio.open_connection(*address_of(server))
        for start in range(0, 17000, 1000):  # no end of head yet: cut once past 16 KiB
            writer.write(head[start : start + 1000])
            await asyncio.sleep(0.01)
        assert status_of(await read_all(reader)) == 431
        writer.close()
        kept = b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\n" + head
        reply = await asyncio.to_thread(raw, server.address, kept)
        assert reply.startswith(b"HTTP/1.1 200") and reply.count(b"HTTP/1.") == 2, reply[:300]
        assert b"HTTP/1.1 431" in reply
        small = b"GET /s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + fields[:15000] + b"\r\n"
        small = small[: small.rindex(b"\r\n") + 2] + b"\r\n"
        reply = await asyncio.to_thread(raw, server.address, small)
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    finally:
        await server.close()


@run
async def test_a_body_is_bounded() -> None:
    """64 KiB of body: exactly that is served; 70 KiB is refused (413) whether announced by
    Content-Length or sent chunked."""
    server = await serve_http("127.0.0.1:0", echo, name="web")
    try:
        status, body = await asyncio.to_thread(fetch, server.address, "POST", "/p", b"x" * 65536)
        assert (status, body) == (200, b"POST /p [] 65536")
        status, _ = await asyncio.to_thread(fetch, server.address, "POST", "/p", b"x" * 71680)
        assert status == 413
        chunks = b"".join(b"%x\r\n%s\r\n" % (8192, b"y" * 8192) for _ in range(9)) + b"0\r\n\r\n"
        chunked = b"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks
        reply = await asyncio.to_thread(raw, server.address, chunked)
        assert status_of(reply) == 413
        # a malformed chunk size: aiohttp's parser answers 400 and closes
        malformed = b"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
        reply = await asyncio.to_thread(raw, server.address, malformed)
        assert status_of(reply) == 400
    finally:
        await server.close()


@run
async def test_the_port_holds_at_most_max_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection_guard, "MAX_CONNECTIONS", 3)
    server = await serve_http("127.0.0.1:0", echo, name="web")
    try:
        held = [await asyncio.open_connection(*address_of(server)) for _ in range(3)]
        reader, writer = await asyncio.open_connection(*address_of(server))
        assert await asyncio.wait_for(reader.read(10), 5.0) == b""  # closed unanswered
        writer.close()
        reader, writer = held[0]
        writer.write(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"GET /ok []" in await asyncio.wait_for(reader.readuntil(b"[] 0"), 5.0)
        for _, held_writer in held:
            held_writer.close()
    finally:
        await server.close()


@run
async def test_a_client_that_stops_reading_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """WRITE_TIMEOUT: an event stream to a client that reads nothing ends once the socket's
    buffers are full and stay full; the stream's cleanup runs."""
    monkeypatch.setattr(connection_guard, "WRITE_TIMEOUT", 0.5)
    closed = asyncio.Event()

    async def flood() -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"data: " + b"x" * 65536 + b"\n\n"
        finally:
            closed.set()

    async def handler(request: Request) -> Response | EventStream:
        return EventStream(flood())

    server = await serve_http("127.0.0.1:0", handler, name="web")
    try:
        sock = socket.create_connection(address_of(server))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(closed.wait(), 10.0)  # never read: dropped
        sock.close()
    finally:
        await server.close()


@run
async def test_close_lets_a_request_in_progress_finish_briefly() -> None:
    """Closing the port gives a request being handled CLOSE_GRACE, then ends it."""
    started = asyncio.Event()

    async def slow(request: Request) -> Response | EventStream:
        started.set()
        await asyncio.sleep(60)
        return Response(200, b"late")

    server = await serve_http("127.0.0.1:0", slow, name="web")
    reader, writer = await asyncio.open_connection(*address_of(server))
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(started.wait(), 5.0)
    loop = asyncio.get_running_loop()
    before = loop.time()
    await asyncio.wait_for(server.close(), 5.0)
    assert loop.time() - before < http_endpoint.CLOSE_GRACE + 2.0
    assert await read_all(reader) == b""
    writer.close()


@run
async def test_responses_name_no_framework_version() -> None:
    server = await serve_http("127.0.0.1:0", echo, name="web")
    try:
        reply = await asyncio.to_thread(
            raw, server.address, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        head = reply.split(b"\r\n\r\n")[0].lower()
        assert b"\r\nserver: gpuq" in head and b"aiohttp" not in head
    finally:
        await server.close()
