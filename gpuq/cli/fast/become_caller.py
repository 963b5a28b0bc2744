"""A CLI helper's child becoming the `gpuq` process that called (the spare that took the call:
gpuq.cli.fast.spare).

What a fresh `gpuq` process would have from its caller, the child takes from the request:
fds 0, 1 and 2, the working folder (an fd, so a deleted or unreadable folder works as it would),
the umask, the environment (through os.environ, so C code's getenv sees it too: grpc reads its
settings when the first channel is made, which happens here, never in the helper), the time
zone and LC_CTYPE, the std streams' encodings and buffering, the signals it ignores, argv. Then
it runs the one CLI entry, gpuq.cli.group.run, and leaves with its exit code.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import time
from typing import Any, NoReturn

from gpuq.cli.fast.protocol import EXIT, FORWARDED, PID, SIGTSTP, Request, answer

EXIT_INTERNAL = 4
# the signals become_caller sets as the caller has them
SIGNALS_SET = (*FORWARDED, SIGTSTP, signal.SIGCHLD)


def run_as_caller(request: Request, report: int, close: tuple[int, ...] = ()) -> NoReturn:
    """Become the caller, run the CLI, and say the exit code on `report` (the stub's
    connection) once the caller's fds are closed here: the stub, and whoever reads its output
    to the end, need not wait for this process to be torn down (the helper still sends the
    wait status, which a stub that already left never reads). `close`: see become_caller."""
    code = EXIT_INTERNAL
    try:
        # the pid first, from here: the helper writes only after this process ended
        os.write(report, answer(PID, os.getpid()))
        become_caller(request, close)
        code = run_call(request)
    except BaseException:
        say_failed()
    finally:
        with contextlib.suppress(BaseException):
            for fd in (0, 1, 2):
                os.close(fd)
            os.write(report, answer(EXIT, (code & 0xFF) << 8))
        os._exit(code)


def run_call(request: Request) -> int:
    """Run the call (the process is the caller already); its exit code."""
    try:
        from gpuq.cli.group import run

        code = run(request.argv[1:])
        sys.stdout.flush()
        sys.stderr.flush()
    except SystemExit as exc:  # what a bare interpreter would make of it
        code = _exit_code(exc)
    return code


def say_failed() -> None:
    _say("gpuq: internal error: the CLI helper's child failed (GPUQ_CLI_HELPER=off avoids it)")


def become_caller(request: Request, close: tuple[int, ...]) -> None:
    """`close`: the helper's fds still open here (its listener, the spare's control socket);
    gRPC's own fds, made when it started in the spare, stay."""
    _signals(request.ignored)
    for target, fd in enumerate(request.fds[:3]):
        os.dup2(fd, target)
    os.fchdir(request.fds[3])
    for fd in (*request.fds, *close):
        with contextlib.suppress(OSError):
            os.close(fd)
    os.umask(request.umask)
    os.environ.clear()
    for key, value in request.environ:
        os.environb[key] = value
    time.tzset()
    _locale()
    sys.argv = list(request.argv) or ["gpuq"]
    _streams(request.encodings)


def _signals(ignored: int) -> None:
    """As a new interpreter has them: SIGINT raises KeyboardInterrupt, the rest default,
    except what the caller ignores (`nohup` ignores SIGHUP)."""
    signal.set_wakeup_fd(-1)
    for number in SIGNALS_SET:
        if ignored & (1 << number):
            signal.signal(number, signal.SIG_IGN)
        elif number == signal.SIGINT:
            signal.signal(number, signal.default_int_handler)
        else:
            signal.signal(number, signal.SIG_DFL)


def _locale() -> None:
    """LC_CTYPE from the caller's environment, as Python sets it at start."""
    try:
        import locale

        locale.setlocale(locale.LC_CTYPE, "")
    except Exception:
        pass


def _streams(encodings: list[str]) -> None:
    """sys.stdin/stdout/stderr as the interpreter makes them: the caller's encodings, stdout
    line-buffered on a terminal (unbuffered with PYTHONUNBUFFERED), stderr line-buffered."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        spec = encodings[fd] if fd < len(encodings) else ""
        encoding, _, errors = spec.partition(":")
        stream = _stream(
            fd,
            name,
            encoding or "utf-8",
            errors or ("backslashreplace" if fd == 2 else "strict"),
            unbuffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _stream(fd: int, name: str, encoding: str, errors: str, unbuffered: bool) -> io.TextIOWrapper:
    writing = fd != 0
    raw = io.FileIO(fd, "wb" if writing else "rb", closefd=False)
    with contextlib.suppress(AttributeError, TypeError):
        raw.name = f"<{name}>"
    tty = raw.isatty()
    buffer: Any = io.BufferedWriter(raw) if writing else io.BufferedReader(raw)
    stream = io.TextIOWrapper(
        buffer,
        encoding,
        errors,
        newline="\n",
        line_buffering=fd == 2 or tty,
        write_through=writing and unbuffered,
    )
    with contextlib.suppress(AttributeError, TypeError):
        stream.mode = "w" if writing else "r"  # type: ignore[misc]
    return stream


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    _say(str(exc.code))
    return 1


def _say(line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, line.encode(errors="replace") + b"\n")
