"""Who a dashboard request comes from: one-time sign-in tickets, session cookies, rate limits.

A browser signs in with a ticket `gpuq web` got for its caller (the WebLogin RPC), or with a
per-user token pasted into the sign-in page. Either gives it a session cookie. Tickets and
cookies are signed (HMAC-SHA256) with the coordinator's key (GPUQ_HOME/auth.key), each kind under
its own label, so neither passes for the other nor for a handshake credential (gpuq.identity):

    ticket:  gw1t.<payload>.<mac>   payload: base64url JSON {u, i, d, e, n}
    session: gw1s.<payload>.<mac>   payload: base64url JSON {u, i, h, d, e, n}

u: the user, i: the uid (None: unknown), h: how the browser signed in ("ticket" or "token"),
d: the first 16 hex digits of the token's digest when a token stands behind the session (the
session ends when that token is revoked), e: expiry (Unix seconds), n: a random nonce. A
ticket is good for TICKET_TTL seconds and once: its nonce is remembered until it expires. A
session ends at its expiry, at logout (its nonce is remembered until then), or when its
token is revoked. Nothing here does I/O; time comes from the caller. What is remembered is
also kept in the job store, so that a restart forgets none of it: the dashboard takes each
revocation (`unkept`, a digest of the kind and nonce and its expiry) to the store, and
gives a new Sessions what the store kept (`load_revoked`) before it checks anything.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import hmac
import json
import secrets
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuq.identity import TOKEN_PREFIX, Unauthenticated, token_digest

TICKET_TTL = 60.0  # seconds a sign-in link is good for
SESSION_TTL = 12 * 3600.0  # seconds a dashboard session lasts
TICKET_LABEL = "gw1t"
SESSION_LABEL = "gw1s"
DIGEST_PART = 16  # hex digits of a token's digest a session names
MAX_SIGNED = 1024  # characters of a ticket or cookie value; longer is refused unread
MAX_REMEMBERED = 100_000  # used tickets and ended sessions remembered at once
COOKIE = "gpuq_session"
LOGIN_ATTEMPTS = 10  # failed sign-ins per (client address, subject) per LOGIN_WINDOW
ADDRESS_ATTEMPTS = 100  # failed sign-ins per client address per LOGIN_WINDOW: then 429s
LOGIN_WINDOW = 60.0
MAX_PEERS = 10_000  # keys whose attempts are counted at once (per kind)
TOKEN_SUBJECT = len(TOKEN_PREFIX) + 8  # characters of a token that name it for the limits


@dataclass(frozen=True, slots=True)
class Session:
    user: str
    uid: int | None
    how: str  # "ticket" or "token"
    digest: str  # DIGEST_PART hex digits of the token behind it, or ""
    expires: float
    nonce: str


def _mac(key: bytes, label: str, payload: str) -> str:
    return hmac.new(key, f"{label}.{payload}".encode(), hashlib.sha256).hexdigest()


def _sign(key: bytes, label: str, fields: dict[str, Any]) -> str:
    raw = json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()
    payload = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return f"{label}.{payload}.{_mac(key, label, payload)}"


def _open(key: bytes, label: str, text: str, what: str) -> dict[str, Any]:
    """The fields of a value this key signed under `label`; Unauthenticated otherwise."""
    parts = text.split(".")
    if len(text) > MAX_SIGNED or len(parts) != 3 or parts[0] != label:
        raise Unauthenticated(f"not a gpuq {what}")
    payload, mac = parts[1], parts[2]
    if not hmac.compare_digest(_mac(key, label, payload), mac):
        raise Unauthenticated(f"a {what} this coordinator did not sign (restarted with a new key?)")
    try:
        fields = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, binascii.Error):
        raise Unauthenticated(f"a malformed {what}") from None
    if not isinstance(fields, dict):
        raise Unauthenticated(f"a malformed {what}")
    return fields


def credential_digest(label: str, nonce: str) -> str:
    """What is remembered of a used ticket or an ended session: no credential, and no nonce
    that could be replayed."""
    return hashlib.sha256(f"{label}.{nonce}".encode()).hexdigest()


def _user_fields(fields: dict[str, Any], what: str) -> tuple[str, int | None, str, float, str]:
    user, uid, digest = fields.get("u"), fields.get("i"), fields.get("d", "")
    expires, nonce = fields.get("e"), fields.get("n")
    if (
        not isinstance(user, str)
        or not user
        or not (uid is None or (isinstance(uid, int) and not isinstance(uid, bool)))
        or not isinstance(digest, str)
        or not isinstance(expires, int | float)
        or not isinstance(nonce, str)
    ):
        raise Unauthenticated(f"a malformed {what}")
    return user, uid, digest, float(expires), nonce


class Remembered:
    """Nonces until their expiry (used tickets, ended sessions), bounded."""

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self.limit = limit
        self._nonces: set[str] = set()
        self._expiries: list[tuple[float, str]] = []  # a heap: the first to expire first

    def __contains__(self, nonce: str) -> bool:
        return nonce in self._nonces

    def add(self, nonce: str, until: float, now: float) -> None:
        self.purge(now)
        if len(self._nonces) >= self.limit:
            # full: refused, never forgotten early (a used ticket must stay used)
            raise Unauthenticated("too many sign-ins at once; try again in a minute")
        self._nonces.add(nonce)
        heapq.heappush(self._expiries, (until, nonce))

    def keep(self, nonce: str, until: float) -> None:
        """Remember what the store kept (never refused: a used ticket must stay used)."""
        if nonce not in self._nonces:
            self._nonces.add(nonce)
            heapq.heappush(self._expiries, (until, nonce))

    def purge(self, now: float) -> None:
        while self._expiries and self._expiries[0][0] < now:
            _, nonce = heapq.heappop(self._expiries)
            self._nonces.discard(nonce)


class Sessions:
    """Tickets and session cookies signed with `key`."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.used_tickets = Remembered()
        self.ended_sessions = Remembered()
        self._to_keep: dict[str, float] = {}  # revoked since take_revoked: digest -> expiry

    # ---- what the store keeps ------------------------------------------------------------

    def load_revoked(self, kept: Mapping[str, float]) -> None:
        """What the store kept (digest -> expiry): tickets used and sessions ended before."""
        for digest, until in kept.items():
            self.used_tickets.keep(digest, until)
            self.ended_sessions.keep(digest, until)

    def unkept(self) -> dict[str, float]:
        """The revocations the store does not keep yet (digest -> expiry)."""
        return dict(self._to_keep)

    def kept(self, revoked: Mapping[str, float]) -> None:
        """The store keeps `revoked` now."""
        for digest in revoked:
            self._to_keep.pop(digest, None)

    # ---- tickets -----------------------------------------------------------------------------

    def ticket(
        self, user: str, uid: int | None, now: float, authorization: str | None = None
    ) -> tuple[str, float]:
        """A one-time ticket for `user` and when it expires. `authorization`: the metadata of
        the call that asked for it; a token there stands behind the session too."""
        expires = now + TICKET_TTL
        fields = {
            "u": user,
            "i": uid,
            "d": token_part(authorization),
            "e": expires,
            "n": secrets.token_urlsafe(12),
        }
        return _sign(self.key, TICKET_LABEL, fields), expires

    def redeem(self, ticket: str, now: float) -> Session:
        """The session a ticket opens; Unauthenticated when it is not one of ours, expired or
        was used already."""
        user, uid, digest, expires, nonce = _user_fields(
            _open(self.key, TICKET_LABEL, ticket, "sign-in link"), "sign-in link"
        )
        if expires < now:
            raise Unauthenticated("the sign-in link expired; run gpuq web again")
        self.used_tickets.purge(now)
        used = credential_digest(TICKET_LABEL, nonce)
        if used in self.used_tickets:
            raise Unauthenticated("the sign-in link was used already; run gpuq web again")
        self.used_tickets.add(used, expires, now)
        self._to_keep[used] = expires
        return self.session(user, uid, "ticket", digest, now)

    def ticket_nonce(self, ticket: str) -> str | None:
        """The nonce of a ticket this key signed (expired, used or not); None for anything
        else. It names the ticket for the sign-in limits: nobody else can make one."""
        try:
            fields = _open(self.key, TICKET_LABEL, ticket, "sign-in link")
            return _user_fields(fields, "sign-in link")[4]
        except Unauthenticated:
            return None

    # ---- sessions ----------------------------------------------------------------------------

    def session(self, user: str, uid: int | None, how: str, digest: str, now: float) -> Session:
        return Session(user, uid, how, digest, now + SESSION_TTL, secrets.token_urlsafe(12))

    def cookie_value(self, session: Session) -> str:
        fields = {
            "u": session.user,
            "i": session.uid,
            "h": session.how,
            "d": session.digest,
            "e": session.expires,
            "n": session.nonce,
        }
        return _sign(self.key, SESSION_LABEL, fields)

    def check(self, value: str, now: float) -> Session:
        """The session a cookie value names, signature and expiry and logout checked (whether
        its token still stands is the caller's to check: `token_stands`)."""
        fields = _open(self.key, SESSION_LABEL, value, "session")
        user, uid, digest, expires, nonce = _user_fields(fields, "session")
        how = fields.get("h")
        if how not in ("ticket", "token"):
            raise Unauthenticated("a malformed session")
        if expires < now:
            raise Unauthenticated("the session expired; sign in again")
        if credential_digest(SESSION_LABEL, nonce) in self.ended_sessions:
            raise Unauthenticated("signed out")
        return Session(user, uid, how, digest, expires, nonce)

    def end(self, session: Session, now: float) -> None:
        """Logout: the cookie is refused from now on, whoever still holds it."""
        ended = credential_digest(SESSION_LABEL, session.nonce)
        if ended not in self.ended_sessions:
            self.ended_sessions.add(ended, session.expires, now)
            self._to_keep[ended] = session.expires


