"""The CLI helper: one process per user and installation that has the CLI's modules (click,
grpc, the protobuf descriptors, the command modules) loaded, so that a `gpuq` call costs a
fork instead of a 100+ ms import (see gpuq.cli.fast.stub for the stub on the other end, and
gpuq.cli.fast.protocol for what the two say).

It keeps two spares forked ahead (gpuq.cli.fast.spare); per call, one of them becomes the
caller (gpuq.cli.fast.become_caller: its fds 0-2, working folder, umask, environment, stdio
encodings, argv) and runs the one CLI entry, gpuq.cli.group.run. The child says its pid at
once (the stub forwards signals to it) and its exit code once it closed the caller's fds; the
parent sends the wait status when the child ends (what counts when the child was killed). A
stub that goes away first (killed) gets its child SIGHUP then SIGTERM, and SIGKILL if it
lingers.

Rules it keeps:
- No grpc channel (nor any thread) in the parent: only children talk to the coordinator, so
  fork never copies gRPC's state.
- Only its own uid may call (SO_PEERCRED on every connection); a request can only run the gpuq
  CLI, with the caller's own fds, folder and environment.
- It never runs old code: before each call a spare checks that the code on disk is the code as
  loaded (gpuq.cli.fast.code_check); when it changed, the helper answers "stale" (the stub
  runs the call itself) and leaves.
- One helper per socket: a POSIX lock held for life; a new one binds a temporary name and renames
  it over the socket, so a dead one's socket is replaced. It leaves after GPUQ_CLI_HELPER_IDLE
  seconds (600) without calls, and on SIGTERM, removing its socket.

gpuq.cli.fast.helper_control starts one (serve() is its main) and stops them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import selectors
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from gpuq.cli.fast.code_check import CodeCheck, code_fingerprint
from gpuq.cli.fast.protocol import (
    ENDED,
    EXIT,
    LEAVE,
    LEFT,
    SERVE_AGAIN,
    TOOK,
    TOOK_TO_RETURN,
    answer,
    lock_path,
    private_folder,
    read_spare_message,
)
from gpuq.cli.fast.spare import spare
from gpuq.cli.verbs import CALL_TIME_IMPORTS, OWN_PROCESS, VERBS

IDLE_VAR = "GPUQ_CLI_HELPER_IDLE"  # seconds a helper waits for the next call (default 600)
DEFAULT_IDLE = 600.0
HANGUP_GRACE = 10.0  # seconds from SIGHUP+SIGTERM to SIGKILL for an abandoned child
STOP_GRACE = 5.0  # the same when the helper itself is told to stop
CHECK_EVERY = 5.0  # seconds between checks that the socket is still there and ours
# spares kept forked ahead: with two, calls back to back (a shell loop) find one warm while
# the other warms up after the call before (issue 27: 52 -> 59-64 submissions/s on 2 CPUs)
SPARES = 2
# loaded before the first call (each only if it imports), with every verb's module and what
# the verbs import when they run (gpuq.cli.verbs.CALL_TIME_IMPORTS): what a call needs beyond
PRELOAD = (
    "gpuq.cli.group",
    "gpuq.client",  # the warm client (gpuq.cli.fast.warm_client)
    "gpuq.config.loading",
    "grpc._channel",  # grpc loads these on the first channel
    "grpc._simple_stubs",
    "grpc.experimental",
    "locale",  # the child sets LC_CTYPE (gpuq.cli.fast.become_caller)
    "encodings.ascii",
    "importlib.metadata",
    "email.parser",  # what importlib.metadata reads a version with (`gpuq --version`)
    "email.feedparser",
    "ctypes",  # a spare's PR_SET_PDEATHSIG
)


# ---- loading


def preload() -> None:
    """Import what the CLI's commands will need, so that children find it loaded. A command
    module that does not import (absent, or half-written) is left to the child, which then
    reports it exactly as the slow path would."""
    import importlib

    names = [*PRELOAD, *CALL_TIME_IMPORTS]
    names += sorted({m for c, m in VERBS.items() if c not in OWN_PROCESS})
    for name in names:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


# ---- the server ----------------------------------------------------------------------------


@dataclass
class Session:
    """One call: the stub's connection (None once it went away, or once the call ended in a
    child that serves again) and the child running it; `control`: that child's socket, when
    it may serve again (gpuq.cli.fast.serve_again)."""

    pid: int
    pidfd: int
    conn: socket.socket | None
    kill_at: float | None = None
    control: socket.socket | None = None


@dataclass
class Spare:
    """A child forked ahead of a call, waiting in accept (gpuq.cli.fast.spare)."""

    pid: int
    pidfd: int
    control: socket.socket


@dataclass
class Helper:
    path: str
    lock: int
    code: CodeCheck
    idle: float
    sessions: dict[int, Session] = field(default_factory=dict)
    listener: socket.socket | None = None
    spares: dict[int, Spare] = field(default_factory=dict)  # by pid
    stopping: bool = False
    last_call: float = field(default_factory=time.monotonic)
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    inode: int = 0
    # the last caller's settings variables (gpuq.cli.fast.spare.settings_environ): the
    # next spare connects a client with them while it waits
    last_environ: bytes = b""

    def listen(self) -> None:
        """Bind a temporary name, then rename it over the socket: a stale socket (a helper
        that was killed) is replaced, and callers never see a half-made one. Only spares
        accept on it; this process forks them and keeps count."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        temporary = f"{self.path}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        listener.bind(temporary)
        listener.listen(128)
        os.rename(temporary, self.path)
        self.inode = os.stat(self.path).st_ino
        self.listener = listener
        wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_write)
        self.selector.register(wake_read, selectors.EVENT_READ, self._drain)
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(number, self._stop)
        self._replenish()

    def loop(self) -> None:
        while self.listener is not None or self.sessions:
            now = time.monotonic()
            idle = now - self.last_call >= self.idle
            if self.listener is not None and not self.sessions and idle:
                self.retire()
                continue
            timeout = min(self._next_deadline(now), CHECK_EVERY)
            for key, _ in self.selector.select(timeout):
                key.data(key.fileobj)
            self._kill_lingering()
            if self.listener is not None and not self._still_ours():
                self.retire()  # its folder was removed, or the socket replaced: nobody calls

    def _still_ours(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

    def _next_deadline(self, now: float) -> float:
        deadlines = [s.kill_at for s in self.sessions.values() if s.kill_at is not None]
        if self.listener is not None and not self.sessions:
            deadlines.append(self.last_call + self.idle)
        return max(0.0, min(deadlines) - now) if deadlines else 60.0

    def retire(self) -> None:
        """Stop taking calls: the spare and the socket go, then the lock (a successor may
        start at once). Calls under way run to their end."""
        if self.listener is None:
            return
        for spare_ in list(self.spares.values()):
            self._drop_spare(spare_)
        self.code.watch.close()
        if self._still_ours():
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        self.listener.close()
        self.listener = None
        os.close(self.lock)

    def _stop(self, number: int, frame: Any) -> None:
        self.stopping = True

    def _drain(self, fd: Any) -> None:
        with contextlib.suppress(OSError):
            os.read(fd, 512)
        if self.stopping and self.listener is not None:
            self.retire()
            for session in self.sessions.values():
                self._end(session, STOP_GRACE, (signal.SIGTERM, signal.SIGCONT))

    # ---- spares

    def _replenish(self, busy: int | None = None) -> None:
        """Fork spares until SPARES wait. `busy`: the pidfd of the call just taken; a new
        spare warms up once it ended (a warm-up beside the call would take CPU from it: ~5 ms
        of a 2-CPU machine); the other spare, warm already, takes the next call meanwhile."""
        renewed = self.code.renewed()
        if renewed is None:
            self.retire()  # the code changed: the next call finds no helper, and starts one
            return
        if renewed is not self.code:
            self.code.watch.close()
            self.code = renewed
        while self.listener is not None and len(self.spares) < SPARES:
            try:
                self._fork_spare(busy)
            except OSError:  # out of processes (RLIMIT_NPROC) or memory: serve with fewer
                if not self.spares:
                    self.retire()  # none to take a call: callers run it themselves
                return

    def _fork_spare(self, busy: int | None) -> None:
        assert self.listener is not None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        helper = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            raise
        if pid == 0:
            ours.close()
            warm = (self.last_environ, busy)
            spare(self.listener, theirs, self.code, warm, helper)
        theirs.close()
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # out of fds: a spare it cannot watch must not take calls
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            ours.close()
            raise
        spare_ = Spare(pid, pidfd, ours)
        self.spares[pid] = spare_
        self.selector.register(ours, selectors.EVENT_READ, lambda _: self._spare_says(spare_))
        self.selector.register(spare_.pidfd, selectors.EVENT_READ, lambda _: self._ended(spare_))

    def _spare_says(self, spare_: Spare) -> None:
        """The spare took a call (its connection comes along), or found the code changed."""
        message, fds = read_spare_message(spare_.control)
        if message[:1] in (TOOK, TOOK_TO_RETURN) and fds:
            self.last_call = time.monotonic()
            self.last_environ = message[1:]
            del self.spares[spare_.pid]
            conn = socket.socket(fileno=fds[0])
            if message[:1] == TOOK:
                self.selector.unregister(spare_.control)
                spare_.control.close()
                self._track(spare_.pid, spare_.pidfd, conn)
            else:
                self._track(spare_.pid, spare_.pidfd, conn, spare_.control)
            if message[:1] == TOOK or not self.spares:  # else it comes back, another waits
                self._replenish(busy=spare_.pidfd)
            return
        for fd in fds:
            os.close(fd)
        if message == LEFT:
            self.retire()
        elif not message:
            self.selector.unregister(spare_.control)  # it died: _ended follows

    def _ended(self, spare_: Spare) -> None:
        if spare_.pid not in self.spares or os.waitpid(spare_.pid, os.WNOHANG)[0] == 0:
            return
        self._close_spare(spare_)
        if self.listener is not None:
            self._replenish()  # a spare that failed: the next; SIGKILLed ones are not kept

    def _drop_spare(self, spare_: Spare) -> None:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(spare_.pidfd, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(spare_.pid, 0)
        self._close_spare(spare_)

    def _close_spare(self, spare_: Spare) -> None:
        for thing in (spare_.control, spare_.pidfd):
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(thing)
        spare_.control.close()
        os.close(spare_.pidfd)
        self.spares.pop(spare_.pid, None)

    # ---- calls

    def _track(
        self, pid: int, pidfd: int, conn: socket.socket, control: socket.socket | None = None
    ) -> None:
        session = Session(pid, pidfd, conn, control=control)
        self.sessions[pid] = session
        self.selector.modify(pidfd, selectors.EVENT_READ, lambda _: self._reap(session))
        self.selector.register(conn, selectors.EVENT_READ, lambda _: self._check(session))
        if control is not None:
            self.selector.modify(control, selectors.EVENT_READ, lambda _: self._returns(session))

    def _returns(self, session: Session) -> None:
        """A child that may serve again says its call ended cleanly (it tells the stub the
        exit code itself): it is a spare again while fewer than SPARES wait, else it leaves."""
        if session.control is None or self.sessions.get(session.pid) is not session:
            return  # an event of the same round, handled already
        message, fds = read_spare_message(session.control)
        for fd in fds:
            os.close(fd)
        if message != ENDED:  # it died: _reap follows
            self.selector.unregister(session.control)
            session.control.close()
            session.control = None
            return
        if session.conn is not None:
            self.selector.unregister(session.conn)
            session.conn.close()
            session.conn = None
        told_to_end = session.kill_at is not None  # its stub went away during the call
        if self.listener is None or len(self.spares) >= SPARES or told_to_end:
            with contextlib.suppress(OSError):
                session.control.sendall(LEAVE)
            return  # it leaves, and _reap closes the rest
        del self.sessions[session.pid]
        spare_ = Spare(session.pid, session.pidfd, session.control)
        self.spares[spare_.pid] = spare_
        self.selector.modify(
            spare_.control, selectors.EVENT_READ, lambda _: self._spare_says(spare_)
        )
        self.selector.modify(spare_.pidfd, selectors.EVENT_READ, lambda _: self._ended(spare_))
        self.last_call = time.monotonic()
        with contextlib.suppress(OSError):
            spare_.control.sendall(SERVE_AGAIN)

    def _check(self, session: Session) -> None:
        """The stub's connection is readable: it went away (killed) unless it sent bytes; or
        the call ended in a child that serves again, which the helper has not read yet."""
        if session.conn is None:
            return  # an event of the same round, handled already (_returns, _reap)
        try:
            gone = not session.conn.recv(64)
        except OSError:
            gone = True
        if gone and session.control is not None and _readable(session.control):
            self._returns(session)
        if gone and session.conn is not None:
            self._hangup(session)

    def _hangup(self, session: Session) -> None:
        if session.conn is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(session.conn)
            session.conn.close()
            session.conn = None
        self._end(session, HANGUP_GRACE, (signal.SIGHUP, signal.SIGTERM, signal.SIGCONT))

    def _end(self, session: Session, grace: float, signals: tuple[int, ...]) -> None:
        for number in signals:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(session.pidfd, number)
        if session.kill_at is None:
            session.kill_at = time.monotonic() + grace

    def _kill_lingering(self) -> None:
        now = time.monotonic()
        for session in self.sessions.values():
            if session.kill_at is not None and now >= session.kill_at:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(session.pidfd, signal.SIGKILL)
                session.kill_at = now + HANGUP_GRACE

    def _reap(self, session: Session) -> None:
        if self.sessions.get(session.pid) is not session:
            return  # an event of the same round: the child is a spare again (_returns)
        pid, status = os.waitpid(session.pid, os.WNOHANG)
        if pid == 0:
            return
        self.selector.unregister(session.pidfd)
        os.close(session.pidfd)
        del self.sessions[session.pid]
        if session.conn is not None:
            self.selector.unregister(session.conn)
            with contextlib.suppress(OSError):
                session.conn.sendall(answer(EXIT, status))
            session.conn.close()
        self.last_call = time.monotonic()
        if session.control is not None:  # a child that might have come back, and did not
            self.selector.unregister(session.control)
            session.control.close()
            session.control = None
        if self.listener is not None and len(self.spares) < SPARES:
            self._replenish()  # one that might have come back did not


# ---- the helper process --------------------------------------------------------------------


def serve(path: str) -> None:
    """The helper's main (started by start_helper): lock, load, listen, serve, leave."""
    os.closerange(3, 1 << 20)  # nothing of the first caller's but what it means to pass
    os.chdir("/")
    if not private_folder(os.path.dirname(path), os.getuid()):
        os._exit(0)
    lock = os.open(lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os._exit(0)  # another helper serves (or is starting): it wins
    os.ftruncate(lock, 0)
    os.pwrite(lock, str(os.getpid()).encode(), 0)
    before = code_fingerprint()  # before loading: a change while loading is seen
    preload()
    code = CodeCheck.taken(loaded_before=before)  # now with the dependencies' folders
    if not private_folder(os.path.dirname(path), os.getuid()):
        os._exit(0)  # removed while loading (a test session ended)
    import gc

    gc.freeze()  # children then leave the loaded objects' pages shared
    helper = Helper(path, lock, code, _idle())
    helper.listen()
    helper.loop()
    os._exit(0)


def _readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def _idle() -> float:
    try:
        value = float(os.environ.get(IDLE_VAR, DEFAULT_IDLE))
    except ValueError:
        return DEFAULT_IDLE
    return value if value > 0 else DEFAULT_IDLE
