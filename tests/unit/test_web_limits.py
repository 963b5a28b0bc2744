"""Per person, not per address (issue 23): the dashboard's connection caps
(gpuq.web.connection_guard.Connections) over real sockets from several loopback source
addresses, 127.0.0.2 to 127.0.0.9, which any local user can bind."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from gpuq.web import connection_guard
from gpuq.web.connection_guard import LOOPBACK, anonymous, client_address, of_user
from gpuq.web.http_endpoint import HttpEndpoint, serve_http
from gpuq.web.http_types import EventStream, Request, Response

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]
SOURCES = [f"127.0.0.{i}" for i in range(2, 10)]


def run(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return wrapper


async def hello(request: Request) -> Response | EventStream:
    return Response(200, b"hello " + request.headers.get("cookie", "-").encode())


def session_user(headers: dict[str, str]) -> str | None:
    """The stand-in for Dashboard.session_user: `cookie: s=USER` is USER's valid session."""
    cookie = headers.get("cookie", "")
    return cookie.removeprefix("s=") if cookie.startswith("s=") else None


async def connect(server: HttpEndpoint, source: str) -> Stream:
    host, _, port = server.address.rpartition(":")
    return await asyncio.open_connection(host, int(port), local_addr=(source, 0))


async def get(stream: Stream, cookie: str | None = None) -> bytes:
    """One kept-alive request on `stream`: its whole answer, or b"" when closed unanswered."""
    reader, writer = stream
    extra = f"Cookie: {cookie}\r\n" if cookie else ""
    writer.write(f"GET / HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
    except asyncio.IncompleteReadError:
        return b""
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head + await asyncio.wait_for(reader.readexactly(length), 5.0)


async def closed(stream: Stream) -> bool:
    """Whether the server closed `stream` (it reads EOF within a short while)."""
    try:
        return await asyncio.wait_for(stream[0].read(1), 2.0) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)


def test_all_of_loopback_is_one_client_address() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "127.0.0.9", "127.255.0.3", "::1", "[::1]"):
        assert client_address(host) == LOOPBACK, host
    assert client_address("::ffff:127.0.0.5") == LOOPBACK
    assert client_address("::ffff:10.0.0.1") == "10.0.0.1" == client_address("10.0.0.1")
    assert client_address("fe80::1%eth0") == "fe80::1"
    assert client_address("?") == "?"
    assert client_address("10.0.0.1") != client_address("10.0.0.2")


@run
async def test_127_0_0_2_and_127_0_0_9_share_one_address_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Binding other loopback addresses no longer buys more slots: eight connections that send
    nothing, one from each of 127.0.0.2 to .9, hold MAX_ANONYMOUS (4) between them, the
    newest; the older ones were displaced."""
    monkeypatch.setattr(connection_guard, "MAX_ANONYMOUS", 4)
    server = await serve_http("127.0.0.1:0", hello, name="web", owner_of=session_user)
    try:
        streams = []
        for source in SOURCES:
            streams.append(await connect(server, source))
            await wait_until(lambda: len(server.connections.guards) >= min(len(streams), 4))
        assert dict(server.connections.counts) == {anonymous(LOOPBACK): 4}
        assert len(server.connections.guards) == 4
        assert [await closed(stream) for stream in streams[:4]] == [True] * 4
        for stream in streams[4:]:  # the newest are still served
            assert (await get(stream)).startswith(b"HTTP/1.1 200")
    finally:
        await server.close()


@run
async def test_an_unauthenticated_flood_does_not_stop_a_signed_in_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One local user, without signing in, opens connections from every 127.x address: ones
    that send nothing, ones kept alive after an unauthenticated request, ones trickling a
    body. They hold at most MAX_ANONYMOUS of MAX_CONNECTIONS slots; alice's and bob's signed-in
    requests, and a new unauthenticated one, are still answered."""
    monkeypatch.setattr(connection_guard, "MAX_ANONYMOUS", 4)
    monkeypatch.setattr(connection_guard, "MAX_CONNECTIONS", 12)
    server = await serve_http("127.0.0.1:0", hello, name="web", owner_of=session_user)
    try:
        flood: list[Stream] = []
        for round_ in range(4):
            for source in SOURCES:
                stream = await connect(server, source)
                flood.append(stream)
                if round_ == 1:
                    await get(stream)  # answered, then kept alive
                elif round_ == 2:
                    stream[1].write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\nab")
        await wait_until(lambda: server.connections.counts[anonymous(LOOPBACK)] <= 4)
        assert len(server.connections.guards) <= 4
        alice = await connect(server, "127.0.0.5")
        assert (await get(alice, "s=alice")).startswith(b"HTTP/1.1 200")
        bob = await connect(server, "127.0.0.1")
        assert (await get(bob, "s=bob")).startswith(b"HTTP/1.1 200")
        # their connections left the address's budget for their own
        assert server.connections.counts[of_user("alice")] == 1
        assert server.connections.counts[of_user("bob")] == 1
        # the flood goes on: alice's kept-alive connection is hers, never displaced
        for source in SOURCES:
            flood.append(await connect(server, source))
        assert (await get(alice, "s=alice")).endswith(b"hello s=alice")
        # and someone not signed in gets in too (displacing the flood's oldest)
        assert (await get(await connect(server, "127.0.0.3"))).endswith(b"hello -")
        assert server.connections.counts[anonymous(LOOPBACK)] <= 4
    finally:
        await server.close()


@run
async def test_a_signed_in_user_is_held_to_their_own_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The address-wide limit for a single abuser becomes a per-user one once signed in:
    MAX_PER_USER connections of alice's from any loopback addresses, then 429 and closed;
    others are unaffected."""
    monkeypatch.setattr(connection_guard, "MAX_PER_USER", 2)
    monkeypatch.setattr(connection_guard, "MAX_ANONYMOUS", 2)
    server = await serve_http("127.0.0.1:0", hello, name="web", owner_of=session_user)
    try:
        first, second = await connect(server, "127.0.0.2"), await connect(server, "127.0.0.9")
        assert (await get(first, "s=alice")).startswith(b"HTTP/1.1 200")
        assert (await get(second, "s=alice")).startswith(b"HTTP/1.1 200")
        third = await connect(server, "127.0.0.4")
        refused = await get(third, "s=alice")
        assert refused.startswith(b"HTTP/1.1 429") and b"too many connections" in refused
        assert await closed(third)
        assert (await get(await connect(server, "127.0.0.4"), "s=bob")).startswith(b"HTTP/1.1 200")
        assert (await get(first, "s=alice")).startswith(b"HTTP/1.1 200")  # hers still work
        first[1].close()
        await wait_until(lambda: server.connections.counts[of_user("alice")] == 1)
        again = await connect(server, "127.0.0.4")
        assert (await get(again, "s=alice")).startswith(b"HTTP/1.1 200")
    finally:
        await server.close()
