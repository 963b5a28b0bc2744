"""The `gpuq` command's Python entry point (scripts/gpuq-py calls main()): a lean stub in front
of a persistent per-user CLI helper.

Installed, `gpuq` is a C program (gpuq/cli/fast/stub.c) that does this module's fast path
without starting Python, and runs this stub (`gpuq-py`, beside it) for everything else: the
first call, a stale or declining helper, GPUQ_CLI_HELPER=off. It passes STUB_VAR, which this
stub takes out of the environment: with it, it links the helper's socket for the C program
(protocol.link_stub) and takes the C program's path as sys.argv[0].

Importing click, grpc and the protobuf descriptors costs several times what starting Python
does, and a person types `gpuq status` dozens of times a day. So `main()` imports nothing but
what the interpreter already has (os, sys, _socket, _signal, _struct), hands its argv,
environment, umask, working folder and stdio to a helper process of the same user that has the
CLI loaded (gpuq.cli.fast.helper_process), and waits for the exit status; the helper forks a
child that becomes this call and runs the one CLI (gpuq.cli.group.run). Signals are forwarded
to that child. Without a helper (the first call, `GPUQ_CLI_HELPER=off`, a verb that must own
its process (gpuq.cli.verbs.OWN_PROCESS), a folder that is not safely ours) the command runs
here, the slow way, and a helper is started for next time. The exit codes are gpuq.cli.group's.

Rules kept here (and in stub.c): no import beyond the builtins on the fast path (`python -X
importtime`), the socket folder is trusted only when it is a real directory, ours, mode 0700,
and anything that goes wrong before the helper said it runs the command falls back to the slow
path in silence.
"""

from __future__ import annotations

import os
import sys

from gpuq.cli.fast.protocol import (
    EXIT,
    FORWARDED,
    PID,
    SIGSTOP,
    SIGTSTP,
    STUB_VAR,
    command_of,
    link_stub,
    read_answer,
    send_request,
    socket_path,
)
from gpuq.cli.verbs import OWN_PROCESS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

HELPER_VAR = "GPUQ_CLI_HELPER"  # off: never use or start a helper; debug: say which path ran
OFF_VALUES = frozenset({"off", "0", "no", "false"})


def main(argv: list[str] | None = None) -> NoReturn:
    """Entry point: through the helper when one answers, else here; then leave at once (a
    client command has nothing to clean up, and tearing grpc down costs a visible 30 ms)."""
    args = sys.argv[1:] if argv is None else list(argv)
    stub = os.environ.pop(STUB_VAR, None)  # the C `gpuq` ran this (gpuq/cli/fast/stub.c)
    if stub is not None and sys.argv:
        sys.argv[0] = stub.split(":", 2)[-1] or sys.argv[0]  # the path it was run as
    mode = os.environ.get(HELPER_VAR, "").lower()
    path = None
    if mode not in OFF_VALUES and command_of(args) not in OWN_PROCESS:
        path = socket_path()
        if path is not None:
            if stub is not None:
                link_stub(path, stub)
            code = _through_helper(path, args, debug=mode == "debug")
            if code is not None:
                os._exit(code)
            if mode == "debug":
                os.write(2, b"gpuq: cli helper: none answered; the slow path, and one starts\n")
    _slow_path(args, path)


# ---- the fast path -------------------------------------------------------------------------


def _through_helper(path: str, args: list[str], debug: bool) -> int | None:
    """Run the command in the helper: its exit code, or None when the helper did not start it
    (none listens, it is stale, it declined), so that the caller runs it here instead."""
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
        ignored = send_request(sock, args)
        kind, pid = read_answer(sock)
    except OSError:
        sock.close()
        return None
    if kind != PID:
        sock.close()
        return None
    if debug:
        os.write(2, f"gpuq: cli helper: child {pid}\n".encode())
    _forward_signals(pid, ignored)
    try:
        kind, status = read_answer(sock)
    except OSError:
        kind, status = b"", 0
    if kind != EXIT:
        return _orphaned(pid)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _forward_signals(pid: int, ignored: int) -> None:
    """Pass on what a terminal or a caller sends (same uid: os.kill may). Ctrl-Z stops the
    child (its own process group ignores SIGTSTP: it has no terminal) and then this stub."""
    import _signal  # type: ignore[import-not-found]

    def forward(number: int, frame: object) -> None:
        _kill(pid, number)

    def suspend(number: int, frame: object) -> None:
        _kill(pid, SIGSTOP)
        _signal.signal(SIGTSTP, _signal.SIG_DFL)
        os.kill(os.getpid(), SIGTSTP)  # stops here; SIGCONT (forwarded) resumes both
        _signal.signal(SIGTSTP, suspend)

    for number in FORWARDED:
        if not ignored & (1 << number):
            _signal.signal(number, forward)
    if not ignored & (1 << SIGTSTP):
        _signal.signal(SIGTSTP, suspend)


def _kill(pid: int, number: int) -> None:
    try:  # noqa: SIM105 - contextlib is an import the stub does without
        os.kill(pid, number)
    except OSError:
        pass


def _orphaned(pid: int) -> int:
    """The helper went away while the child ran: wait for the child, whose status is lost."""
    import time

    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        except OSError:
            break
        time.sleep(0.05)
    os.write(2, b"gpuq: error: the CLI helper ended before the command; its status is unknown\n")
    return 1


# ---- the slow path -------------------------------------------------------------------------


def _slow_path(args: list[str], path: str | None) -> NoReturn:
    """Run the command in this process; then, when `path` is set, start a helper for next
    time (after the command, so that the two do not compete for the CPU)."""
    from gpuq.cli.group import run

    try:
        code = run(args)
        sys.stdout.flush()
        sys.stderr.flush()
    finally:  # also after a closed pipe (`gpuq queue | head`: click's exit 1, or EPIPE here)
        if path is not None:
            from gpuq.cli.fast.helper_control import start_helper

            start_helper(path)
    os._exit(code)
