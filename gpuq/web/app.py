"""The web dashboard's server side ([coordinator] web_listen; README "Dashboard").

Pages (`/`, `/jobs/<id>`, `/users/<name>`, `/login`) are the one page in gpuq/web/static; its
script reads the JSON API below. Every API answer is what the gRPC servicer answers the same
user (its methods are called undecorated, with the session's Caller), as proto3 JSON, so the
dashboard shows exactly what `gpuq` would: who sees scripts, hidden names, who may cancel.

A browser signs in with a one-time link from `gpuq web`, or a pasted per-user token, and then
carries a session cookie (gpuq.web.sessions); admin rights are decided on each request.
Changes (cancel, hold, release, sign-in, sign-out) are POSTs that need the header `X-Gpuq: 1`
and, when the browser says where the page came from (Origin), this dashboard's own address:
with the SameSite=Strict cookie, another site cannot make a browser act. Every response
carries a strict Content-Security-Policy: the page runs only its own script and style.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import stat
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from gpuq.coordinator.access.authority import Authority, user_uid
from gpuq.coordinator.front.grpc_queue import MAX_STREAMS_PER_USER
from gpuq.coordinator.front.rpc_calls import StreamCount, error_status
from gpuq.coordinator.server import Coordinator
from gpuq.domain.limits import MAX_JOB_ID, check_text
from gpuq.errors import InvalidInput, NotFound, PermissionDenied
from gpuq.identity import Caller, Unauthenticated
from gpuq.v1 import queue_pb2
from gpuq.web.http import EventStream, Request, Response
from gpuq.web.sessions import (
    RateLimit,
    Session,
    Sessions,
    cookie_header,
    cookie_of,
    peer_host,
    token_stands,
    token_user,
)

MAX_SSE_EVENTS = 200  # events in one `jobs` message; beyond them, only how many more
log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)

STATIC = Path(__file__).parent / "static"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
SECURITY_HEADERS = [
    ("content-security-policy", CSP),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
]
JSON_TYPE = "application/json"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".woff2": "font/woff2",
    ".txt": "text/plain; charset=utf-8",
    ".map": "application/json",
}
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
}
LOG_TAIL = 64 * 1024  # bytes of a job's output the log view shows
FINISHED_LIMIT, FINISHED_MAX = 50, 500
NODES_CHECK = 2.0  # seconds between checks whether nodes changed (for `event: nodes`)
NODES_EVERY = 5.0  # seconds: `event: nodes` at least this often
PING_EVERY = 15.0  # seconds between `: ping` comments (and session checks)
_JOB_ID = re.compile(r"([0-9]{1,19})(?:_([0-9]{1,9}))?")
PLACEHOLDER = (
    b"<!doctype html><meta charset=utf-8><title>gpuq</title><p>The dashboard's page is not "
    b"installed (gpuq/web/static/index.html).</p>\n"
)


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class _Static:
    body: bytes
    etag: str
    mtime_ns: int
    size: int


class WebApp:
    """The dashboard: `handle` answers one request (never raises)."""

    def __init__(
        self,
        coordinator: Coordinator,
        streams: StreamCount,
        authority: Authority,
        web_url: str | None = None,
        static_dir: Path = STATIC,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.queries = coordinator.queries
        self.commands = coordinator.commands
        self.streams = streams  # the Watch RPC's: a user's streams count together
        self.authority = authority
        self.web_url = web_url
        self.static_dir = static_dir
        self.clock = clock
        self.sessions = Sessions(authority.key)
        self.login_limit = RateLimit()
        self.address = ""  # HOST:PORT as bound (set once it listens)
        self.secure = False  # served over TLS
        self._static: dict[str, _Static] = {}
        self._nodes_memo: tuple[float, tuple[Any, ...]] | None = None  # (loop time, state)

    # ---- sign-in links (the WebLogin RPC) ------------------------------------------------

    def base_url(self) -> str:
        if self.web_url:
            return self.web_url
        host, _, port = self.address.rpartition(":")
        if host in ("0.0.0.0", "[::]", ""):
            host = socket.getfqdn()
        return f"{'https' if self.secure else 'http'}://{host}:{port}"

    def login_link(self, caller: Caller, authorization: str | None) -> tuple[str, float]:
        """A one-time sign-in URL for `caller` and when it expires. The ticket is in the
        fragment: browsers never send it in a request or a Referer; the page posts it."""
        ticket, expires = self.sessions.ticket(caller.user, caller.uid, self.clock(), authorization)
        return f"{self.base_url()}/login#ticket={ticket}", expires

    # ---- requests ------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response | EventStream:
        api = request.path.startswith("/api/") or request.path == "/api"
        try:
            answer = await self._route(request)
        except HttpError as error:
            answer = _json(error.status, {"error": error.message})
        except Exception as error:
            rpc = error_status(error)  # logs an unexpected one
            status, message = HTTP_STATUS.get(rpc.code, 500), rpc.message
            if status == 500:
                message = "internal error (see the coordinator's log)"
            answer = _json(status, {"error": message})
        answer.headers.extend(SECURITY_HEADERS)
        if api and isinstance(answer, Response):
            answer.headers.append(("cache-control", "no-store"))
        return answer

    async def _route(self, request: Request) -> Response | EventStream:
        parts = request.path.split("/")[1:]
        method = request.method
        if parts and parts[0] == "api":
            return await self._api(request, parts[1:])
        if parts == ["static", parts[-1]] and len(parts) == 2:
            _method(method, "GET", "HEAD")
            return self._static_file(parts[1], request)
        if (
            parts in ([""], ["login"])
            or (len(parts) == 2 and parts[0] == "jobs" and _JOB_ID.fullmatch(parts[1]))
            or (len(parts) == 2 and parts[0] == "users" and parts[1])
        ):
            _method(method, "GET", "HEAD")
            return self._page(request)
        raise HttpError(404, "not found")

    # ---- pages and static files ----------------------------------------------------------

    def _page(self, request: Request) -> Response:
        try:
            return self._static_file("index.html", request, revalidate=True)
        except HttpError:
            return Response(200, PLACEHOLDER, TYPES[".html"], [("cache-control", "no-store")])

    def _static_file(self, name: str, request: Request, revalidate: bool = False) -> Response:
        if not name or "/" in name or name.startswith(".") or "\0" in name:
            raise HttpError(404, "not found")
        try:
            names = os.listdir(self.static_dir)
        except OSError:
            names = []
        if name not in names:
            raise HttpError(404, "not found")
        path = self.static_dir / name
        try:
            info = path.lstat()
            if not stat.S_ISREG(info.st_mode):
                raise HttpError(404, "not found")
            kept = self._static.get(name)
            if kept is None or (kept.mtime_ns, kept.size) != (info.st_mtime_ns, info.st_size):
                body = path.read_bytes()
                etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
                kept = self._static[name] = _Static(body, etag, info.st_mtime_ns, info.st_size)
        except OSError:
            raise HttpError(404, "not found") from None
        content_type = TYPES.get(Path(name).suffix.lower(), "application/octet-stream")
        headers = [
            ("etag", kept.etag),
            ("cache-control", "no-cache" if revalidate else "public, max-age=300, must-revalidate"),
        ]
        if request.headers.get("if-none-match") == kept.etag:
            return Response(304, b"", content_type, headers)
        return Response(200, kept.body, content_type, headers)

    # ---- the API -------------------------------------------------------------------------

    async def _api(self, request: Request, parts: list[str]) -> Response | EventStream:
        method = request.method
        if method == "POST":
            self._check_csrf(request)
        if parts == ["login"]:
            _method(method, "POST")
            return await self._login(request)
        if parts == ["logout"]:
            _method(method, "POST")
            return self._logout(request)
        _, caller = self._caller(request)
        if parts == ["me"]:
            _method(method, "GET")
            return _json(200, {"user": caller.user, "admin": caller.admin})
        if parts == ["nodes"]:
            _method(method, "GET")
            return _reply(await self._rpc("ListNodes", queue_pb2.ListNodesRequest(), caller))
        if parts == ["events"]:
            _method(method, "GET")
            return self._events(request, caller)
        if parts == ["jobs"]:
            _method(method, "GET")
            listing = await self._rpc("ListJobs", _list_request(request.query), caller)
            return _reply(_lean(listing, *listing.jobs))
        if len(parts) >= 2 and parts[0] == "jobs":
            job_text = parts[1]
            if not _JOB_ID.fullmatch(job_text):
                raise HttpError(404, f"no job {job_text[:40]}")
            rest = parts[2:]
            if not rest:
                _method(method, "GET")
                detail = await self._rpc("GetJob", _get_request(job_text), caller)
                return _reply(_lean(detail, detail.job))
            if rest == ["series"]:
                _method(method, "GET")
                return _json(200, await self._series(job_text, caller))
            if rest == ["log"]:
                _method(method, "GET")
                return _json(200, await self._log(job_text, request.query, caller))
            if rest in (["cancel"], ["hold"], ["release"]):
                _method(method, "POST")
                selection = queue_pb2.JobSelection(job_ids=[job_text])
                return _reply(await self._rpc(rest[0].capitalize(), selection, caller))
        if len(parts) == 2 and parts[0] == "users":
            _method(method, "GET")
            return _json(200, await self._user(parts[1], caller))
        raise HttpError(404, "not found")

    def _check_csrf(self, request: Request) -> None:
        if request.headers.get("x-gpuq") != "1":
            raise HttpError(403, "a change needs the header X-Gpuq: 1 (the dashboard sends it)")
        origin = request.headers.get("origin")
        if origin is not None:
            host = request.headers.get("host", "").lower()
            own = {f"{'https' if request.secure else 'http'}://{host}"} if host else set()
            if self.web_url:  # behind a proxy: the address browsers use
                parsed = urllib.parse.urlsplit(self.web_url)
                own.add(f"{parsed.scheme}://{parsed.netloc.lower()}")
            if origin.lower().rstrip("/") not in own:
                raise HttpError(403, "a change from another site's page (Origin) is refused")

    def _secure(self, request: Request) -> bool:
        """Whether the cookie is marked Secure: TLS here, or an https web_url (a proxy)."""
        return request.secure or (self.web_url or "").startswith("https://")

    async def _login(self, request: Request) -> Response:
        now = self.clock()
        peer = peer_host(request.peer)
        if self.login_limit.blocked(peer, now):
            raise HttpError(429, "too many failed sign-ins; wait a minute")
        try:
            body = json.loads(request.body or b"{}")
        except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past Python's
            raise HttpError(400, 'expected JSON: {"ticket": ...} or {"token": ...}') from None
        if not isinstance(body, dict):
            raise HttpError(400, "expected a JSON object")
        ticket, token = body.get("ticket"), body.get("token")
        try:
            if isinstance(ticket, str) and ticket:
                session = self.sessions.redeem(ticket, now)
            elif isinstance(token, str) and token:
                user, digest = token_user(self.authority.tokens, token)
                uid = user_uid(user)
                session = self.sessions.session(user, uid, "token", digest, now)
            else:
                raise HttpError(400, 'expected {"ticket": ...} or {"token": "gpuqt_..."}')
            caller = self._served(session)
        except Unauthenticated as exc:
            self.login_limit.failed(peer, now)
            raise HttpError(401, str(exc)) from None
        value = self.sessions.cookie_value(session)
        log.info("dashboard: %s signed in by %s from %s", caller.user, session.how, request.peer)
        response = _json(200, {"user": caller.user, "admin": caller.admin})
        response.headers.append(("set-cookie", cookie_header(value, self._secure(request))))
        return response

    def _logout(self, request: Request) -> Response:
        value = cookie_of(request.headers.get("cookie"))
        if value is not None:
            with contextlib.suppress(Unauthenticated):
                self.sessions.end(self.sessions.check(value, self.clock()), self.clock())
        response = _json(200, {})
        response.headers.append(("set-cookie", cookie_header("", self._secure(request), 0)))
        return response

    def _caller(self, request: Request) -> tuple[Session, Caller]:
        value = cookie_of(request.headers.get("cookie"))
        if value is None:
            raise HttpError(401, "not signed in")
        try:
            session = self.sessions.check(value, self.clock())
            return session, self._served(session)
        except Unauthenticated as exc:
            raise HttpError(401, str(exc)) from None

    def _served(self, session: Session) -> Caller:
        """The session's Caller, as the coordinator serves it now (admin decided now)."""
        if not token_stands(self.authority.tokens, session):
            raise Unauthenticated("the token this session was opened with was revoked")
        authority = self.authority
        if authority.own_uid != 0 and session.user != authority.own_user:
            raise Unauthenticated(
                f"this coordinator runs as {authority.own_user} and serves only "
                f"{authority.own_user}"
            )
        admin = authority.is_admin(session.user, session.uid)
        return Caller(session.user, session.uid, admin=admin, how=f"web {session.how}")

    async def _rpc(self, name: str, request: Any, caller: Caller) -> Any:
        """The front door's answer to `caller`, as the RPC `name` answers it."""
        queries = self.queries
        if name == "GetJob":
            return await queries.get_job(caller, request)
        if name == "ListJobs":
            return await queries.list_jobs(caller, request)
        if name == "ListNodes":
            return queries.list_nodes()
        if name == "Report":
            return await queries.report(request)
        if name in ("Cancel", "Hold", "Release"):
            return await self.commands.act(name, caller, request)
        raise NotFound(f"no such call {name}")

    async def _series(self, job_text: str, caller: Caller) -> dict[str, Any]:
        detail = await self._rpc("GetJob", _get_request(job_text), caller)
        job_id = int(detail.job.id)
        points = await self.queries.series(job_id)
        return {"points": [{"at": p.at, "gpu_mem": p.gpu_mem, "util": p.util} for p in points]}

    async def _log(self, job_text: str, query: dict[str, str], caller: Caller) -> dict[str, Any]:
        stream = query.get("stream", "stdout")
        if stream not in ("stdout", "stderr"):
            raise InvalidInput("stream", stream, "expected stdout or stderr")
        detail = await self._rpc("GetJob", _get_request(job_text), caller)
        job = detail.job
        if job.user != caller.user and not caller.admin:
            raise PermissionDenied(f"job {job.id} is {job.user}'s: only its owner or an admin")
        path = job.stdout_path if stream == "stdout" else job.stderr_path
        if not path:
            raise NotFound(f"job {job.id} has no {stream} file")
        uid = user_uid(job.user)
        if uid is None:
            raise PermissionDenied(f"{job.user} has no uid on the coordinator's machine")
        try:
            return await asyncio.to_thread(read_tail, path, uid)
        except NotFound as exc:  # not yet written, or on a node's own disk: not an error
            return {"path": path, "text": "", "size": 0, "truncated": False, "missing": str(exc)}

    async def _user(self, name: str, caller: Caller) -> dict[str, Any]:
        check_text("user", name, 64)
        report = await self._rpc("Report", queue_pb2.ReportRequest(user=name), caller)
        row = next((r for r in report.rows if r.user == name), None)
        usage, factor = self.queries.fair_share(name)
        listing = await self._rpc(
            "ListJobs", queue_pb2.ListJobsRequest(user=name, with_pending_info=True), caller
        )
        running_gpus = self.queries.running_gpus(name)
        return {
            "user": name,
            "report": _dict(row) if row is not None else None,
            "fairshare": {
                "usage": usage,
                "factor": factor,
            },
            "running_gpus": running_gpus,
            "jobs": _dict(_lean(listing, *listing.jobs)).get("jobs", []),
        }

    # ---- live updates --------------------------------------------------------------------

    def _events(self, request: Request, caller: Caller) -> EventStream:
        streams = self.streams
        if streams.open[caller.user] >= streams.limit:
            raise HttpError(
                429, f"{caller.user} has {MAX_STREAMS_PER_USER} streams open already (the most)"
            )
        value = cookie_of(request.headers.get("cookie")) or ""
        return EventStream(self._event_feed(caller.user, value))

    async def _event_feed(self, user: str, cookie: str) -> AsyncIterator[bytes]:
        with self.streams.opened(user) as refused:
            if refused:
                yield f"event: refused\ndata: {json.dumps({'error': refused})}\n\n".encode()
                return
            yield b"retry: 2000\n\n"
            queue: asyncio.Queue[list[Any]] = asyncio.Queue()

            async def follow() -> None:
                async for batch in self.queries.watch(()):
                    queue.put_nowait(list(batch.events))

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
                        events = [_dict(e) for e in batch[:MAX_SSE_EVENTS]]
                        more = max(0, len(batch) - MAX_SSE_EVENTS)
                        yield _sse("jobs", {"events": events, "more": more})
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
                            self._served(self.sessions.check(cookie, self.clock()))
                        except Unauthenticated as exc:
                            yield _sse("signed-out", {"error": str(exc)})
                            return
                        yield b": ping\n\n"
            finally:
                watching.cancel()
                with contextlib.suppress(BaseException):
                    await watching

    def _nodes_state(self) -> tuple[Any, ...]:
        """What `gpuq nodes` shows that heartbeats change (not when each was seen). Every open
        stream asks every NODES_CHECK seconds: one look serves them all. A heartbeat replaces
        a node's usage messages, never changes them, so they are kept and compared by value."""
        now = asyncio.get_running_loop().time()
        if self._nodes_memo is not None and now - self._nodes_memo[0] < NODES_CHECK / 2:
            return self._nodes_memo[1]
        state = self.queries.nodes_state()
        self._nodes_memo = (now, state)
        return state


