"""The web dashboard's server side ([coordinator] web_listen; README "Dashboard").

Pages (`/`, `/queue`, `/history`, `/jobs/<id>`, `/users/<name>`, `/login`) are the one page
in gpuq/web/static; its script reads the JSON API below. Every API answer is what the gRPC
servicer answers the same user (gpuq.web.queue_access), as proto3 JSON
(gpuq.web.dashboard_api), so the dashboard shows exactly what `gpuq` would: who sees
scripts, hidden names, who may cancel.

A browser signs in with a one-time link from `gpuq web`, or a pasted per-user token, and then
carries a session cookie (gpuq.web.sessions); admin rights are decided on each request.
Changes (cancel, hold, release, sign-in, sign-out) are POSTs that need the header `X-Gpuq: 1`
and, when the browser says where the page came from (Origin), this dashboard's own address:
with the SameSite=Strict cookie, another site cannot make a browser act. Every response
carries a strict Content-Security-Policy: the page runs only its own script and style.

The order of the checks is part of the contract: a POST to the API is checked for CSRF first,
then (but for sign-in and sign-out) the session, then the route and its method.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuq.identity import Caller, Unauthenticated
from gpuq.web import dashboard_api as api
from gpuq.web.connection_guard import client_address
from gpuq.web.event_feed import EventFeed
from gpuq.web.http_types import EventStream, Request, Response
from gpuq.web.queue_access import QueueAccess
from gpuq.web.sessions import (
    Sessions,
    SignInLimits,
    cookie_header,
    cookie_of,
    peer_host,
    sign_in_subject,
)
from gpuq.web.static_files import STATIC, StaticFiles

log = logging.getLogger(__name__)

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


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Dashboard:
    """The dashboard: `handle` answers one request (never raises)."""

    def __init__(
        self,
        access: QueueAccess,
        web_url: str | None = None,
        static_dir: Path = STATIC,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.access = access
        self.web_url = web_url
        self.static = StaticFiles(static_dir)
        self.clock = clock
        self.sessions = Sessions(access.signing_key)
        self.login_limit = SignInLimits()
        self.feed = EventFeed(access, self.sessions, clock)
        self._revoked_loaded = False  # what the store kept is in self.sessions
        self.address = ""  # HOST:PORT as bound (set once it listens)
        self.secure = False  # served over TLS

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
        is_api = request.path.startswith("/api/") or request.path == "/api"
        try:
            answer = await self._route(request)
        except HttpError as error:
            answer = _json(error.status, {"error": error.message})
        except Exception as error:
            status, message = self.access.http_error(error)  # logs an unexpected one
            answer = _json(status, {"error": message})
        answer.headers.extend(SECURITY_HEADERS)
        if is_api and isinstance(answer, Response):
            answer.headers.append(("cache-control", "no-store"))
        return answer

    async def _route(self, request: Request) -> Response | EventStream:
        parts = request.path.split("/")[1:]
        method = request.method
        if parts and parts[0] == "api":
            return await self._api(request, parts[1:])
        if parts == ["static", parts[-1]] and len(parts) == 2:
            _method(method, "GET", "HEAD")
            found = self.static.file(parts[1], request.headers.get("if-none-match"))
            if found is None:
                raise HttpError(404, "not found")
            return found
        if (
            parts in ([""], ["login"], ["queue"], ["history"])
            or (len(parts) == 2 and parts[0] == "jobs" and api.JOB_ID.fullmatch(parts[1]))
            or (len(parts) == 2 and parts[0] == "users" and parts[1])
        ):
            _method(method, "GET", "HEAD")
            return self.static.page(request.headers.get("if-none-match"))
        raise HttpError(404, "not found")

    # ---- the API -------------------------------------------------------------------------

    async def _api(self, request: Request, parts: list[str]) -> Response | EventStream:
        method = request.method
        if method == "POST":
            self._check_csrf(request)
        await self._load_revoked()
        if parts == ["login"]:
            _method(method, "POST")
            return await self._login(request)
        if parts == ["logout"]:
            _method(method, "POST")
            return await self._logout(request)
        caller = self._caller(request)
        access = self.access
        if parts == ["me"]:
            _method(method, "GET")
            return _json(200, {"user": caller.user, "admin": caller.admin})
        if parts == ["nodes"]:
            _method(method, "GET")
            return _json(200, api.proto_json(await access.nodes(caller)))
        if parts == ["events"]:
            _method(method, "GET")
            return self._events(request, caller)
        if parts == ["history"]:
            _method(method, "GET")
            return _json(200, await api.history(access, caller, request.query))
        if parts == ["queue"]:
            _method(method, "GET")
            return Response(200, await api.queue(access, caller, request.query), JSON_TYPE)
        if parts == ["jobs"]:
            _method(method, "GET")
            return Response(200, await api.jobs(access, caller, request.query), JSON_TYPE)
        if len(parts) >= 2 and parts[0] == "jobs":
            job_text = parts[1]
            if not api.JOB_ID.fullmatch(job_text):
                raise HttpError(404, f"no job {job_text[:40]}")
            rest = parts[2:]
            if not rest:
                _method(method, "GET")
                return _json(200, await api.job(access, caller, job_text))
            if rest == ["series"]:
                _method(method, "GET")
                return _json(200, await api.series(access, caller, job_text))
            if rest == ["log"]:
                _method(method, "GET")
                return _json(200, await api.log(access, caller, job_text, request.query))
            changes = {"cancel": access.cancel, "hold": access.hold, "release": access.release}
            if len(rest) == 1 and rest[0] in changes:
                _method(method, "POST")
                return _json(200, api.proto_json(await changes[rest[0]](caller, job_text)))
        if len(parts) == 2 and parts[0] == "users":
            _method(method, "GET")
            return _json(200, await api.user(access, caller, parts[1], self.clock()))
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

    def session_user(self, headers: dict[str, str]) -> str | None:
        """The user of a request's valid session cookie (signature, expiry and sign-out
        checked), for the connection caps (gpuq.web.connection_guard); None: none."""
        value = cookie_of(headers.get("cookie"))
        if value is None:
            return None
        try:
            return self.sessions.check(value, self.clock()).user
        except Unauthenticated:
            return None

    async def _login(self, request: Request) -> Response:
        """Sign in with a ticket or a token, within the limits of sessions.SignInLimits (per
        credential and address; one user's failures never refuse another's valid one)."""
        now = self.clock()
        address = client_address(peer_host(request.peer))
        try:
            body = json.loads(request.body or b"{}")
        except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past Python's
            raise HttpError(400, 'expected JSON: {"ticket": ...} or {"token": ...}') from None
        if not isinstance(body, dict):
            raise HttpError(400, "expected a JSON object")
        ticket, token = body.get("ticket"), body.get("token")
        subject = sign_in_subject(self.sessions, ticket, token)
        if self.login_limit.blocked(address, subject, now):
            raise HttpError(429, "too many failed sign-ins with this; wait a minute")
        try:
            if isinstance(ticket, str) and ticket:
                session = self.sessions.redeem(ticket, now)
            elif isinstance(token, str) and token:
                user, uid, digest = self.access.token_owner(token)
                session = self.sessions.session(user, uid, "token", digest, now)
            else:
                raise HttpError(400, 'expected {"ticket": ...} or {"token": "gpuqt_..."}')
            caller = self.access.caller(session)
        except Unauthenticated as exc:
            if self.login_limit.failed(address, subject, now):
                raise HttpError(429, f"too many failed sign-ins; wait a minute ({exc})") from None
            raise HttpError(401, str(exc)) from None
        await self._keep_revoked()  # the ticket stays used, restart or not
        value = self.sessions.cookie_value(session)
        log.info("dashboard: %s signed in by %s from %s", caller.user, session.how, request.peer)
        response = _json(200, {"user": caller.user, "admin": caller.admin})
        response.headers.append(("set-cookie", cookie_header(value, self._secure(request))))
        return response

    async def _logout(self, request: Request) -> Response:
        value = cookie_of(request.headers.get("cookie"))
        if value is not None:
            with contextlib.suppress(Unauthenticated):
                self.sessions.end(self.sessions.check(value, self.clock()), self.clock())
            try:
                await self._keep_revoked()  # the session stays ended, restart or not
            except Exception as error:  # refused here; the store takes it with the next one
                log.warning("dashboard: a sign-out is not kept in the job store yet: %s", error)
        response = _json(200, {})
        response.headers.append(("set-cookie", cookie_header("", self._secure(request), 0)))
        return response

    async def _load_revoked(self) -> None:
        """Before the first check: the tickets used and sessions ended before a restart."""
        if not self._revoked_loaded:
            self.sessions.load_revoked(await self.access.revoked_web_credentials(self.clock()))
            self._revoked_loaded = True

    async def _keep_revoked(self) -> None:
        """The store keeps what was revoked (a failure leaves it for the next write)."""
        revoked = self.sessions.unkept()
        if revoked:
            await self.access.keep_revoked(revoked, self.clock())
            self.sessions.kept(revoked)

    def _caller(self, request: Request) -> Caller:
        value = cookie_of(request.headers.get("cookie"))
        if value is None:
            raise HttpError(401, "not signed in")
        try:
            return self.access.caller(self.sessions.check(value, self.clock()))
        except Unauthenticated as exc:
            raise HttpError(401, str(exc)) from None

    def _events(self, request: Request, caller: Caller) -> EventStream:
        limit = self.access.stream_limit
        if self.access.streams_open(caller.user) >= limit:
            raise HttpError(429, f"{caller.user} has {limit} streams open already (the most)")
        value = cookie_of(request.headers.get("cookie")) or ""
        return EventStream(self.feed.stream(caller, value))


def _method(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise HttpError(405, f"method {method[:16]} is not allowed here")


def _json(status: int, body: Any) -> Response:
    return Response(status, json.dumps(body, separators=(",", ":")).encode(), JSON_TYPE)
