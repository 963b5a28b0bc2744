"""gpuq.web.http_endpoint and gpuq.web.connection_guard: the metrics and dashboard ports' HTTP
server (aiohttp, with the limits it lacks added around it), over real sockets."""

from __future__ import annotations

import asyncio
import functools
import gzip
import http.client
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from gpuq.errors import GpuqError
from gpuq.web import connection_guard
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
        huge_header = b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 40000 + b"\r\n\r\n"
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
    monkeypatch.setattr(connection_guard, "REQUEST_TIMEOUT", 0.3)
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
    monkeypatch.setattr(connection_guard, "MAX_PER_HOST", 3)
    server = await serve_http("127.0.0.1:0", echo, name="web")
    try:
        host, _, port = server.address.rpartition(":")
        held = [await asyncio.open_connection(host, int(port)) for _ in range(3)]
        reader, writer = await asyncio.open_connection(host, int(port))
        assert await asyncio.wait_for(reader.read(10), 5.0) == b""  # closed unanswered
        writer.close()
        for _, held_writer in held:
            held_writer.close()
        # once they are gone, the client is served again
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while True:
            try:
                status, _ = await asyncio.to_thread(fetch, server.address, "GET", "/again")
                break
            except (ConnectionError, http.client.HTTPException):
                assert loop.time() < deadline
                await asyncio.sleep(0.05)
        assert status == 200
    finally:
        await server.close()


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
