"""Pure parts of the dashboard's server (gpuq.output_tail, gpuq.web.dashboard_api): reading a
job's output file as root would, and the listing parameters. The routes themselves run in
tests/e2e/test_web_e2e.py."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuq.coordinator.front.rpc_calls import StreamCount
from gpuq.domain.model import JobEvent
from gpuq.domain.states import JobState
from gpuq.errors import InvalidInput, NotFound, PermissionDenied
from gpuq.identity import Caller, Unauthenticated
from gpuq.output_tail import LOG_TAIL, read_tail
from gpuq.v1 import queue_pb2
from gpuq.web import event_feed
from gpuq.web.dashboard import CSP, Dashboard
from gpuq.web.dashboard_api import job_request, listing_request
from gpuq.web.http_types import EventStream, Request, Response
from gpuq.web.queue_access import QueueAccess
from gpuq.web.sessions import (
    ADDRESS_ATTEMPTS,
    LOGIN_ATTEMPTS,
    LOGIN_WINDOW,
    SESSION_TTL,
    Session,
)


def test_tail_of_a_long_file(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_bytes(b"a" * 10 + b"\xff" + b"b" * LOG_TAIL)
    tail = read_tail(str(path), os.geteuid())
    assert tail["truncated"] and tail["size"] == LOG_TAIL + 11
    assert tail["text"] == "b" * LOG_TAIL
    path.write_bytes(b"ok \xff\n")
    tail = read_tail(str(path), os.geteuid())
    assert tail == {"path": str(path), "text": "ok \ufffd\n", "size": 5, "truncated": False}


def test_tail_refuses_what_is_not_the_users_regular_file(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_text("secret\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(PermissionDenied, match="not readable from the coordinator"):
        read_tail(str(link), os.geteuid())
    with pytest.raises(PermissionDenied):
        read_tail(str(target), os.geteuid() + 1)  # another user's file
    with pytest.raises(PermissionDenied):
        read_tail(str(tmp_path), os.geteuid())  # a folder
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = threading.Event()

    def read() -> None:
        with pytest.raises(PermissionDenied):
            read_tail(str(fifo), os.geteuid())
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(5), "a FIFO must be refused at once, never waited on"
    with pytest.raises(NotFound):
        read_tail(str(tmp_path / "missing"), os.geteuid())
    with pytest.raises(NotFound):
        read_tail("relative/path", os.geteuid())


def test_listing_parameters() -> None:
    assert listing_request({}).with_pending_info and not listing_request({}).finished
    finished = listing_request({"finished": "1"})
    assert finished.finished and finished.limit == 50
    assert listing_request({"finished": "1", "limit": "100000"}).limit == 500
    assert listing_request({"user": "alice"}).user == "alice"
    for bad in ({"finished": "yes"}, {"limit": "-1"}, {"user": "x" * 65}):
        with pytest.raises(InvalidInput):
            listing_request(bad)
    assert (job_request("12").job_id, job_request("12").HasField("task")) == (12, False)
    assert (job_request("12_3").job_id, job_request("12_3").task) == (12, 3)
    with pytest.raises(NotFound):
        job_request("0")


# ---- the dashboard's rules, over a stand-in for the coordinator (QueueAccess) ----------------

KEY = b"k" * 32
TOKEN = "gpuqt_" + "a" * 40


class StubAccess:
    """What gpuq.web.queue_access.QueueAccess offers, without a coordinator: one user, alice,
    with one token; nodes and jobs lists are empty; changes are recorded."""

    signing_key = KEY
    stream_limit = 2

    def __init__(self) -> None:
        self.revoked = False
        self.changes: list[tuple[str, str, str]] = []
        self.events: asyncio.Queue[list[JobEvent]] = asyncio.Queue()
        self.streams = StreamCount(self.stream_limit)
        self.kept: dict[str, float] = {}  # the store's revoked web credentials
        self.feed_callers: list[Caller] = []  # whom job_events served (what each may see)

    async def revoked_web_credentials(self, now: float) -> dict[str, float]:
        return {d: at for d, at in self.kept.items() if at >= now}

    async def keep_revoked(self, revoked: dict[str, float], now: float) -> None:
        self.kept.update(revoked)

    def token_owner(self, token: str) -> tuple[str, int | None, str]:
        if token != TOKEN or self.revoked:
            raise Unauthenticated("an unknown or revoked gpuq token")
        return "alice", 1001, "d" * 16

    def caller(self, session: Session) -> Caller:
        if session.digest and self.revoked:
            raise Unauthenticated("the token this session was opened with was revoked")
        return Caller(session.user, session.uid, admin=False, how=f"web {session.how}")

    async def nodes(self, caller: Caller) -> queue_pb2.ListNodesReply:
        return queue_pb2.ListNodesReply()

    async def cancel(self, caller: Caller, job_id: str) -> queue_pb2.ActionReply:
        self.changes.append(("cancel", caller.user, job_id))
        return queue_pb2.ActionReply()

    async def hold(self, caller: Caller, job_id: str) -> queue_pb2.ActionReply:
        self.changes.append(("hold", caller.user, job_id))
        return queue_pb2.ActionReply()

    async def release(self, caller: Caller, job_id: str) -> queue_pb2.ActionReply:
        self.changes.append(("release", caller.user, job_id))
        return queue_pb2.ActionReply()

    def streams_open(self, user: str) -> int:
        return self.streams.open[user]

    def stream_slot(self, user: str) -> Any:
        return self.streams.opened(user)

    def nodes_state(self) -> tuple[Any, ...]:
        return ()

    async def job_events(self, caller: Caller) -> AsyncIterator[list[JobEvent]]:
        self.feed_callers.append(caller)
        while True:
            yield await self.events.get()

    http_error = staticmethod(QueueAccess.http_error)
    check_reads_log = staticmethod(QueueAccess.check_reads_log)


def request(
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    secure: bool = False,
    peer: str = "10.0.0.1:5555",
) -> Request:
    return Request(method, path, {}, {"host": "dash:8080", **(headers or {})}, body, peer, secure)


def answer(dashboard: Dashboard, req: Request) -> Response:
    result = asyncio.run(dashboard.handle(req))
    assert isinstance(result, Response)
    return result


def headers_of(response: Response) -> dict[str, str]:
    return {name: value for name, value in response.headers}


def signed_in(dashboard: Dashboard, secure: bool = False) -> tuple[str, Response]:
    """A session cookie for alice (by her token), and the sign-in's response."""
    body = json.dumps({"token": TOKEN}).encode()
    response = answer(dashboard, request("POST", "/api/login", CHANGE, body, secure))
    assert response.status == 200, response.body
    cookie = headers_of(response)["set-cookie"].split(";")[0]
    return cookie, response


