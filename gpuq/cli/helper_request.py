"""A CLI helper's spare: the child forked ahead of the next call (gpuq.cli.helper), which
accepts it, checks it (who calls, whether the code changed, whether it can be run here) and
hands the connection to the helper before it becomes the caller (gpuq.cli.helper_child).

Forking ahead takes the fork, and gRPC's start-up (its threads), off the call's path. gRPC
starts here with the helper's GRPC_* variables (the first caller's) and GRPC_VERBOSITY=ERROR
unless set, as gpuq.cli.commands.run does; a caller whose GRPC_* variables differ (gRPC reads
them once, when it starts) is declined, and the stub runs the call itself. The helper parent
never starts gRPC: it only forks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

from gpuq.cli.main import DECLINED, MAGIC, STALE

MAX_REQUEST = 16 << 20
REQUEST_TIMEOUT = 5.0
BUSY_WAIT = 2.0  # seconds a new spare leaves the call before it alone, at most
MAX_ENVIRON = 64 << 10  # the settings variables a spare passes on with TOOK
TOOK, LEFT = b"T", b"S"  # spare -> helper: took a call (with its fd); code changed, leaving
_WARM: list[Any] = []  # keeps gRPC started in this spare (a closed last channel stops it)
_GRPC_SETTINGS: dict[bytes, bytes] = {}  # the GRPC_* variables gRPC started with here


def spare(
    listener: socket.socket,
    control: socket.socket,
    fingerprint: Callable[[], object],
    known: object,
    warm: tuple[bytes, int | None] = (b"", None),
    parent: int = 0,
) -> NoReturn:
    """Wait for a call on `listener`, tell the helper on `control`, run it; never returns.
    `warm`: the last caller's settings variables, and the pidfd of its call (see _warm_up).
    `parent`: the helper's pid as it forked (a spare forked just as the helper was killed
    must not take init, its new parent, for the helper, and outlive it)."""
    from gpuq.cli.helper_child import run_as_caller

    try:
        _die_with(parent or os.getppid())
        environ, busy = warm
        kept = (listener.fileno(), control.fileno(), *(() if busy is None else (busy,)))
        _keep_only(*kept)  # before gRPC makes fds of its own
        signal.set_wakeup_fd(-1)
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)  # the helper ends a spare with SIGTERM
        if busy is not None:
            _after(busy, listener)
        _warm_up(environ)
        while True:
            conn, _ = listener.accept()
            request = _take(conn, control, fingerprint, known)
            if request is not None:
                fd = struct.pack("i", conn.fileno())
                said = TOOK + settings_environ(request.environ)
                control.sendmsg([said], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fd)])
                _die_with(None)  # a command outlives a killed helper (its stub waits for it)
                run_as_caller(request, conn.fileno(), (listener.fileno(), control.fileno()))
    finally:
        os._exit(0)


def _die_with(parent: int | None) -> None:
    """A spare dies with its helper (PR_SET_PDEATHSIG): one left behind would keep accepting
    on a dead helper's socket, unlimited by the idle time. None: no longer (a spare that took
    a call is that call: killing the helper must not kill a `gpuq run` session with it)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, 0 if parent is None else signal.SIGKILL)
    if parent is not None and os.getppid() != parent:
        os._exit(0)


def _keep_only(*fds: int) -> None:
    """Close every fd from 3 up but `fds` (the helper's sockets, pidfds, its lock's fd)."""
    low = 3
    for fd in sorted(fds):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


