"""Dashboard sign-in tickets, session cookies and the sign-in rate limit (gpuq.web.sessions):
pure, with a fake clock."""

from __future__ import annotations

import base64
import json

import pytest

from gpuq.identity import Unauthenticated, sign_credential, token_digest
from gpuq.web.sessions import (
    SESSION_TTL,
    TICKET_TTL,
    RateLimit,
    Remembered,
    Sessions,
    SignInLimits,
    cookie_header,
    cookie_of,
    peer_host,
    sign_in_subject,
    token_part,
    token_stands,
    token_user,
)

KEY = b"k" * 32
NOW = 1_700_000_000.0


def test_ticket_opens_a_session_once() -> None:
    sessions = Sessions(KEY)
    ticket, expires = sessions.ticket("alice", 1001, NOW)
    assert expires == NOW + TICKET_TTL
    session = sessions.redeem(ticket, NOW + 5)
    assert (session.user, session.uid, session.how) == ("alice", 1001, "ticket")
    assert session.expires == NOW + 5 + SESSION_TTL
    with pytest.raises(Unauthenticated, match="used already"):
        sessions.redeem(ticket, NOW + 6)


def test_expired_ticket_is_refused() -> None:
    sessions = Sessions(KEY)
    ticket, _ = sessions.ticket("alice", 1001, NOW)
    with pytest.raises(Unauthenticated, match="expired"):
        sessions.redeem(ticket, NOW + TICKET_TTL + 1)


def _tamper(value: str, **changes: object) -> str:
    label, payload, mac = value.split(".")
    fields = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    fields.update(changes)
    raw = json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()
    return f"{label}.{base64.urlsafe_b64encode(raw).decode().rstrip('=')}.{mac}"


def test_tampered_or_foreign_values_are_refused() -> None:
    sessions = Sessions(KEY)
    ticket, _ = sessions.ticket("alice", 1001, NOW)
    with pytest.raises(Unauthenticated, match="did not sign"):
        sessions.redeem(_tamper(ticket, u="root", i=0), NOW)
    with pytest.raises(Unauthenticated, match="did not sign"):
        Sessions(b"x" * 32).redeem(ticket, NOW)
    # a ticket is not a cookie, a cookie is not a ticket, a handshake credential is neither
    with pytest.raises(Unauthenticated):
        sessions.check(ticket, NOW)
    cookie = sessions.cookie_value(sessions.session("alice", 1001, "ticket", "", NOW))
    with pytest.raises(Unauthenticated):
        sessions.redeem(cookie, NOW)
    with pytest.raises(Unauthenticated):
        sessions.check(sign_credential(KEY, 1001, NOW), NOW)
    for junk in ("", "gw1s", "gw1s..", "gw1s.@@.00", "x" * 5000):
        with pytest.raises(Unauthenticated):
            sessions.check(junk, NOW)


def test_session_cookie_round_trip_expiry_and_logout() -> None:
    sessions = Sessions(KEY)
    session = sessions.session("bob", None, "token", "abcd" * 4, NOW)
    value = sessions.cookie_value(session)
    assert sessions.check(value, NOW + 10) == session
    with pytest.raises(Unauthenticated, match="expired"):
        sessions.check(value, NOW + SESSION_TTL + 1)
    with pytest.raises(Unauthenticated, match="did not sign"):
        sessions.check(_tamper(value, u="root"), NOW)
    sessions.end(session, NOW + 20)
    with pytest.raises(Unauthenticated, match="signed out"):
        sessions.check(value, NOW + 21)
    # another session of the same user is not ended
    other = sessions.session("bob", None, "token", "abcd" * 4, NOW)
    assert sessions.check(sessions.cookie_value(other), NOW + 21) == other


def test_token_sessions_end_with_their_token() -> None:
    token = "gpuqt_" + "a" * 40
    tokens = {token_digest(token): "alice"}
    user, digest = token_user(tokens, token)
    assert user == "alice" and digest == token_digest(token)[:16]
    assert token_part(f"Token {token}") == digest and token_part("Bearer x") == ""
    session = Sessions(KEY).session(user, None, "token", digest, NOW)
    assert token_stands(tokens, session)
    tokens.clear()  # revoked
    assert not token_stands(tokens, session)
    ticket_session = Sessions(KEY).session("alice", 1, "ticket", "", NOW)
    assert token_stands(tokens, ticket_session)
    with pytest.raises(Unauthenticated, match="revoked"):
        token_user(tokens, token)
    with pytest.raises(Unauthenticated, match="not a gpuq token"):
        token_user(tokens, "hunter2")