CHANGE = {"x-gpuq": "1"}


def test_every_answer_carries_the_security_headers() -> None:
    dashboard = Dashboard(StubAccess(), static_dir=Path(__file__).parents[2] / "gpuq/web/static")
    cookie, _ = signed_in(dashboard)
    for req in (
        request("GET", "/"),
        request("GET", "/static/app.css"),
        request("GET", "/nothing"),
        request("POST", "/"),
        request("GET", "/api/me"),
        request("GET", "/api/me", {"cookie": cookie}),
        request("POST", "/api/logout"),
    ):
        headers = headers_of(answer(dashboard, req))
        assert headers["content-security-policy"] == CSP, req.path
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "no-referrer"
        assert headers["x-frame-options"] == "DENY"
        assert (headers.get("cache-control") == "no-store") == req.path.startswith("/api/")
    stream = asyncio.run(dashboard.handle(request("GET", "/api/events", {"cookie": cookie})))
    assert isinstance(stream, EventStream)
    assert dict(stream.headers)["content-security-policy"] == CSP


def test_checks_come_in_order_csrf_then_session_then_route() -> None:
    dashboard = Dashboard(StubAccess())
    cookie, _ = signed_in(dashboard)
    cases = [
        (request("POST", "/api/me"), 403),  # a change without the header: before anything
        (request("POST", "/api/nothing"), 403),
        (request("POST", "/api/login", body=b'{"token": "x"}'), 403),
        (request("DELETE", "/api/me"), 401),  # then who asks
        (request("GET", "/api/nothing"), 401),
        (request("GET", "/api/login"), 405),  # sign-in needs no session
        (request("GET", "/api/nothing", {"cookie": cookie}), 404),  # then the route
        (request("POST", "/api/me", {"cookie": cookie, **CHANGE}), 405),
        (request("GET", "/api/jobs/abc", {"cookie": cookie}), 404),
        (request("GET", "/api/me", {"cookie": cookie}), 200),
    ]
    for req, status in cases:
        response = answer(dashboard, req)
        assert response.status == status, (req.method, req.path, response.body)
        assert "error" in json.loads(response.body) or status == 200


