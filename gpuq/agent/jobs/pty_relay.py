"""Interactive jobs' terminals: the agent's end of each job's pseudo-terminal.

The supervisor (gpuq/agent/native/supervisor.c) opens an interactive job's pty before the job
starts, keeps its master open for its own life and hands the master fd (SCM_RIGHTS) to any
process of its own user that connects to `<job_dir>/pty.sock`. A relay here fetches that fd,
reads what the job writes as soon as it is there (asyncio add_reader: no polling, no heartbeat
wait) and writes what the submitter types. Because the supervisor holds the master, an agent
that restarts simply fetches it again: the job is neither hung up nor blocked for good, and
nothing is lost but what the earlier agent had read and not yet sent.

What the agent can rely on (it turns PtyEvents into PtyOutput, gpuq/agent/pty_outbox.py):
- data comes in order, in chunks of at most MAX_CHUNK bytes;
- `closed` comes exactly once per relay: when the terminal gives EOF/EIO (every process of the
  job closed it), or when finish() ends the relay; with `problem` when the terminal could not
  be had (one line);
- finish(), which the agent awaits before it reports a job's end, first drains what the job left
  in the terminal (even while paused: the kernel's pty buffers bound it to some 64 KiB), so all
  output precedes the end.
Input the terminal cannot take at once waits in a buffer of PENDING_INPUT_MAX bytes (written as
the terminal drains); beyond that it is dropped, with a log line at most every DROP_LOG_EVERY.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import socket
import struct
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)
PTY_SOCKET = "pty.sock"  # in the job folder (supervisor.c's PTY_SOCKET)
MAX_CHUNK = 65536  # bytes of output per event (and per PtyOutput)
PENDING_INPUT_MAX = 1 << 20  # bytes of input waiting for the terminal, at most
DROP_LOG_EVERY = 60.0  # seconds between two log lines about dropped input, at least
ATTACH_TIMEOUT = 5.0  # seconds to get the master from the supervisor
DRAIN_QUIET = 0.1  # at the end: seconds without output (and without EIO) that end the drain
DRAIN_MAX = 1.0  # at the end: seconds of draining at most (a process outside the job writes)
SUN_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path less its NUL)


@dataclass(frozen=True, slots=True)
class PtyEvent:
    """Output of a job's terminal, or its end (`closed`, with `problem` when it failed)."""

    job_id: int
    attempt: int
    data: bytes = b""
    closed: bool = False
    problem: str = ""


@dataclass(slots=True)
class _Relay:
    job_id: int
    attempt: int
    fd: int | None = None  # the master, non-blocking; None until fetched
    fetching: asyncio.Task[None] | None = None
    finishing: bool = False  # the job ended: drain, then close
    paused: bool = False  # by the coordinator (its submitter is behind)
    hung_up: bool = False  # EOF/EIO: every process of the job closed the terminal
    closed_sent: bool = False
    reading: bool = False
    writing: bool = False
    pending: bytearray = field(default_factory=bytearray)  # input not yet taken
    last_byte: bytes = b"\n"  # the last byte of input queued (for EOF: see eof())
    size: tuple[int, int] | None = None  # a window size given before the master came
    dropped_logged: float = -DROP_LOG_EVERY


