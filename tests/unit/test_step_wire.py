"""The step protocol (gpuq.steps.step_wire): only a holder of the job's key gets past the
challenge, and a frame that is too big or not JSON ends the connection."""

from __future__ import annotations

import secrets
import socket
import struct
import threading

import pytest

from gpuq.steps.step_wire import (
    MAX_FRAME,
    ProtocolError,
    answer_challenge,
    challenge,
    decode,
    encode,
    mac,
    pack_bytes,
    parse_key,
    recv,
    send,
    unpack_bytes,
)


def pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    return a, b


def handshake(server_key: bytes, client_key: bytes) -> tuple[list[str], list[str]]:
    worker, client = pair()
    results: dict[str, list[str]] = {"worker": [], "client": []}

    def serve() -> None:
        try:
            challenge(worker, server_key)
            results["worker"].append("ok")
        except ProtocolError as exc:
            results["worker"].append(str(exc))
        finally:
            worker.close()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        answer_challenge(client, client_key)
        results["client"].append("ok")
    except (ProtocolError, OSError) as exc:
        results["client"].append(str(exc))
    thread.join(5)
    client.close()
    return results["worker"], results["client"]


def test_the_right_key_is_welcome() -> None:
    key = secrets.token_bytes(32)
    assert handshake(key, key) == (["ok"], ["ok"])


def test_a_wrong_key_is_refused() -> None:
    worker, client = handshake(secrets.token_bytes(32), secrets.token_bytes(32))
    assert worker == ["a wrong answer to the challenge (not this job's key)"]
    assert client != ["ok"]


def test_a_replayed_answer_is_worth_nothing() -> None:
    key = secrets.token_bytes(32)
    worker, peer = pair()
    refused: list[str] = []

    def serve() -> None:
        try:
            challenge(worker, key)
        except ProtocolError as exc:
            refused.append(str(exc))
        worker.close()

    thread = threading.Thread(target=serve)
    thread.start()
    first = recv(peer)
    assert first is not None and first["type"] == "challenge"
    # the answer to another connection's nonce
    send(peer, {"type": "auth", "mac": mac(key, "another nonce")})
    thread.join(5)
    assert refused and "wrong answer" in refused[0]
    assert recv(peer) is None  # and the connection is closed
    peer.close()


def test_oversize_frames_are_refused_before_reading_them() -> None:
    a, b = pair()
    a.sendall(struct.pack(">I", MAX_FRAME + 1))
    with pytest.raises(ProtocolError, match="over the limit"):
        recv(b)
    with pytest.raises(ProtocolError, match="over the limit"):
        encode({"type": "out", "data": "x" * (MAX_FRAME + 1)})
    a.close()
    b.close()


def test_malformed_frames_are_refused() -> None:
    for body in (b"not json", b"[1, 2]", b'{"no": "type"}', b"\xff\xfe"):
        with pytest.raises(ProtocolError):
            decode(body)
    a, b = pair()
    a.sendall(struct.pack(">I", 10) + b"{}")
    a.close()
    with pytest.raises(ProtocolError, match="inside a frame"):
        recv(b)
    b.close()


def test_frames_and_bytes_read_back() -> None:
    a, b = pair()
    send(a, {"type": "out", "data": pack_bytes(b"\x00\xffhello")})
    message = recv(b)
    assert message is not None and unpack_bytes(message["data"]) == b"\x00\xffhello"
    a.close()
    assert recv(b) is None
    b.close()


def test_keys_are_64_hex_characters() -> None:
    assert parse_key("ab" * 32) == bytes([0xAB]) * 32
    for bad in ("", "ab" * 31, "zz" * 32):
        with pytest.raises(ProtocolError, match="64 hex"):
            parse_key(bad)