def test_a_change_needs_the_header_and_this_sites_origin() -> None:
    access = StubAccess()
    dashboard = Dashboard(access, web_url="https://gpuq.example.org")
    cookie, _ = signed_in(dashboard)
    path = "/api/jobs/12/cancel"
    missing = answer(dashboard, request("POST", path, {"cookie": cookie}))
    assert missing.status == 403 and b"X-Gpuq" in missing.body
    for origin in ("http://evil.example", "https://dash:8080", "http://gpuq.example.org"):
        refused = answer(
            dashboard, request("POST", path, {"cookie": cookie, **CHANGE, "origin": origin})
        )
        assert refused.status == 403 and b"Origin" in refused.body, origin
    assert access.changes == []
    for origin in (None, "http://dash:8080", "HTTP://DASH:8080/", "https://gpuq.example.org"):
        headers = {"cookie": cookie, **CHANGE, **({"origin": origin} if origin else {})}
        assert answer(dashboard, request("POST", path, headers)).status == 200, origin
    assert access.changes == [("cancel", "alice", "12")] * 4
    for change in ("hold", "release"):
        sent = request("POST", f"/api/jobs/12_3/{change}", {"cookie": cookie, **CHANGE})
        assert answer(dashboard, sent).status == 200
    assert access.changes[-2:] == [("hold", "alice", "12_3"), ("release", "alice", "12_3")]
    secure = request(
        "POST", path, {"cookie": cookie, **CHANGE, "origin": "https://dash:8080"}, secure=True
    )
    assert answer(dashboard, secure).status == 200


def test_the_session_cookie_is_httponly_strict_and_secure_over_tls() -> None:
    for web_url, secure, marked in (
        (None, False, False),
        (None, True, True),
        ("https://gpuq.example.org", False, True),  # TLS ends at a proxy
        ("http://gpuq.example.org", False, False),
    ):
        dashboard = Dashboard(StubAccess(), web_url=web_url)
        _, response = signed_in(dashboard, secure)
        flags = headers_of(response)["set-cookie"].split("; ")
        assert flags[0].startswith("gpuq_session=gw1s.")
        assert {"Path=/", "HttpOnly", "SameSite=Strict", f"Max-Age={int(SESSION_TTL)}"} <= set(
            flags
        )
        assert ("Secure" in flags) == marked, (web_url, secure)


def test_failed_sign_ins_are_limited_per_credential_and_address() -> None:
    """A credential that failed LOGIN_ATTEMPTS times from an address is refused there unchecked
    (a token is named by its first characters: a wrong tail counts against it)."""
    now = [1_700_000_000.0]
    dashboard = Dashboard(StubAccess(), clock=lambda: now[0])
    wrong = json.dumps({"token": TOKEN[:-4] + "bbbb"}).encode()
    right = json.dumps({"token": TOKEN}).encode()
    for _ in range(LOGIN_ATTEMPTS):
        assert answer(dashboard, request("POST", "/api/login", CHANGE, wrong)).status == 401
    blocked = answer(dashboard, request("POST", "/api/login", CHANGE, right))
    assert blocked.status == 429 and b"too many failed sign-ins" in blocked.body
    other = request("POST", "/api/login", CHANGE, right, peer="10.0.0.2:1")
    assert answer(dashboard, other).status == 200
    now[0] += LOGIN_WINDOW + 1
    assert answer(dashboard, request("POST", "/api/login", CHANGE, right)).status == 200


def test_another_users_failed_sign_ins_never_refuse_a_valid_ticket_or_token() -> None:
    """Issue 23: ten bad sign-ins by one local user gave another's valid ticket a 429. Now bob's
    failures from 127.0.0.2 (forged and used tickets, wrong tokens, past the address's own
    limit) leave alice's ticket and token from 127.0.0.9 (the same address) good; bob's own
    used ticket and his further failures are refused."""
    now = [1_700_000_000.0]
    dashboard = Dashboard(StubAccess(), clock=lambda: now[0])
    bob = "127.0.0.2:4000"
    used, _ = dashboard.sessions.ticket("bob", 1002, now[0])
    assert answer(dashboard, login({"ticket": used}, bob)).status == 200
    attempts = [{"ticket": used}, {"ticket": "gw1t.e30.00"}, {"token": "gpuqt_guess"}]
    attempts += [{"token": f"gpuqt_{i:08d}x"} for i in range(ADDRESS_ATTEMPTS)]
    statuses = [answer(dashboard, login(body, bob)).status for body in attempts]
    assert set(statuses[:LOGIN_ATTEMPTS]) == {401} and statuses[-1] == 429
    for _ in range(LOGIN_ATTEMPTS):
        answer(dashboard, login({"ticket": used}, bob))
    replay = answer(dashboard, login({"ticket": used}, bob))
    assert replay.status == 429 and b"with this" in replay.body  # refused unchecked
    for peer in ("127.0.0.9:5000", "[::1]:5000", "[::ffff:127.0.0.5]:5000", bob):
        ticket, _ = dashboard.sessions.ticket("alice", 1001, now[0])
        assert answer(dashboard, login({"ticket": ticket}, peer)).status == 200, peer
        assert answer(dashboard, login({"token": TOKEN}, peer)).status == 200, peer


