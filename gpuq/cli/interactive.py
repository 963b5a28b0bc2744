"""Interactive jobs: `gpuq run [options] -- CMD [ARGS]` (srun --pty) and `gpuq alloc [options]`
(salloc: a shell on the node with the allocation).

The job queues like any other; once it runs, its command sits on a pty on its node and this
terminal is connected to it through the coordinator (Client.attach). While it runs, a terminal
stdin is in raw mode, so every key (Ctrl-C, Ctrl-Z, Ctrl-D) is a byte the job's own terminal
turns into a signal or an end of file, as with ssh; a pipe's bytes go as they are, then an end
of file, and SIGINT, SIGTERM and SIGHUP are passed on to the job. The job lives as long as this
command: when it goes away (interrupted while the job waits, killed, its terminal closed), the
job is cancelled. The exit code is the command's (128 + N when signal N killed it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import struct
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

import click

from gpuq.cli.job_verbs import submit_options
from gpuq.errors import ServerUnavailable, Unsatisfiable

RUN_SCRIPT = 'exec "$@"'  # gpuq run: the command and its arguments as given
ALLOC_SCRIPT = 'exec "${SHELL:-/bin/sh}"'  # gpuq alloc: the user's shell (passwd's, on the node)
# submit options that do not apply: one job, on a terminal (no output files), started now
NOT_INTERACTIVE = frozenset({"array", "output", "error", "hold"})
EXIT_FAILED = 1
READ_SIZE = 16 << 10
DOUBLE_INTERRUPT = 1.0  # seconds: a second Ctrl-C this soon leaves (stdin not a terminal)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
REATTACH_FOR = 45.0  # seconds: within the coordinator's grace for a detached job (60 s)


def interactive_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The submit flags that make sense for an interactive job (gpuq.options.OPTIONS)."""
    return submit_options(command, skip=NOT_INTERACTIVE)


class StepOrJob(click.Command):
    """`gpuq run` inside a job (gpuq.steps.inside_job) is a job step, as srun is there: its
    arguments go unparsed to gpuq.steps.srun_main (srun's options, not submit's); elsewhere it
    is the interactive job below."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from gpuq.steps import inside_job

        if inside_job(os.environ):
            ctx.meta[STEP_ARGS] = list(args)
            return []
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        if STEP_ARGS not in ctx.meta:
            return super().invoke(ctx)
        from gpuq.steps.srun_main import run_gpuq

        if "gpuq.cli.fast.become_caller" in sys.modules:
            # a CLI helper's child is not in the job's process tree, cgroup or device rules:
            # tasks started from here would escape them
            _say(
                "gpuq run: error: inside a job a step must start from the job itself: "
                "set GPUQ_CLI_HELPER=off in the job (or use srun)"
            )
            return 2
        return run_gpuq(ctx.meta[STEP_ARGS])


STEP_ARGS = "gpuq.step_args"


@click.command(cls=StepOrJob, context_settings={"allow_interspersed_args": False})
@click.argument("command", nargs=-1, required=True, metavar="[--] CMD [ARGS]...")
@click.option("--quiet", "-Q", is_flag=True, help="no messages about the job's state")
@interactive_options
@click.pass_obj
def run(obj: Any, /, command: tuple[str, ...], quiet: bool, **options: Any) -> int:
    """Run CMD as a job with this terminal attached (srun --pty): it waits in the queue (the
    reason is shown), then runs on a pty on its node with its GPUs; keys, window size and
    Ctrl-C reach it; the exit code is CMD's. Ctrl-C while it waits cancels it. Inside a job,
    a step over the job's nodes instead, as srun: gpuq run [-n N] [-N N] [--ntasks-per-node N]
    [--gpus-per-task G] [--output PAT] [--label] [--kill-on-bad-exit 0|1] -- CMD."""
    name = options.pop("name", None) or _job_name(command[0])
    spec = interactive_spec(RUN_SCRIPT, command, "--run", name, options)
    return attach_session(obj.client(), spec, quiet)


@click.command()
@click.option("--quiet", "-Q", is_flag=True, help="no messages about the job's state")
@interactive_options
@click.pass_obj
def alloc(obj: Any, /, quiet: bool, **options: Any) -> int:
    """A shell on a node with the allocation (salloc): your login shell, with the job's GPUs
    (CUDA_VISIBLE_DEVICES), CPUs and memory limits. The job ends when the shell exits or its
    time limit is reached."""
    name = options.pop("name", None) or "alloc"
    spec = interactive_spec(ALLOC_SCRIPT, (), "--alloc", name, options)
    return attach_session(obj.client(), spec, quiet)


def interactive_spec(
    script: str, args: Sequence[str], source: str, name: str, options: dict[str, Any]
) -> Any:
    """A JobSpec for `script` with this terminal's shape (gpuq.submission.build_spec does
    the options, as for gpuq submit)."""
    from gpuq.domain.interactive_jobs import Terminal
    from gpuq.submission import build_spec

    notes: list[str] = []
    spec = build_spec(wrap=script, args=tuple(args), name=name, warnings=notes, **options)
    for note in notes:
        _say(f"gpuq: warning: {note}")
    return replace(spec, source=source, terminal=Terminal(*local_terminal()))


def local_terminal() -> tuple[int, int, str, bool, bool]:
    """(rows, cols, TERM, stdin is a terminal, stdout is a terminal)."""
    rows, cols = window_size()
    term = os.environ.get("TERM", "")
    if not re.fullmatch(r"[A-Za-z0-9_.+-]{0,64}", term):
        term = ""
    return rows or 24, cols or 80, term, os.isatty(0), os.isatty(1)


def window_size() -> tuple[int, int]:
    """The terminal's rows and columns (from stdin, stdout or stderr); (0, 0) without one."""
    for fd in (0, 1, 2):
        try:
            packed = fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
        except OSError:
            continue
        rows, cols = struct.unpack("HHHH", packed)[:2]
        if rows and cols:
            return rows, cols
    return 0, 0


