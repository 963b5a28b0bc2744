"""A CLI helper's child that serves another call after the one it ran, instead of leaving:
for the verbs in gpuq.cli.verbs.PROCESS_REUSABLE, which leave nothing running behind them.

Why: a fresh child per call pays its fork, gRPC's start, a connection and the copy-on-write
faults of the loaded modules, about two thirds of a call's CPU. Calls back to back (a shell
loop of submissions, issue 27) then queue behind that work on a small machine. A child that
stays keeps all of it: its gRPC, its connected client (gpuq.cli.fast.warm_client) and its
pages.

What makes it safe to serve the next call (possibly another shell's) in this process:
- The call ended cleanly: run returned or exited, nothing escaped it, no Ctrl-C reached it
  (even one a verb handled), and no thread of its own is left. Otherwise the child leaves, as
  every child did before.
- Everything become_caller took from the caller goes back to what the spare had (SpareState):
  fds 0-2 on /dev/null (never a reused number), the folder, the umask, the environment, the
  time zone and LC_CTYPE, argv, the std streams, the signal handlers.
- No signal meant for this call reaches the next: the stub forwards signals to this pid only
  until it leaves, and it leaves once it read the exit code. So the child waits for the stub's
  end of the connection to close (a signal it sent is delivered by then); SIGINT's Python
  handler is then replaced, which drops a KeyboardInterrupt still pending. A stub that does
  not leave within CALLER_LEAVES seconds: the child leaves instead.
- Bounded: a child serves at most SERVE_CALLS calls, and takes none once SERVE_FOR seconds
  passed since it was forked (a credential or token read long ago is then read again by a
  fresh child), and the helper keeps at most its SPARES of them waiting.
"""

from __future__ import annotations

import locale
import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from gpuq.cli.fast.become_caller import (
    EXIT_INTERNAL,
    SIGNALS_SET,
    become_caller,
    run_call,
    say_failed,
)
from gpuq.cli.fast.protocol import ENDED, EXIT, PID, SERVE_AGAIN, Request, answer

SERVE_CALLS = 200  # calls a child serves at most
SERVE_FOR = 60.0  # seconds from its fork after which a child takes no further call
CALLER_LEAVES = 2.0  # seconds the stub has to close its connection once told the exit code


@dataclass
class SpareState:
    """What become_caller changes, as the spare had it before the call."""

    folder: str
    umask: int
    environ: dict[bytes, bytes]
    signals: dict[int, Any]
    ctype: str
    argv: list[str]
    streams: tuple[Any, ...]

    @classmethod
    def taken(cls) -> SpareState:
        mask = os.umask(0o022)
        os.umask(mask)
        return cls(
            folder=os.getcwd(),
            umask=mask,
            environ=dict(os.environb),
            signals={number: signal.getsignal(number) for number in SIGNALS_SET},
            ctype=locale.setlocale(locale.LC_CTYPE),
            argv=list(sys.argv),
            streams=(sys.stdin, sys.stdout, sys.stderr),
        )

    def restore(self) -> None:
        """Signals first: a SIGINT of the call's still pending finds no Python handler."""
        signal.set_wakeup_fd(-1)
        for number, handler in self.signals.items():
            signal.signal(number, handler)
        os.chdir(self.folder)
        os.umask(self.umask)
        os.environ.clear()
        for key, value in self.environ.items():
            os.environb[key] = value
        time.tzset()
        locale.setlocale(locale.LC_CTYPE, self.ctype)
        sys.argv = list(self.argv)
        for name, stream in zip(("stdin", "stdout", "stderr"), self.streams, strict=True):
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)


def may_return(served: int, forked_at: float) -> bool:
    """Whether a child that served `served` calls since its fork at `forked_at` (monotonic)
    may take one it would serve again after (else it takes it as its last)."""
    return served + 1 < SERVE_CALLS and time.monotonic() - forked_at < SERVE_FOR


def run_and_return(request: Request, conn: socket.socket, control: socket.socket) -> bool:
    """Run the call as gpuq.cli.fast.become_caller.run_as_caller does; then, when it ended
    cleanly and the helper says so, become the spare again: True. Otherwise the process ends
    here with the call's exit code (the stub has it already)."""
    before = SpareState.taken()
    code, clean = EXIT_INTERNAL, False
    try:
        os.write(conn.fileno(), answer(PID, os.getpid()))
        become_caller(request, ())
        interrupted = _note_interrupts()
        threads = set(threading.enumerate())
        code = run_call(request)
        left = [t for t in set(threading.enumerate()) - threads if not t.daemon]
        clean = not left and not interrupted
    except BaseException:
        say_failed()
    try:
        clean = _release_caller_fds() and clean
        # before the stub can leave, or the helper would take its leaving for a hang-up
        clean = clean and _tell(control, ENDED)
        os.write(conn.fileno(), answer(EXIT, (code & 0xFF) << 8))
        if clean and _caller_left(conn) and control.recv(1) == SERVE_AGAIN:
            before.restore()
            conn.close()
            from gpuq.cli.fast.warm_client import keep_lent

            keep_lent()
            return True
    except BaseException:
        pass
    os._exit(code & 0xFF)


def _note_interrupts() -> list[int]:
    """SIGINT raises KeyboardInterrupt as before, and is noted in the list returned."""
    noted: list[int] = []
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:

        def interrupt(number: int, frame: Any) -> None:
            noted.append(number)
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, interrupt)
    return noted


def _tell(control: socket.socket, message: bytes) -> bool:
    """Whether the helper was told (it is gone when it was killed during the call)."""
    try:
        control.sendall(message)
    except OSError:
        return False
    return True


def _release_caller_fds() -> bool:
    """fds 0-2 on /dev/null: the caller's are closed here, and their numbers stay taken.
    Whether what the call wrote reached them (a failed flush: the child does not stay)."""
    flushed = True
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            flushed = False
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    return flushed


def _caller_left(conn: socket.socket) -> bool:
    """Whether the stub closed its connection within CALLER_LEAVES seconds (anything it sends
    instead counts as not left)."""
    try:
        ready, _, _ = select.select([conn], [], [], CALLER_LEAVES)
        return bool(ready) and conn.recv(1) == b""
    except OSError:
        return False
