"""A CLI helper's spare: the child forked ahead of the next call (gpuq.cli.fast.helper_process),
which accepts it, checks it (who calls, whether the code changed, whether it can be run here)
and hands the connection to the helper before it becomes the caller
(gpuq.cli.fast.become_caller); after a call of a verb that leaves nothing behind, it may be
the spare again (gpuq.cli.fast.serve_again).

Forking ahead takes the fork, and gRPC's start-up (its threads), off the call's path. gRPC
starts here with the helper's GRPC_* variables (the first caller's) and GRPC_VERBOSITY=ERROR
unless set, as gpuq.cli.group.run does; a caller whose GRPC_* variables differ (gRPC reads
them once, when it starts) is declined, and the stub runs the call itself. The helper parent
never starts gRPC: it only forks. A call from the C stub (gpuq/cli/fast/stub.c) is also
declined when it names a verb that must own its process, or an encoding Python does not know:
the C stub then runs the Python stub, which does what it always did.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import time
from collections.abc import Iterable
from typing import Any, NoReturn

from gpuq.cli.fast.become_caller import run_as_caller
from gpuq.cli.fast.code_check import CodeCheck
from gpuq.cli.fast.protocol import (
    DECLINED,
    LEFT,
    MAX_ENVIRON,
    STALE,
    Request,
    answer,
    command_of,
    read_request,
    send_took,
)
from gpuq.cli.fast.serve_again import may_return, run_and_return
from gpuq.cli.fast.warm_client import warm_client
from gpuq.cli.verbs import OWN_PROCESS, PROCESS_REUSABLE

REQUEST_TIMEOUT = 5.0
BUSY_WAIT = 2.0  # seconds a new spare leaves the call before it alone, at most
# seconds without a call before a warm spare owns its pages (_own_pages): calls back to back
# (a shell loop) come sooner, and skip it
OWN_PAGES_AFTER = 0.05
_WARM: list[Any] = []  # keeps gRPC started in this spare (a closed last channel stops it)
_GRPC_SETTINGS: dict[bytes, bytes] = {}  # the GRPC_* variables gRPC started with here


def spare(
    listener: socket.socket,
    control: socket.socket,
    code: CodeCheck,
    warm: tuple[bytes, int | None] = (b"", None),
    parent: int = 0,
) -> NoReturn:
    """Wait for a call on `listener`, tell the helper on `control`, run it; never returns.
    `code`: what the code was when loaded (checked before each call).
    `warm`: the last caller's settings variables, and the pidfd of its call (see _warm_up).
    `parent`: the helper's pid as it forked (a spare forked just as the helper was killed
    must not take init, its new parent, for the helper, and outlive it)."""
    try:
        forked_at, served = time.monotonic(), 0
        parent = parent or os.getppid()
        _die_with(parent)
        environ, busy = warm
        watch = (code.watch.fd,) if code.watch.fd >= 0 else ()
        helpers = (listener.fileno(), control.fileno(), *watch)
        kept = (*helpers, *(() if busy is None else (busy,)))
        _keep_only(*kept)  # before gRPC makes fds of its own
        signal.set_wakeup_fd(-1)
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)  # the helper ends a spare with SIGTERM
        if busy is not None:
            _after(busy, listener)
        _warm_up(environ)
        if not _waits(listener, OWN_PAGES_AFTER):
            _own_pages()
        while True:
            conn, _ = listener.accept()
            request = _take(conn, control, code)
            if request is None:
                continue
            returns = command_of(request.argv[1:]) in PROCESS_REUSABLE
            returns = returns and may_return(served, forked_at)
            send_took(control, conn.fileno(), settings_environ(request.environ), returns)
            _die_with(None)  # a command outlives a killed helper (its stub waits for it)
            if not returns:
                run_as_caller(request, conn.fileno(), helpers)
            run_and_return(request, conn, control)  # or it ends the process
            served += 1
            _die_with(parent)
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
    """Close every fd from 3 up but `fds` (the helper's sockets and code watch, a pidfd)."""
    low = 3
    for fd in sorted(fd for fd in fds if fd >= low):  # -1: no watch
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
    caller's settings (gpuq.cli.fast.warm_client: gRPC connects in its threads meanwhile),
    walk click's parser once."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    _GRPC_SETTINGS.update(_grpc_settings(os.environb.items()))
    with contextlib.suppress(Exception):
        import grpc

        _WARM.append(grpc.insecure_channel("unix:/nonexistent/gpuq-cli-helper-warm-up"))
    if environ:
        for entry in environ.split(b"\0"):
            key, _, value = entry.partition(b"=")
            os.environb[key] = value
        warm_client()
    with contextlib.suppress(Exception):
        from gpuq.cli.group import cli

        cli.make_context("gpuq", ["queue"], resilient_parsing=True)


def _waits(listener: socket.socket, seconds: float) -> bool:
    """Whether a call waits on `listener` within `seconds`."""
    import select

    try:
        return bool(select.select([listener.fileno()], [], [], seconds)[0])
    except OSError:
        return False


def _own_pages() -> None:
    """Touch every object once, so that the copy-on-write faults of the helper's loaded
    modules happen now, while the spare waits, not during the call: ~2 ms of CPU less in a
    call, for 10-12 ms of the spare's. Only once no call came within OWN_PAGES_AFTER: in a
    shell loop those 10-12 ms a call took a quarter of the rate on 2 CPUs (issue 27,
    bench/cli_bench.py: 22 -> 29 submissions/s without it)."""
    import gc

    gc.unfreeze()
    for thing in gc.get_objects():
        id(thing)
    gc.freeze()


def _codec_names(request: Request) -> bool:
    """The streams' encodings as Python names them (codecs.lookup, as the interpreter does at
    start-up: the C stub sends PYTHONIOENCODING's or the locale's name as it found it, e.g.
    ANSI_X3.4-1968 for ascii); False when one is unknown."""
    import codecs

    named = []
    for spec in request.encodings:
        encoding, colon, errors = spec.partition(":")
        if encoding:
            try:
                encoding = codecs.lookup(encoding).name
            except LookupError:
                return False
        named.append(encoding + colon + errors)
    request.encodings = named
    return True


def _grpc_settings(environ: Iterable[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """The GRPC_* variables, GRPC_VERBOSITY=ERROR unless set (gpuq.cli.group.run's)."""
    found = {key: value for key, value in environ if key.startswith(b"GRPC_")}
    found.setdefault(b"GRPC_VERBOSITY", b"ERROR")
    return found


def _take(conn: socket.socket, control: socket.socket, code: CodeCheck) -> Request | None:
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
    refusal = b""
    if not code.unchanged():
        refusal = STALE
    elif gid != os.getgid() or sorted(request.groups) != sorted(os.getgroups()):
        refusal = DECLINED  # `sg`, `newgrp`: run it as called
    elif _grpc_settings(request.environ) != _GRPC_SETTINGS:
        refusal = DECLINED  # gRPC started here with other settings
    elif command_of(request.argv[1:]) in OWN_PROCESS:
        refusal = DECLINED  # from the C stub, which cannot tell: a daemon owns its process
    elif not _codec_names(request):
        refusal = DECLINED  # an encoding Python would not start with: let it say so
    if not refusal:
        return request
    for fd in request.fds:
        os.close(fd)
    with contextlib.suppress(OSError):
        conn.sendall(answer(refusal))
    conn.close()
    if refusal == STALE:
        with contextlib.suppress(OSError):
            control.sendall(LEFT)
        os._exit(0)
    return None
