"""The framed protocol between srun (gpuq.steps.srun_main) and a follower's step worker
(gpuq.steps.step_worker).

A frame is a 4-byte big-endian length and that many bytes of a JSON object with a "type". The
connection opens with a challenge: the worker sends {"type": "challenge", "nonce": hex}, the
client answers {"type": "auth", "mac": HMAC-SHA256(key, nonce) in hex}, and the worker checks it
with hmac.compare_digest before it reads anything else. The key is the job's GPUQ_STEP_KEY (a
per-start secret only the job's own processes have), so another user on the network cannot
start processes as the job's user; a fresh nonce per connection means a recorded answer is
worth nothing. Sizes are bounded and anything malformed ends the connection (ProtocolError).

Messages after the handshake (client -> worker): start {argv, cwd, env, replace_env, tasks:
[{rank, local_id, env}], gpus_per_task}, signal {signal}, kill {}. Worker -> client: started
{rank, pid}, out {rank, fd, data (base64)}, exit {rank, code, signal, error}.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import socket
import struct
from typing import Any

MAX_FRAME = 8 << 20  # an environment of a few MiB plus argv; output comes in small chunks
HEADER = struct.Struct(">I")
NONCE_BYTES = 32
KEY_HEX_LEN = 64
HANDSHAKE_TIMEOUT = 10.0  # seconds


class ProtocolError(Exception):
    """The peer broke the protocol (bad size, bad JSON, bad answer): close the connection."""


def parse_key(text: str) -> bytes:
    """GPUQ_STEP_KEY: 64 hex characters (32 bytes)."""
    text = text.strip()
    if len(text) != KEY_HEX_LEN:
        raise ProtocolError("GPUQ_STEP_KEY must be 64 hex characters")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ProtocolError("GPUQ_STEP_KEY must be 64 hex characters") from None


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"a message of {len(body)} bytes is over the limit of {MAX_FRAME}")
    return HEADER.pack(len(body)) + body


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(encode(message))


def recv(sock: socket.socket) -> dict[str, Any] | None:
    """The next message, or None at a clean end of the connection (before a frame)."""
    header = _read_exactly(sock, HEADER.size, allow_eof=True)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ProtocolError(f"a frame of {size} bytes is over the limit of {MAX_FRAME}")
    body = _read_exactly(sock, size, allow_eof=False)
    assert body is not None
    return decode(body)


def decode(body: bytes) -> dict[str, Any]:
    try:
        message = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError("a frame that is not JSON") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("a frame that is not a message")
    return message


def _read_exactly(sock: socket.socket, size: int, allow_eof: bool) -> bytes | None:
    chunks: list[bytes] = []
    got = 0
    while got < size:
        chunk = sock.recv(min(size - got, 1 << 20))
        if not chunk:
            if allow_eof and got == 0:
                return None
            raise ProtocolError("the connection ended inside a frame")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def mac(key: bytes, nonce: str) -> str:
    return hmac.new(key, nonce.encode(), hashlib.sha256).hexdigest()


def challenge(sock: socket.socket, key: bytes) -> None:
    """Worker side: refuse (ProtocolError) unless the peer proves it holds the key."""
    nonce = secrets.token_hex(NONCE_BYTES)
    send(sock, {"type": "challenge", "nonce": nonce})
    answer = recv(sock)
    if answer is None or answer.get("type") != "auth" or not isinstance(answer.get("mac"), str):
        raise ProtocolError("no answer to the challenge")
    if not hmac.compare_digest(answer["mac"].encode(), mac(key, nonce).encode()):
        raise ProtocolError("a wrong answer to the challenge (not this job's key)")
    send(sock, {"type": "welcome"})


def answer_challenge(sock: socket.socket, key: bytes) -> None:
    """Client side: prove the key; ProtocolError when the worker does not welcome us."""
    first = recv(sock)
    if first is None or first.get("type") != "challenge" or not isinstance(first.get("nonce"), str):
        raise ProtocolError("the step worker sent no challenge")
    send(sock, {"type": "auth", "mac": mac(key, first["nonce"])})
    welcome = recv(sock)
    if welcome is None or welcome.get("type") != "welcome":
        raise ProtocolError("the step worker refused this job's key")


def pack_bytes(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unpack_bytes(text: object) -> bytes:
    if not isinstance(text, str):
        raise ProtocolError("output that is not base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise ProtocolError("output that is not base64 text") from None