def settings_environ(environ: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The variables gpuq.config reads (GPUQ_*, HOME), NUL-separated: with them the next
    spare resolves the same settings as this caller did."""
    chosen = [k + b"=" + v for k, v in environ if k.startswith(b"GPUQ_") or k == b"HOME"]
    blob = b"\0".join(chosen)
    return blob if len(blob) < MAX_ENVIRON - 1 else b""


def _after(busy: int, listener: socket.socket) -> None:
    """Wait until the call before this spare ended (its pidfd), or a call waits, or
    BUSY_WAIT passed: the warm-up that follows must not take CPU from that call."""
    import select

    with contextlib.suppress(OSError):
        select.select([busy, listener.fileno()], [], [], BUSY_WAIT)
    os.close(busy)


def _warm_up(environ: bytes) -> None:
    """Start gRPC (a channel that never connects), start connecting a client with the last
    caller's settings (gpuq.cli.commands.warm_client: gRPC connects in its threads meanwhile),
    walk click's parser once, own the pages."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    _GRPC_SETTINGS.update(_grpc_settings(os.environb.items()))
    with contextlib.suppress(Exception):
        import grpc

        _WARM.append(grpc.insecure_channel("unix:/nonexistent/gpuq-cli-helper-warm-up"))
    if environ:
        for entry in environ.split(b"\0"):
            key, _, value = entry.partition(b"=")
            os.environb[key] = value
        from gpuq.cli.commands import warm_client

        warm_client()
    with contextlib.suppress(Exception):
        from gpuq.cli.commands import cli

        cli.make_context("gpuq", ["queue"], resilient_parsing=True)
    _own_pages()


def _own_pages() -> None:
    """Touch every object once, so that the copy-on-write faults of the helper's loaded
    modules happen now, while the spare waits, not during the call (~2 ms of a call)."""
    import gc

    gc.unfreeze()
    for thing in gc.get_objects():
        id(thing)
    gc.freeze()


def _grpc_settings(environ: Iterable[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """The GRPC_* variables, GRPC_VERBOSITY=ERROR unless set (gpuq.cli.commands.run's)."""
    found = {key: value for key, value in environ if key.startswith(b"GRPC_")}
    found.setdefault(b"GRPC_VERBOSITY", b"ERROR")
    return found


def _take(
    conn: socket.socket, control: socket.socket, fingerprint: Callable[[], object], known: object
) -> Request | None:
    """The call on `conn` when this spare may run it; else it is answered (or, from another
    uid, closed without a word) and None."""
    try:
        conn.settimeout(REQUEST_TIMEOUT)
        credentials = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        _pid, uid, gid = struct.unpack("3i", credentials)
        if uid != os.getuid():
            conn.close()
            return None
        request = read_request(conn)
    except (OSError, ValueError):
        conn.close()
        return None
    answer = b""
    if fingerprint() != known:
        answer = STALE
    elif gid != os.getgid() or sorted(request.groups) != sorted(os.getgroups()):
        answer = DECLINED  # `sg`, `newgrp`: run it as called
    elif _grpc_settings(request.environ) != _GRPC_SETTINGS:
        answer = DECLINED  # gRPC started here with other settings
    if not answer:
        return request
    for fd in request.fds:
        os.close(fd)
    with contextlib.suppress(OSError):
        conn.sendall(answer + bytes(4))
    conn.close()
    if answer == STALE:
        with contextlib.suppress(OSError):
            control.sendall(LEFT)
        os._exit(0)
    return None


@dataclass
class Request:
    """What a stub sends: see gpuq.cli.main._send_request."""

    umask: int
    ignored: int  # bit n: the caller ignores signal n
    groups: list[int]
    encodings: list[str]  # stdin, stdout, stderr: "encoding:errors", or "" for none
    argv: list[str]
    environ: list[tuple[bytes, bytes]]
    fds: list[int]  # the caller's 0, 1, 2 and working folder


def read_request(conn: socket.socket) -> Request:
    """One request: a length, NUL-separated fields, and four fds (SCM_RIGHTS)."""
    data, ancillary, flags, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(4 * 4))
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += struct.unpack(f"{len(payload) // 4}i", payload[: len(payload) // 4 * 4])
    try:
        if len(fds) != 4 or flags & socket.MSG_CTRUNC or len(data) < 4:
            raise ValueError("a request needs its four fds")
        (size,) = struct.unpack("!I", data[:4])
        if size > MAX_REQUEST:
            raise ValueError("request too large")
        body = bytearray(data[4:])
        while len(body) < size:
            chunk = conn.recv(min(1 << 20, size - len(body)))
            if not chunk:
                raise ValueError("request cut short")
            body += chunk
        return parse_request(bytes(body), fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def parse_request(body: bytes, fds: list[int]) -> Request:
    fields = body.split(b"\0")
    if fields[0] != MAGIC or len(fields) < 9:
        raise ValueError("not a gpuq CLI request")
    argc = int(fields[7])
    argv = [os.fsdecode(arg) for arg in fields[8 : 8 + argc]]
    environ = []
    for entry in fields[8 + argc :]:
        key, sep, value = entry.partition(b"=")
        if key and sep:
            environ.append((key, value))
    return Request(
        umask=int(fields[1]) & 0o777,
        ignored=int(fields[2]),
        groups=[int(g) for g in fields[3].split(b",") if g],
        encodings=[f.decode("ascii", "replace") for f in fields[4:7]],
        argv=argv,
        environ=environ,
        fds=fds,
    )