def read_tail(path: str, uid: int) -> dict[str, Any]:
    """The last LOG_TAIL bytes of a job's output file: only a regular file owned by the job's
    user (`uid`). The coordinator may be root and the path is the user's, so the path is first
    opened O_PATH (nothing is opened for reading: no FIFO blocks, no device sees an open), its
    final symlink not followed; only a regular file of that user is then opened for reading,
    through /proc/self/fd, so the file read is the one checked."""
    if not path.startswith("/"):
        raise NotFound(f"{path}: not an absolute path")
    refused = f"{path}: not readable from the coordinator (not a regular file of the job's user)"
    try:
        handle = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotFound(f"{path}: no such file on the coordinator's machine") from None
    except OSError:
        raise PermissionDenied(refused) from None
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
            raise PermissionDenied(refused)
        try:
            fd = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            raise PermissionDenied(refused) from None
    finally:
        os.close(handle)
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - LOG_TAIL)
        data = os.pread(fd, LOG_TAIL, start)
    finally:
        os.close(fd)
    return {
        "path": path,
        "text": data.decode("utf-8", errors="replace"),
        "size": size,
        "truncated": start > 0,
    }


def _lean(reply: M, *jobs: Any) -> M:
    """`reply` without its jobs' lists of array indices (up to 100,000 each, 700 KB as JSON):
    a page shows an array by its tasks' summary (array_tasks) and counts."""
    for job in jobs:
        if job.spec.HasField("array"):
            job.spec.array.ClearField("indices")
    return reply


