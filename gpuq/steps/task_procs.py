"""One task of a step as a local process: started in its own process group, its stdout and
stderr read by threads and handed on in chunks, its end reported once (code or signal), and
stopped as a whole group (SIGTERM, then SIGKILL STOP_GRACE seconds later).

Used alike by srun for the leader's own tasks and by a follower's step worker, so a task on
any node starts, streams and ends the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO

STOP_GRACE = 2.0  # seconds between SIGTERM and SIGKILL, as srun's KillWait-like pause
CHUNK = 64 << 10
LEFTOVER_WAIT = 1.0  # seconds: a task's pipes still open after it ended (a background child)
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126

OutputSink = Callable[[int, int, bytes], None]  # rank, fd (1 or 2), data
ExitSink = Callable[[int, int | None, int | None], None]  # rank, exit code, signal


class TaskProcess:
    """A task; `on_output` and `on_exit` are called from its threads."""

    def __init__(
        self,
        rank: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None,
        on_output: OutputSink,
        on_exit: ExitSink,
        stdin_inherit: bool = False,
    ) -> None:
        self.rank = rank
        self.argv = list(argv)
        self.env = dict(env)
        self.cwd = cwd
        self.on_output = on_output
        self.on_exit = on_exit
        self.stdin_inherit = stdin_inherit
        self.proc: subprocess.Popen[bytes] | None = None
        self.ended = threading.Event()
        self._lock = threading.Lock()
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        """Start it; a command that cannot start ends at once with 127/126 and a line on its
        stderr, as a shell would say it."""
        try:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=None if self.stdin_inherit else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                process_group=0,
                close_fds=True,
            )
        except OSError as exc:
            code = EXIT_NOT_EXECUTABLE if isinstance(exc, PermissionError) else EXIT_NOT_FOUND
            where = exc.filename if exc.filename is not None else self.argv[0]
            self.on_output(self.rank, 2, f"srun: error: {where}: {exc.strerror}\n".encode())
            self.ended.set()
            self.on_exit(self.rank, code, None)
            return
        assert self.proc.stdout is not None and self.proc.stderr is not None
        readers = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, 1), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, 2), daemon=True),
        ]
        for reader in readers:
            reader.start()
        threading.Thread(target=self._wait, args=(readers,), daemon=True).start()

    def _pump(self, stream: IO[bytes], fd: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            while True:
                data = os.read(stream.fileno(), CHUNK)
                if not data:
                    break
                self.on_output(self.rank, fd, data)
        with contextlib.suppress(OSError):
            stream.close()

    def _wait(self, readers: list[threading.Thread]) -> None:
        assert self.proc is not None
        status = self.proc.wait()
        for reader in readers:
            reader.join(LEFTOVER_WAIT)
        # what the task left behind in its group (a background child holding the pipes) goes
        # with it, as a step's processes do when its tasks end
        self._signal_group(signal.SIGKILL)
        for reader in readers:
            reader.join()
        self.ended.set()
        if status < 0:
            self.on_exit(self.rank, None, -status)
        else:
            self.on_exit(self.rank, status, None)

    def signal(self, number: int) -> None:
        if not self.ended.is_set():
            self._signal_group(number)

    def _signal_group(self, number: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, number)

    def stop(self) -> None:
        """SIGTERM to its whole group now, SIGKILL STOP_GRACE seconds later if still there."""
        with self._lock:
            if self._stopping or self.ended.is_set():
                return
            self._stopping = True
        self.signal(signal.SIGTERM)
        timer = threading.Timer(STOP_GRACE, self._kill_if_alive)
        timer.daemon = True
        timer.start()

    def _kill_if_alive(self) -> None:
        if not self.ended.is_set():
            self._signal_group(signal.SIGKILL)


def exit_status(code: int | None, signal_number: int | None) -> int:
    """An exit as srun reports it: the code, or 128 + the signal that killed the task."""
    if signal_number is not None:
        return 128 + signal_number
    return code if code is not None else 1