def token_part(authorization: str | None) -> str:
    """The part of a token's digest a session keeps, for a `Token ...` authorization; ''."""
    scheme, _, value = (authorization or "").partition(" ")
    if scheme != "Token" or not value:
        return ""
    return token_digest(value)[:DIGEST_PART]


def token_user(tokens: dict[str, str], token: str) -> tuple[str, str]:
    """(user, digest part) of a pasted per-user token; Unauthenticated when not a live one."""
    token = token.strip()
    if not token.startswith(TOKEN_PREFIX):
        raise Unauthenticated(f"not a gpuq token (they start with {TOKEN_PREFIX})")
    if len(token) > 256:
        raise Unauthenticated("not a gpuq token (too long)")
    digest = token_digest(token)
    user = tokens.get(digest)
    if user is None:
        raise Unauthenticated("an unknown or revoked gpuq token")
    return user, digest[:DIGEST_PART]


def token_stands(tokens: dict[str, str], session: Session) -> bool:
    """A session with a token behind it lasts while that token is not revoked."""
    if not session.digest:
        return True
    return any(d.startswith(session.digest) and user == session.user for d, user in tokens.items())


def cookie_header(value: str, secure: bool, max_age: int = int(SESSION_TTL)) -> str:
    """Set-Cookie for a session (max_age 0: remove it)."""
    parts = [f"{COOKIE}={value}", "Path=/", "HttpOnly", "SameSite=Strict", f"Max-Age={max_age}"]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def cookie_of(header: str | None) -> str | None:
    """The session cookie's value in a Cookie header."""
    for part in (header or "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE and value:
            return value
    return None


class RateLimit:
    """At most `limit` failed sign-ins per key within `window` seconds (a sliding window):
    enough to stop guessing, while signing in again and again still works. At most `peers`
    keys are counted at once; past that a new key is neither counted nor blocked (a full table
    must not lock anyone out)."""

    def __init__(
        self, limit: int = LOGIN_ATTEMPTS, window: float = LOGIN_WINDOW, peers: int = MAX_PEERS
    ) -> None:
        self.limit = limit
        self.window = window
        self.peers = peers
        self._seen: dict[str, deque[float]] = {}

    def blocked(self, key: str, now: float) -> bool:
        """`key` failed `limit` times within the window."""
        times = self._seen.get(key)
        if times is None:
            return False
        while times and times[0] <= now - self.window:
            times.popleft()
        return len(times) >= self.limit

    def failed(self, key: str, now: float) -> None:
        if key not in self._seen and not self._room(now):
            return
        self._seen.setdefault(key, deque()).append(now)

    def _room(self, now: float) -> bool:
        """Room to count one more peer, after forgetting those with no failure in the window."""
        if len(self._seen) >= self.peers:
            self._seen = {k: t for k, t in self._seen.items() if t and t[-1] > now - self.window}
        return len(self._seen) < self.peers


class SignInLimits:
    """Failed dashboard sign-ins, counted per (client address, subject) and per client address
    (gpuq.web.connection_guard.client_address: all of loopback is one address).

    The rule. A sign-in's subject is the credential it presents: a ticket this coordinator
    signed is "ticket NONCE" (that one link); any other ticket is "ticket ?"; a token is "token"
    and its first TOKEN_SUBJECT characters.

    - A sign-in is refused unchecked (429) when its own (address, subject) failed LOGIN_ATTEMPTS
      times within LOGIN_WINDOW. Only that same credential fills that count: a signed ticket
      cannot be made without auth.key and a valid one has never failed (a failure means it
      expired or was used), and nobody knows another user's token's first characters. So one
      user's failures never refuse another's valid ticket or token, on any address.
    - Past ADDRESS_ATTEMPTS failures from an address within the window, a failing sign-in from it
      is answered 429 rather than 401 (the client is told to stop), but a valid ticket or token
      is still taken: on a shared address (loopback, a proxy) a refusal of everything would let
      one user lock everyone else out.

    Why that is enough: a ticket is signed (HMAC-SHA256) and a token is 256 random bits, so no
    number of guesses finds one; what the limits stop is one client trying the same credential
    again and again (a used link, a token with a wrong tail), and the noise. Memory is bounded
    (MAX_PEERS keys of each kind; RateLimit).
    """

    def __init__(
        self,
        attempts: int = LOGIN_ATTEMPTS,
        address_attempts: int = ADDRESS_ATTEMPTS,
        window: float = LOGIN_WINDOW,
        peers: int = MAX_PEERS,
    ) -> None:
        self.per_subject = RateLimit(attempts, window, peers)
        self.per_address = RateLimit(address_attempts, window, peers)

    def blocked(self, address: str, subject: str, now: float) -> bool:
        """This credential failed too often from this address: refuse it unchecked."""
        return self.per_subject.blocked(f"{address} {subject}", now)

    def failed(self, address: str, subject: str, now: float) -> bool:
        """Count a failure; True when the address is past its own limit (answer 429)."""
        self.per_subject.failed(f"{address} {subject}", now)
        self.per_address.failed(address, now)
        return self.per_address.blocked(address, now)


def sign_in_subject(sessions: Sessions, ticket: object, token: object) -> str:
    """The subject a sign-in's credential is counted under (SignInLimits)."""
    if isinstance(ticket, str) and ticket:
        nonce = sessions.ticket_nonce(ticket)
        return f"ticket {nonce}" if nonce is not None else "ticket ?"
    if isinstance(token, str) and token:
        return f"token {token.strip()[:TOKEN_SUBJECT]}"
    return "?"


def peer_host(peer: str) -> str:
    """The host of a "host:port" peer (attempts are counted per host)."""
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() else peer