def _method(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise HttpError(405, f"method {method[:16]} is not allowed here")


def _dict(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


def _json(status: int, body: Any) -> Response:
    return Response(status, json.dumps(body, separators=(",", ":")).encode(), JSON_TYPE)


def _reply(message: Message) -> Response:
    return _json(200, _dict(message))


def _sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _get_request(job_text: str) -> queue_pb2.GetJobRequest:
    found = _JOB_ID.fullmatch(job_text)
    if found is None:
        raise NotFound(f"no job {job_text[:40]}")
    job_id = int(found.group(1))
    if not 1 <= job_id <= MAX_JOB_ID:
        raise NotFound(f"no job {job_id}")
    task = int(found.group(2)) if found.group(2) is not None else None
    return queue_pb2.GetJobRequest(job_id=job_id, task=task)


def _list_request(query: dict[str, str]) -> queue_pb2.ListJobsRequest:
    finished = query.get("finished", "0")
    if finished not in ("0", "1", ""):
        raise InvalidInput("finished", finished, "expected 0 or 1")
    user = query.get("user", "")
    check_text("user", user, 64)
    limit_text = query.get("limit", "")
    if limit_text and not limit_text.isdigit():
        raise InvalidInput("limit", limit_text, "expected a number of jobs")
    if finished == "1":
        limit = min(int(limit_text or FINISHED_LIMIT), FINISHED_MAX) or FINISHED_LIMIT
        return queue_pb2.ListJobsRequest(finished=True, user=user, limit=limit)
    limit = min(int(limit_text), 100_000) if limit_text else 0
    return queue_pb2.ListJobsRequest(user=user, limit=limit, with_pending_info=True)