def test_ticket_of_a_token_caller_carries_the_token() -> None:
    token = "gpuqt_" + "b" * 40
    sessions = Sessions(KEY)
    ticket, _ = sessions.ticket("alice", None, NOW, f"Token {token}")
    session = sessions.redeem(ticket, NOW)
    assert session.digest == token_digest(token)[:16]
    assert not token_stands({}, session)


def test_remembered_nonces_expire() -> None:
    remembered = Remembered(limit=3)
    remembered.add("a", NOW + 10, NOW)
    remembered.add("b", NOW + 100, NOW)
    assert "a" in remembered
    remembered.purge(NOW + 11)
    assert "a" not in remembered and "b" in remembered
    remembered.add("c", NOW + 100, NOW + 11)
    remembered.add("d", NOW + 100, NOW + 11)
    with pytest.raises(Unauthenticated, match="too many"):
        remembered.add("e", NOW + 100, NOW + 11)


def test_cookie_headers() -> None:
    header = cookie_header("v", secure=True)
    assert header.startswith("gpuq_session=v; ")
    for part in ("HttpOnly", "SameSite=Strict", "Path=/", f"Max-Age={int(SESSION_TTL)}", "Secure"):
        assert part in header.split("; ")
    assert "Secure" not in cookie_header("v", secure=False)
    assert cookie_of("a=b; gpuq_session=xyz; c=d") == "xyz"
    assert cookie_of("gpuq_sessionx=1") is None and cookie_of(None) is None


def test_failed_sign_ins_are_limited_per_peer() -> None:
    limit = RateLimit(limit=3, window=60.0, peers=2)
    for i in range(3):
        assert not limit.blocked("10.0.0.1", NOW + i)
        limit.failed("10.0.0.1", NOW + i)
    assert limit.blocked("10.0.0.1", NOW + 3)
    assert not limit.blocked("10.0.0.2", NOW + 3)
    limit.failed("10.0.0.2", NOW + 3)
    assert not limit.blocked("10.0.0.1", NOW + 61)  # the window moved
    limit.failed("10.0.0.1", NOW + 61)
    for _ in range(5):  # too many keys counted at once: a new one is neither counted nor blocked
        limit.failed("10.0.0.3", NOW + 62)
    assert not limit.blocked("10.0.0.3", NOW + 62)
    for _ in range(3):  # the old ones are forgotten
        limit.failed("10.0.0.3", NOW + 200)
    assert limit.blocked("10.0.0.3", NOW + 200)
    assert peer_host("127.0.0.1:5555") == "127.0.0.1"
    assert peer_host("::1:5555") == "::1" and peer_host("?") == "?"


def test_sign_in_failures_count_per_credential_and_per_address() -> None:
    sessions = Sessions(KEY)
    limits = SignInLimits(attempts=2, address_attempts=4, window=60.0)
    ticket, _ = sessions.ticket("bob", 1002, NOW)
    bob = sign_in_subject(sessions, ticket, None)
    assert bob.startswith("ticket ") and bob != "ticket ?"
    assert sign_in_subject(sessions, "gw1t.e30.00", None) == "ticket ?"  # not signed here
    assert sign_in_subject(sessions, None, "gpuqt_abcdefgh-tail") == "token gpuqt_abcdefgh"
    assert not limits.failed("loopback", bob, NOW) and not limits.failed("loopback", bob, NOW)
    assert limits.blocked("loopback", bob, NOW)  # that ticket, from that address
    assert not limits.blocked("10.0.0.1", bob, NOW)
    assert not limits.blocked("loopback", "ticket ?", NOW)
    assert not limits.failed("loopback", "ticket ?", NOW)
    assert limits.failed("loopback", "token gpuqt_x", NOW)  # the address's 4th: answered 429
    assert not limits.blocked("loopback", "token gpuqt_alice", NOW)  # another is still checked
    assert not limits.blocked("loopback", bob, NOW + 61)