class Terminals:
    """The relays of the interactive jobs this node runs, by job id.

    `on_output` gets every PtyEvent, synchronously, in order. Errors in it are logged."""

    def __init__(self, on_output: Callable[[PtyEvent], None]) -> None:
        self.on_output = on_output
        self.relays: dict[int, _Relay] = {}
        self.throttled = False  # the agent's queue is full: nobody reads until it drains

    # ---- life cycle ----

    def add(self, job_id: int, attempt: int) -> None:
        """An interactive job is being started (or was found running): input for it is kept
        from now on, until its terminal is fetched."""
        relay = self.relays.get(job_id)
        if relay is None:
            self.relays[job_id] = _Relay(job_id, attempt)
        elif not relay.attempt:
            relay.attempt = attempt

    def attach(self, job_id: int, job_dir: Path) -> None:
        """Fetch the job's terminal from its supervisor and start relaying (once per relay)."""
        relay = self.relays.get(job_id)
        if relay is None or relay.fetching is not None or relay.closed_sent:
            return
        loop = asyncio.get_running_loop()
        relay.fetching = loop.create_task(self._fetch(relay, job_dir), name=f"pty-{job_id}")

    def discard(self, job_id: int) -> None:
        """The job did not start: forget its relay without a word."""
        relay = self.relays.pop(job_id, None)
        if relay is not None:
            relay.closed_sent = True
            self._release(relay)

    async def finish(self, job_id: int, attempt: int = 0) -> None:
        """The job ended: send what is left in its terminal, then `closed`, then let it go.
        A job without a relay still gets its `closed`."""
        relay = self.relays.pop(job_id, None)
        if relay is None:
            self._emit(PtyEvent(job_id, attempt, closed=True))
            return
        relay.finishing = True
        self._update(relay)
        if relay.fetching is not None and not relay.fetching.done():
            await asyncio.wait({relay.fetching}, timeout=ATTACH_TIMEOUT + 1)
        if relay.fd is not None and not relay.hung_up:
            await self._drain(relay)
        self._close(relay)

    def close_all(self) -> None:
        """The agent stops: let every terminal go without a word (the supervisors keep them,
        and the next agent fetches them again)."""
        for relay in self.relays.values():
            relay.closed_sent = True
            self._release(relay)
        self.relays.clear()

    # ---- what the coordinator says ----

    def input(
        self,
        job_id: int,
        attempt: int,
        *,
        data: bytes = b"",
        rows: int = 0,
        cols: int = 0,
        eof: bool = False,
        pause: bool = False,
        resume: bool = False,
    ) -> bool:
        """Apply one PtyInput (flow control, window size, keystrokes, end of input, in that
        order); False when this node relays no terminal of that job's start."""
        relay = self.relays.get(job_id)
        if relay is None or relay.closed_sent:
            return False
        if attempt and relay.attempt and attempt != relay.attempt:  # 0: either cannot tell
            return False
        if pause:
            relay.paused = True
        if resume:
            relay.paused = False
        if 0 < rows <= 65535 and 0 < cols <= 65535:  # a winsize holds 16 bits; else ignored
            relay.size = (rows, cols)
            self._resize(relay)
        if data:
            self._queue(relay, data)
        if eof:
            self._queue(relay, self._eof_bytes(relay))
        self._update(relay)
        return True

    def throttle(self, on: bool) -> None:
        """Stop (or restart) reading every terminal: the agent's own queue is full."""
        if on != self.throttled:
            self.throttled = on
            for relay in self.relays.values():
                self._update(relay)

    def resume_all(self) -> None:
        """A new session with a coordinator: pauses of the last one no longer hold."""
        for relay in self.relays.values():
            relay.paused = False
            self._update(relay)

    # ---- the terminal ----

    async def _fetch(self, relay: _Relay, job_dir: Path) -> None:
        try:
            fd = await asyncio.wait_for(fetch_master(job_dir), ATTACH_TIMEOUT)
        except (OSError, TimeoutError) as error:
            problem = f"cannot reach the job's terminal: {error or type(error).__name__}"
            log.warning("job %d: %s", relay.job_id, problem)
            self._close(relay, problem)
            return
        if relay.closed_sent:  # let go meanwhile
            os.close(fd)
            return
        relay.fd = fd
        self._resize(relay)
        self._write(relay)
        self._update(relay)

    def _update(self, relay: _Relay) -> None:
        """Read while the job's output is wanted, write while input waits."""
        if relay.fd is None:
            return
        loop = asyncio.get_running_loop()
        read = not (relay.paused or self.throttled or relay.finishing or relay.hung_up)
        if read and not relay.closed_sent and not relay.reading:
            loop.add_reader(relay.fd, self._readable, relay)
            relay.reading = True
        elif not read and relay.reading:
            loop.remove_reader(relay.fd)
            relay.reading = False
        write = bool(relay.pending) and not relay.closed_sent
        if write and not relay.writing:
            loop.add_writer(relay.fd, self._write, relay)
            relay.writing = True
        elif not write and relay.writing:
            loop.remove_writer(relay.fd)
            relay.writing = False

    def _read(self, relay: _Relay) -> bytes | None:
        """One read: the bytes, b"" at EOF/EIO, None when there is nothing now."""
        assert relay.fd is not None
        try:
            return os.read(relay.fd, MAX_CHUNK)
        except BlockingIOError:
            return None
        except InterruptedError:
            return None
        except OSError as error:  # EIO: the job's processes all closed it
            if error.errno != errno.EIO:
                log.warning("job %d: reading its terminal: %s", relay.job_id, error)
            return b""

    def _readable(self, relay: _Relay) -> None:
        data = self._read(relay)
        if data is None:
            return
        if data:
            self._emit(PtyEvent(relay.job_id, relay.attempt, data))
            return
        relay.hung_up = True
        self._update(relay)
        self._emit(PtyEvent(relay.job_id, relay.attempt, closed=True))
        relay.closed_sent = True
        self._update(relay)

    async def _drain(self, relay: _Relay) -> None:
        """What the job left: at once up to EIO when all its processes are gone (the kernel
        hands over what they wrote first); else until DRAIN_QUIET of silence."""
        start = time.monotonic()
        quiet_since = start
        while relay.fd is not None:
            data = self._read(relay)
            now = time.monotonic()
            if data == b"":
                return
            if data:
                self._emit(PtyEvent(relay.job_id, relay.attempt, data))
                quiet_since = now
            elif now - quiet_since >= DRAIN_QUIET:
                return
            else:
                await asyncio.sleep(0.01)
            if now - start >= DRAIN_MAX:
                return

    def _resize(self, relay: _Relay) -> None:
        """TIOCSWINSZ: the kernel sends SIGWINCH to the job's foreground process group."""
        if relay.fd is None or relay.size is None:
            return
        rows, cols = relay.size
        with contextlib.suppress(OSError):
            fcntl.ioctl(relay.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def _eof_bytes(self, relay: _Relay) -> bytes:
        """The terminal's VEOF character: once ends input at the start of a line, so twice
        after anything but a newline (the first only passes the partial line on)."""
        veof = b"\x04"
        if relay.fd is not None:
            with contextlib.suppress(OSError, termios.error, IndexError, TypeError):
                char = termios.tcgetattr(relay.fd)[6][termios.VEOF]
                if isinstance(char, bytes) and len(char) == 1:
                    veof = char
        return veof if relay.last_byte == b"\n" else veof * 2

    def _queue(self, relay: _Relay, data: bytes) -> None:
        room = PENDING_INPUT_MAX - len(relay.pending)
        if len(data) > room:
            now = time.monotonic()
            if now - relay.dropped_logged >= DROP_LOG_EVERY:
                relay.dropped_logged = now
                log.warning(
                    "job %d: its terminal takes no more input; dropping %d bytes (and any more "
                    "for a minute without saying)",
                    relay.job_id,
                    len(data) - max(room, 0),
                )
            data = data[: max(room, 0)]
        if data:
            relay.pending += data
            relay.last_byte = data[-1:]
            self._write(relay)

    def _write(self, relay: _Relay) -> None:
        """As much pending input as the terminal takes now (non-blocking)."""
        while relay.fd is not None and relay.pending:
            try:
                written = os.write(relay.fd, relay.pending)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as error:  # nobody reads it any more (EIO)
                log.info("job %d: input not delivered: %s", relay.job_id, error)
                relay.pending.clear()
                break
            del relay.pending[:written]
        self._update(relay)

    def _emit(self, event: PtyEvent) -> None:
        try:
            self.on_output(event)
        except Exception:
            log.exception("relaying the terminal of job %d failed", event.job_id)

    def _close(self, relay: _Relay, problem: str = "") -> None:
        if not relay.closed_sent:
            relay.closed_sent = True
            self._emit(PtyEvent(relay.job_id, relay.attempt, closed=True, problem=problem))
        self._release(relay)

    def _release(self, relay: _Relay) -> None:
        fetching = relay.fetching
        if fetching is not None and not fetching.done() and fetching is not asyncio.current_task():
            fetching.cancel()
        if relay.fd is None:
            return
        loop = asyncio.get_running_loop()
        if relay.reading:
            loop.remove_reader(relay.fd)
        if relay.writing:
            loop.remove_writer(relay.fd)
        relay.reading = relay.writing = False
        os.close(relay.fd)
        relay.fd = None


async def fetch_master(job_dir: Path) -> int:
    """The master fd of a job's terminal from its supervisor's pty.sock: non-blocking and
    close-on-exec. PermissionError when the supervisor refuses (not its user)."""
    loop = asyncio.get_running_loop()
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        sock.setblocking(False)
        path = str(Path(job_dir) / PTY_SOCKET)
        if len(os.fsencode(path)) > SUN_PATH_MAX:  # through the folder's fd: any length
            folder = os.open(job_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            stack.callback(os.close, folder)
            path = f"/proc/self/fd/{folder}/{PTY_SOCKET}"
        await loop.sock_connect(sock, path)
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(sock, 1, 1, socket.MSG_CMSG_CLOEXEC)
                break
            except (BlockingIOError, InterruptedError):
                await _readable(loop, sock)
    for extra in fds[1:]:
        os.close(extra)
    if data != b"T" or not fds:
        for fd in fds[:1]:
            os.close(fd)
        raise PermissionError(f"the supervisor gave no terminal (answer {data!r})")
    os.set_blocking(fds[0], False)
    return fds[0]


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())