def test_a_connection_counts_against_its_valid_sessions_user() -> None:
    """Dashboard.session_user names the user whose budget a request's connection counts
    against (gpuq.web.connection_guard): a valid session's, else nobody (the address's)."""
    dashboard = Dashboard(StubAccess())
    cookie, _ = signed_in(dashboard)
    assert dashboard.session_user({"cookie": cookie}) == "alice"
    assert dashboard.session_user({"cookie": "gpuq_session=gw1s.forged.00"}) is None
    assert dashboard.session_user({}) is None
    answer(dashboard, request("POST", "/api/logout", {**CHANGE, "cookie": cookie}))
    assert dashboard.session_user({"cookie": cookie}) is None  # signed out


def login(body: dict[str, str], peer: str) -> Request:
    return request("POST", "/api/login", CHANGE, json.dumps(body).encode(), peer=peer)


def test_an_event_stream_counts_against_the_users_streams_and_ends_when_signed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(event_feed, "PING_EVERY", 0.05)
    access = StubAccess()
    dashboard = Dashboard(access)
    cookie, _ = signed_in(dashboard)

    async def main() -> None:
        streams = []
        for _ in range(access.stream_limit):
            stream = await dashboard.handle(request("GET", "/api/events", {"cookie": cookie}))
            assert isinstance(stream, EventStream)
            assert await anext(stream.events) == b"retry: 2000\n\n"
            streams.append(stream)
        assert access.streams_open("alice") == access.stream_limit
        full = await dashboard.handle(request("GET", "/api/events", {"cookie": cookie}))
        assert isinstance(full, Response) and full.status == 429
        first = streams[0].events
        access.events.put_nowait([JobEvent(7, 1.0, JobState.PENDING, JobState.RUNNING, "")])
        message = await anext(first)
        assert message.startswith(b"event: jobs\ndata: ") and b'"job_id":"7"' in message
        # the feed's events are those its signed-in caller may see (hide_job_names)
        assert {c.user for c in access.feed_callers} == {"alice"}
        assert await anext(first) == b": ping\n\n"  # the session still stands
        await streams[1].events.aclose()  # a client that went away frees its slot
        assert access.streams_open("alice") == 1
        logout = request("POST", "/api/logout", {"cookie": cookie, **CHANGE})
        out = await dashboard.handle(logout)
        assert isinstance(out, Response) and out.status == 200
        while (message := await anext(first)) == b": ping\n\n":
            pass
        assert message.startswith(b"event: signed-out\ndata: ") and b"signed out" in message
        with pytest.raises(StopAsyncIteration):
            await anext(first)
        assert access.streams_open("alice") == 0

    asyncio.run(main())


def test_only_queue_access_reaches_into_the_coordinator() -> None:
    """The dashboard's one seam to the coordinator: pointing QueueAccess elsewhere is enough."""
    for path in sorted((Path(__file__).parents[2] / "gpuq" / "web").glob("*.py")):
        tree = ast.parse(path.read_text())
        names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        reached = {name for name in names if name.startswith("gpuq.coordinator")}
        assert not reached or path.name == "queue_access.py", (path.name, reached)


def test_sign_outs_and_used_tickets_outlive_a_restart() -> None:
    """What the store keeps (StubAccess.kept stands for it) a restarted dashboard refuses: a
    signed-out cookie, a used ticket. Without it the same key would take them again."""
    access = StubAccess()
    first = Dashboard(access)
    cookie, _ = signed_in(first)
    link, _ = first.login_link(Caller("alice", 1001, admin=False), None)
    body = json.dumps({"ticket": link.split("#ticket=")[1]}).encode()
    assert answer(first, request("POST", "/api/login", CHANGE, body)).status == 200
    out = answer(first, request("POST", "/api/logout", {"cookie": cookie, **CHANGE}))
    assert out.status == 200
    assert len(access.kept) == 2  # digests only: neither the cookie nor the ticket
    assert not any(part in cookie or part in link for part in access.kept)
    restarted = Dashboard(access)  # the same key (GPUQ_HOME/auth.key), its memory gone
    me = answer(restarted, request("GET", "/api/me", {"cookie": cookie}))
    assert me.status == 401 and b"signed out" in me.body, me.body
    again = answer(restarted, request("POST", "/api/login", CHANGE, body))
    assert again.status == 401 and b"used already" in again.body, again.body
    forgetful = Dashboard(StubAccess())  # a store that kept nothing: both would work again
    assert answer(forgetful, request("GET", "/api/me", {"cookie": cookie})).status == 200
    assert answer(forgetful, request("POST", "/api/login", CHANGE, body)).status == 200
