"""Who calls: users by their Unix uid, nodes by their key. No shared secret names a user.

gRPC's Python API does not tell a server the uid behind a Unix socket, so a local caller first
connects to a small handshake socket beside the coordinator's (`gpuq.sock.auth`, mode 0666).
The coordinator reads the caller's uid from the kernel (SO_PEERCRED), never from anything the
caller says, and answers with a credential it signed: `gpuq1.<uid>.<expires>.<nonce>.<mac>`
(HMAC-SHA256 under the coordinator's private key, GPUQ_HOME/auth.key). The caller sends it as
metadata `authorization: Bearer <credential>` with every call, for an hour. Over TCP a user
presents a per-user token an admin issued instead (`authorization: Token <token>`; the store
keeps its SHA-256); a node presents its key (`authorization: Node <name> <key>`, the file
<nodes_dir>/<name>.key on the coordinator).

This module holds the pure parts (formats, signing, checks) and the two small I/O edges that
need no gRPC: the handshake's client side and key files.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pwd
import re
import secrets
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from gpuq.errors import GpuqError, PermissionDenied, ServerUnavailable

METADATA_KEY = "authorization"
CREDENTIAL_TTL = 3600.0  # seconds a handshake credential is good for
CREDENTIAL_PREFIX = "gpuq1"
TOKEN_PREFIX = "gpuqt_"
MAX_CREDENTIAL = 512  # characters of an authorization value; longer is refused unread
HANDSHAKE_TIMEOUT = 5.0
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_KEY_TEXT = re.compile(r"[A-Za-z0-9_-]{32,128}")
# what key_file_problem finds wrong with a key file
KEY_NOT_PRIVATE = "must be private"
KEY_NOT_OWNED = "belongs to another user"


class Unauthenticated(GpuqError):
    """The call did not say who makes it, or said it in a way that does not hold."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes a call, as the coordinator established it."""

    user: str  # a Unix user name ("" for a node)
    uid: int | None  # None: not known (a token's user need not exist on this machine)
    admin: bool = False
    node: str | None = None  # set for an agent's stream: the node its key names
    how: str = "socket"  # "socket" (SO_PEERCRED), "token" or "node key"


# ---- credentials (local callers) --------------------------------------------------------------


def sign_credential(key: bytes, uid: int, now: float, ttl: float = CREDENTIAL_TTL) -> str:
    body = f"{CREDENTIAL_PREFIX}.{uid}.{int(now + ttl)}.{secrets.token_hex(8)}"
    return f"{body}.{_mac(key, body)}"


def verify_credential(key: bytes, text: str, now: float) -> int:
    """The uid a credential this coordinator signed names; Unauthenticated when it is not one,
    or it expired."""
    parts = text.split(".")
    if len(parts) != 5 or parts[0] != CREDENTIAL_PREFIX:
        raise Unauthenticated("not a gpuq credential")
    body, mac = text.rpartition(".")[0], parts[4]
    if not hmac.compare_digest(_mac(key, body), mac):
        raise Unauthenticated(
            "a credential this coordinator did not sign (restarted with a new key?)"
        )
    uid_text, expires_text = parts[1], parts[2]
    if not (uid_text.isdigit() and expires_text.isdigit()):
        raise Unauthenticated("a malformed credential")
    if int(expires_text) < now:
        raise Unauthenticated("the credential expired; run the command again")
    return int(uid_text)


def credential_expiry(text: str) -> float:
    """When a credential stops being accepted (0 when it is not one)."""
    parts = text.split(".")
    return float(parts[2]) if len(parts) == 5 and parts[2].isdigit() else 0.0