def _job_name(command: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+@=:,-]", "_", Path(command).name)[:128] or "run"


def attach_session(client: Any, spec: Any, quiet: bool) -> int:
    job_id = client.submit_spec(spec)[0]
    return Session(client, job_id, quiet).run()


class Session:
    """One attached interactive job, from its submission to its end: the terminal's mode,
    signals, stdin, and the coordinator's replies."""

    def __init__(self, client: Any, job_id: int, quiet: bool) -> None:
        self.client = client
        self.attachment = client.attach(job_id)
        self.job_id = job_id
        self.lost_at: float | None = None  # when the coordinator went away (None: it is here)
        self.quiet = quiet
        self.stdin_tty = os.isatty(0)
        self.running = threading.Event()
        self.saved: list[Any] | None = None  # stdin's terminal mode while it is raw
        self.left: int | None = None  # the exit code, when this command ended the stream
        self.last_interrupt = 0.0
        self.sent_size = window_size()  # the size the job's terminal was last given
        self._lock = threading.Lock()

    def run(self) -> int:
        previous = self._install_signals()
        try:
            threading.Thread(target=self._pump, name="stdin", daemon=True).start()
            while True:
                try:
                    return self._follow()
                except ServerUnavailable:
                    if not self._reattach():
                        raise
                except Unsatisfiable:  # attached again, but it ended meanwhile
                    if self.lost_at is None:
                        raise
                    return self._ended_meanwhile()
        finally:
            self._cooked()
            for number, handler in previous.items():
                signal.signal(number, handler)
            self.attachment.close()

    # ---- what the coordinator says -------------------------------------------------------

    def _follow(self) -> int:
        """The replies of the attachment, to the job's end (its exit code) or ours."""
        for reply in self.attachment.replies():
            self.lost_at = None
            if reply.output:
                _write(reply.output)
            if reply.ended:
                return self._ended(reply)
            if reply.state:
                self._state(reply.state, reply.reason, reply.node)
        return self.left if self.left is not None else EXIT_FAILED

    def _reattach(self) -> bool:
        """The coordinator went away (a restart, a standby taking over): attach again, for
        up to REATTACH_FOR seconds (within its grace the job runs on). False: give up."""
        now = time.monotonic()
        if self.left is not None:
            return False
        if self.lost_at is None:
            self.lost_at = now
            self._tell(f"gpuq: job {self.job_id}: lost the coordinator; attaching again")
        if now - self.lost_at > REATTACH_FOR:
            return False
        time.sleep(1.0)
        with contextlib.suppress(ServerUnavailable):
            self.attachment = self.client.attach(self.job_id)
        return True

    def _state(self, state: str, reason: str, node: str) -> None:
        if state == "running":
            self._raw()  # first: what is typed from now on goes to the job, unechoed here
            self._tell(f"gpuq: job {self.job_id} running on {_shown(node)}")
            self.running.set()
            return
        if self.running.is_set():  # back in the queue (requeued)
            self.running.clear()
            self._cooked()
        what = "queued" if state == "pending" else _shown(state)
        self._tell(f"gpuq: job {self.job_id} {what}: {_shown(reason)}")

    def _ended(self, reply: Any) -> int:
        self._cooked()
        result = reply.result
        code = exit_status(
            reply.state,
            result.exit_code if result.HasField("exit_code") else None,
            result.signal if result.HasField("signal") else None,
        )
        own_exit = reply.state in ("completed", "failed") and not result.signal
        if not own_exit or not result.HasField("exit_code"):
            self._tell(f"gpuq: job {self.job_id} {_shown(reply.state)}: {_shown(reply.reason)}")
        return code

    def _ended_meanwhile(self) -> int:
        """The job's end, read from its record (its output since the loss is lost)."""
        self._cooked()
        job = self.client.get(self.job_id)
        result = job.result
        exit_code, number = (result.exit_code, result.signal) if result else (None, None)
        self._tell(f"gpuq: job {self.job_id} {job.state.value}: {_shown(job.reason)}")
        return exit_status(job.state.value, exit_code, number)

    def _tell(self, line: str) -> None:
        if not self.quiet:
            _say(line, raw=self.saved is not None)

    # ---- the local terminal --------------------------------------------------------------

    def _raw(self) -> None:
        """Keys go to the job's terminal as bytes (its line discipline echoes and signals)."""
        with self._lock:
            if not self.stdin_tty or self.saved is not None:
                return
            try:
                self.saved = termios.tcgetattr(0)
                tty.setraw(0, termios.TCSANOW)
            except termios.error:
                self.saved = None

    def _cooked(self) -> None:
        with self._lock:
            if self.saved is not None:
                with contextlib.suppress(termios.error):
                    termios.tcsetattr(0, termios.TCSADRAIN, self.saved)
                self.saved = None

    def _pump(self) -> None:
        """Stdin to the job, from when it runs: a pipe's end is sent as such; a terminal's
        (it hung up) ends this command, and so the job."""
        self.running.wait()
        while True:
            try:
                data = os.read(0, READ_SIZE)
            except OSError:
                data = b""
            if not data:
                if self.stdin_tty:
                    self._leave(128 + signal.SIGHUP)
                else:
                    self.attachment.eof()
                return
            if self.stdin_tty:
                self._send_size()  # a resize just before these keys reaches the job first
            self.attachment.send(data)

    # ---- signals ---------------------------------------------------------------------------

    def _install_signals(self) -> dict[int, Any]:
        """SIGWINCH: the new size; SIGINT, SIGTERM, SIGHUP: to the job while it runs (with a
        terminal stdin, SIGINT only: the others mean this terminal is going), else leave.
        Nothing where signals cannot be handled (not the main thread)."""
        previous: dict[int, Any] = {}
        for number in (signal.SIGWINCH, *FORWARDED):
            try:
                previous[number] = signal.signal(number, self._on_signal)
            except ValueError:
                break
        return previous

    def _on_signal(self, number: int, frame: FrameType | None) -> None:
        if number == signal.SIGWINCH:
            self._send_size()
            return
        forward = self.running.is_set() and (not self.stdin_tty or number == signal.SIGINT)
        if number == signal.SIGINT and forward and not self.stdin_tty:
            now = time.monotonic()
            forward = now - self.last_interrupt > DOUBLE_INTERRUPT
            self.last_interrupt = now
        if forward:
            self.attachment.signal(number)
        else:
            self._leave(128 + number)

    def _send_size(self) -> None:
        """The window's size to the job, if it changed since it was last sent. Called on
        SIGWINCH, whose handler runs only when the main thread is back in Python (it may wait
        on the next reply), and before each input: keys typed after a resize find the job's
        terminal resized. Both may send the same size: the job's terminal takes it twice."""
        size = window_size()
        if size != self.sent_size:
            self.sent_size = size
            self.attachment.resize(*size)

    def _leave(self, code: int) -> None:
        """End the stream (the coordinator cancels the job), from another thread: a signal
        handler must not take gRPC's locks."""
        if self.left is None:
            self.left = code
            self._tell(f"gpuq: job {self.job_id}: interrupted; it is cancelled")
        threading.Thread(target=self.attachment.close, daemon=True).start()


def exit_status(state: str, exit_code: int | None, number: int | None) -> int:
    """The command's exit code; 128 + N when signal N killed it; else 0 for a completed job
    and 1 for one that ended otherwise (cancelled while waiting, its node failed...)."""
    if number:
        return 128 + int(number)
    if exit_code is not None:
        return int(exit_code) & 0xFF
    return 0 if state == "completed" else EXIT_FAILED


def _write(data: bytes) -> None:
    """Output as it came (binary), all of it."""
    view = memoryview(data)
    while view:
        written = os.write(1, view)
        view = view[written:]


def _say(line: str, raw: bool = False) -> None:
    """A line on stderr, written at once (also from a signal handler: no buffer to share)."""
    sys.stderr.flush()
    with contextlib.suppress(OSError):
        os.write(2, (line + ("\r\n" if raw else "\n")).encode(errors="replace"))


def _shown(text: str) -> str:
    from gpuq.cli.render import printable

    return printable(text)