def _mac(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def peer_uid(connection: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket, as the kernel says."""
    import struct

    raw = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


def fetch_credential(auth_socket: Path, timeout: float = HANDSHAKE_TIMEOUT) -> str:
    """Ask the coordinator behind `auth_socket` for a credential naming this process's uid."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        try:
            conn.connect(os.fsencode(auth_socket))
            data = b""
            while len(data) <= MAX_CREDENTIAL and (chunk := conn.recv(1024)):
                data += chunk
        except PermissionError:
            raise PermissionDenied(
                f"cannot reach {auth_socket}: this coordinator is private to another user"
            ) from None
        except OSError:  # no such socket, nobody listening, no answer in time
            from gpuq.config.settings import how_to_start

            address = f"unix:{auth_socket.with_name(auth_socket.stem)}"
            raise ServerUnavailable(
                f"no gpuq coordinator at {address}; {how_to_start(address)}"
            ) from None
    text = data.decode("ascii", "replace").strip()
    if text.startswith("refused: "):
        raise PermissionDenied(text.removeprefix("refused: ")[:200])
    if not text.startswith(CREDENTIAL_PREFIX + "."):
        raise ServerUnavailable(f"the coordinator at {auth_socket} gave no credential")
    return text


# ---- per-user tokens (TCP callers) ------------------------------------------------------------


def new_user_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def read_user_token(path: Path) -> str:
    """A user's token file: theirs alone (mode 0600), or it is not used."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise PermissionDenied(
            f"no gpuq token at {path}: over TCP a user needs one; ask an admin for one "
            "(`gpuq admin token USER`) and save it there with mode 0600"
        ) from None
    except OSError as exc:
        raise PermissionDenied(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise PermissionDenied(f"{path} must be yours and private: chmod 600 {path}")
        text = handle.read(MAX_CREDENTIAL + 1).decode("ascii", "replace").strip()
    if not text.startswith(TOKEN_PREFIX) or len(text) > MAX_CREDENTIAL:
        raise PermissionDenied(f"{path} does not hold a gpuq token")
    return text


# ---- whom a coordinator serves -----------------------------------------------------------------


def service_uid(service_user: str | None) -> int | None:
    """The uid of the coordinator's service user ([coordinator] service_user) on this machine;
    None when none is configured or no such user exists here."""
    if not service_user:
        return None
    try:
        return pwd.getpwnam(service_user).pw_uid
    except KeyError:
        return None


def serves_every_user(service_user: str | None) -> bool:
    """Whether a coordinator running as this process's user serves every user of the machine:
    root's does, and so does one running as exactly the configured service user (systemd's
    User=gpuq). Anyone else's is a private coordinator that serves only its own user, so that
    an ordinary user can never stand in for the machine's queue."""
    euid = os.geteuid()
    return euid == 0 or euid == service_uid(service_user)


# ---- node keys ---------------------------------------------------------------------------------


def check_node_name(name: str) -> str:
    if not _NODE_NAME.fullmatch(name):
        raise Unauthenticated("not a node name")
    return name


def node_key_file(nodes_dir: Path, node: str) -> Path:
    return nodes_dir / f"{check_node_name(node)}.key"


def create_key_file(path: Path, owner: int | None = None) -> str:
    """A new random key in `path` (mode 0600, its folder 0700), or the key already there.
    `owner`: the uid a new file (and a folder made for it) is given, where root makes a key for
    a coordinator that runs as its service user (which must read it)."""
    made_folder = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if made_folder and owner is not None:
        os.chown(path.parent, owner, -1)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return read_key_file(path, also_owner=owner)
    key = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as handle:
        if owner is not None:
            os.fchown(handle.fileno(), owner, -1)
        handle.write(key + "\n")
    return key


def read_key_file(path: Path, also_owner: int | None = None) -> str:
    """A key file's key. It must be a regular file that only its owner can read, owned by
    this process's user or root (or `also_owner`: a root agent reads the local node's key that
    the coordinator's service user owns): a key anyone could read or swap is no key."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise PermissionDenied(f"no key file {path}") from None
    except OSError as exc:
        raise PermissionDenied(f"cannot read the key file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if (problem := key_file_problem(info, os.geteuid(), also_owner)) is not None:
            raise PermissionDenied(f"the key file {path} {problem}: {problem_fix(problem, path)}")
        text = handle.read(256).decode("ascii", "replace").strip()
    if not _KEY_TEXT.fullmatch(text):
        raise PermissionDenied(f"the key file {path} does not hold a key")
    return text


def key_file_problem(info: os.stat_result, user: int, also_owner: int | None = None) -> str | None:
    """Why a key file with this stat is no key for a daemon running as uid `user` (None: it
    is one): it must be a regular file that only its owner can read, owned by that user or
    root (or `also_owner`: the coordinator's service user, whose node key a root agent on its
    machine reads); a key anyone could read or swap is no key. The daemons (read_key_file) and `gpuq
    admin doctor` apply this one rule."""
    if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077:
        return KEY_NOT_PRIVATE
    if info.st_uid not in (0, user, also_owner):
        return KEY_NOT_OWNED
    return None


def problem_fix(problem: str, path: Path) -> str:
    """How to fix what key_file_problem found."""
    if problem == KEY_NOT_PRIVATE:
        return f"chmod 600 {path}"
    return f"chown root {path} (or the daemon's user)"


def node_metadata(node: str, key: str) -> tuple[str, str]:
    return (METADATA_KEY, f"Node {node} {key}")


def keys_match(expected: str, presented: str) -> bool:
    return hmac.compare_digest(expected.encode(), presented.encode())
