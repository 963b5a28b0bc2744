"""srun inside a gpuq job: `python -m gpuq.steps.srun_main [options] CMD` (the `srun` shim),
and `gpuq run [options] -- CMD` inside a job (gpuq.cli.interactive hands over to run_gpuq).

One step: the tasks are laid out over the job's nodes (gpuq.steps.task_layout), the first
node's run here as children of this process (each in its own process group), every other
node's through that node's step worker (gpuq.steps.step_worker, over gpuq.steps.step_wire).
Every task's output comes here and goes to srun's stdout/stderr or the --output files. The
exit code is the worst task's (128 + N for a task killed by signal N).

One job, one fate (SLURM's KillOnBadExit=1, the default; -K0 turns it off): when a task exits
non-zero, every other task of the step on every node is stopped at once (SIGTERM, SIGKILL two
seconds later), and the job is ended through the coordinator, `Client.fail_job(job, reason)`,
with a reason such as "task 1 on gpu02 exited 1 at 12:03:04; tasks 0,2-3 were stopped". Should
the coordinator not answer, the batch script's process group is ended from here instead, so the
job ends either way. SIGINT or SIGTERM to srun stops every task too, and srun exits 128 + N.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any

from gpuq.errors import InvalidInput
from gpuq.steps.srun_options import USAGE, SrunOptions, parse
from gpuq.steps.step_output import OutputRouter
from gpuq.steps.step_remote import RemoteNode, StepEvent
from gpuq.steps.step_wire import ProtocolError, parse_key
from gpuq.steps.task_layout import (
    JobShape,
    Layout,
    StepRequest,
    bind_gpus,
    compact_ranks,
    job_shape,
    plan,
    task_env,
)
from gpuq.steps.task_procs import STOP_GRACE, TaskProcess, exit_status

EXIT_USAGE = 2
EXIT_FAILED = 1
END_WAIT = STOP_GRACE + 3.0  # seconds to wait for stopped tasks to report their end
FAIL_JOB_TIMEOUT = 30.0  # seconds for the coordinator to take the job's end
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2)  # passed on to every task, as srun does
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# a job's variables that describe one torchelastic-style process, never the whole step's
PER_TASK_ONLY = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK")

FailJob = Callable[[int, str], None]


def main(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    fail_job: FailJob | None = None,
    fallback_pgid: int | None = -1,
) -> int:
    """srun's entry point. `fail_job` and `fallback_pgid` (-1: this process's group) are for
    tests and for `gpuq run` (which must never end a CLI helper's group)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return run_step(args, "srun", False, environ, fail_job, fallback_pgid)


def run_gpuq(args: Sequence[str], fallback_pgid: int | None = -1) -> int:
    """`gpuq run [options] -- CMD` inside a job (gpuq.cli.interactive)."""
    return run_step(list(args), "gpuq run", True, None, None, fallback_pgid)


def run_step(
    args: list[str],
    prog: str,
    gpuq_style: bool,
    environ: Mapping[str, str] | None,
    fail_job: FailJob | None,
    fallback_pgid: int | None,
) -> int:
    env = dict(os.environ if environ is None else environ)
    try:
        options = parse(args, gpuq=gpuq_style, prog=prog)
        if options.help:
            sys.stdout.write(USAGE)
            return 0
        for line in options.warnings:
            _say(line)
        step = Step(options, env, prog, fail_job, fallback_pgid)
    except (InvalidInput, ProtocolError) as exc:
        _say(f"{prog}: error: {exc}")
        return EXIT_USAGE
    return step.run()


class Step:
    def __init__(
        self,
        options: SrunOptions,
        environ: dict[str, str],
        prog: str,
        fail_job: FailJob | None,
        fallback_pgid: int | None,
    ) -> None:
        self.options = options
        self.environ = environ
        self.prog = prog
        self.fail_job = fail_job
        self.fallback_pgid = os.getpgrp() if fallback_pgid == -1 else fallback_pgid
        if not environ.get("GPUQ_JOB_ID"):
            raise InvalidInput(
                prog,
                "",
                "not inside a gpuq job (GPUQ_JOB_ID is unset): use gpuq submit or gpuq run",
            )
        if options.jobid is not None and options.jobid != environ["GPUQ_JOB_ID"]:
            raise InvalidInput("--jobid", options.jobid, "steps run only in their own job")
        if environ.get("GPUQ_NODE_INDEX", "0") not in ("", "0"):
            raise InvalidInput(
                prog, "", "steps start on the job's first node, where its script runs"
            )
        self.job: JobShape = job_shape(environ)
        request = StepRequest(
            ntasks=options.ntasks,
            nodes=options.nodes,
            ntasks_per_node=options.ntasks_per_node,
            cpus_per_task=options.cpus_per_task,
            gpus_per_task=options.gpus_per_task,
            overcommit=options.overcommit,
        )
        self.layout: Layout = plan(self.job, request)
        self.key = b""
        if len(self.layout.nodes) > 1:
            self.key = parse_key(environ.get("GPUQ_STEP_KEY", ""))
            try:
                self.port = int(environ.get("GPUQ_STEP_PORT", ""))
            except ValueError:
                raise InvalidInput(
                    "GPUQ_STEP_PORT", environ.get("GPUQ_STEP_PORT"), "unset"
                ) from None
        self.cwd = options.chdir or os.getcwd()
        self.step_id = next_step_id(environ)
        # SimpleQueue: its put is safe from a signal handler (Queue.put could deadlock there)
        self.events: queue.SimpleQueue[StepEvent] = queue.SimpleQueue()
        self.local: list[TaskProcess] = []
        self.remotes: list[RemoteNode] = []
        self.exits: dict[int, int] = {}  # rank -> exit status
        self.first_bad: tuple[int, str] | None = None  # (rank, what happened)
        self.stopped: list[int] = []
        self.stop_reason: int | None = None  # the signal that stopped srun
        self.router = OutputRouter(
            self.layout,
            options.label,
            options.output,
            options.error,
            self.job.job_id,
            self.step_id,
            environ,
            self.cwd,
            unbuffered=options.unbuffered,
        )

    # ---- start -------------------------------------------------------------------------

    def run(self) -> int:
        previous = self._install_signals()
        try:
            if not self._start():
                self._stop_all()
                self._drain(time.monotonic() + END_WAIT)
                return EXIT_FAILED
            return self._wait()
        finally:
            for remote in self.remotes:
                remote.close()
            self.router.close()
            for number, handler in previous.items():
                signal.signal(number, handler)

    def _start(self) -> bool:
        """Connect to every follower first (a step starts everywhere or nowhere), then start."""
        base = self._base_env()
        for node_id in range(1, len(self.layout.nodes)):
            remote = RemoteNode(
                node_id, self.job.nodes[node_id], self.job.addrs[node_id], self.port, self.events
            )
            try:
                remote.connect(self.key)
            except (OSError, ProtocolError) as exc:
                _say(
                    f"{self.prog}: error: {remote.name}: cannot reach its step worker at "
                    f"{remote.addr}:{self.port}: {exc}"
                )
                return False
            self.remotes.append(remote)
        replace_env = (self.options.export or "ALL").split(",")[0] != "ALL"
        for remote in self.remotes:
            specs = [
                {
                    "rank": t.rank,
                    "local_id": t.local_id,
                    "env": task_env(self.job, self.layout, t, self.step_id),
                }
                for t in self.layout.on_node(remote.node_id)
            ]
            try:
                remote.start(
                    self.options.command,
                    self.cwd,
                    base,
                    replace_env,
                    specs,
                    self.layout.gpus_per_task,
                )
            except (OSError, ProtocolError) as exc:
                _say(f"{self.prog}: error: {remote.name}: the step did not start: {exc}")
                return False
        visible = self.environ.get("CUDA_VISIBLE_DEVICES", "")
        for task in self.layout.on_node(0):
            env = dict(base)
            env.update(task_env(self.job, self.layout, task, self.step_id))
            bound = bind_gpus(visible, task.local_id, self.layout.gpus_per_task)
            if bound is not None:
                env["CUDA_VISIBLE_DEVICES"] = bound
            process = TaskProcess(
                task.rank,
                self.options.command,
                env,
                self.cwd,
                self._local_output,
                self._local_exit,
                stdin_inherit=task.rank == 0,
            )
            self.local.append(process)
        for process in self.local:
            process.start()
        return True

    def _base_env(self) -> dict[str, str]:
        """What every task starts from: srun's own environment (--export=ALL), or only the
        variables named (NONE, or NAME[=VALUE],...), plus the job's SLURM_* and GPUQ_*."""
        words = [w for w in (self.options.export or "ALL").split(",") if w]
        if words and words[0] == "ALL":
            env = dict(self.environ)
            words = words[1:]
        else:
            env = {
                k: v
                for k, v in self.environ.items()
                if k.startswith(("SLURM_", "GPUQ_", "CUDA_")) or k in ("MASTER_ADDR", "MASTER_PORT")
            }
            words = [w for w in words if w != "NONE"]
        for word in words:
            name, eq, value = word.partition("=")
            if eq:
                env[name] = value
            elif name in self.environ:
                env[name] = self.environ[name]
        for name in PER_TASK_ONLY:
            env.pop(name, None)
        return env

    # ---- run -------------------------------------------------------------------------

    def _local_output(self, rank: int, fd: int, data: bytes) -> None:
        self.events.put(StepEvent("out", rank=rank, fd=fd, data=data))

    def _local_exit(self, rank: int, code: int | None, number: int | None) -> None:
        self.events.put(StepEvent("exit", rank=rank, code=code, signal=number))

    def _wait(self) -> int:
        deadline: float | None = None
        while len(self.exits) < self.layout.ntasks:
            timeout = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
            if deadline is not None and time.monotonic() >= deadline:
                self._give_up_waiting()
                break
            try:
                event = self.events.get(timeout=timeout)
            except queue.Empty:
                continue
            if event.kind == "signal":
                if event.signal in STOPPING:
                    if self.stop_reason is None:
                        self.stop_reason = event.signal
                        _say(f"{self.prog}: stopping every task of step {self.step_id}")
                        self._stop_all()
                        deadline = time.monotonic() + END_WAIT
                    else:
                        self._kill_all_now()
                else:
                    self._forward(event.signal or 0)
            elif event.kind == "out":
                self.router.write(event.rank, event.fd, event.data)
            elif event.kind == "exit":
                if self._exited(event.rank, exit_status(event.code, event.signal), event):
                    deadline = time.monotonic() + END_WAIT
            elif event.kind == "lost":
                lost = [
                    t.rank for t in self.layout.on_node(event.node_id) if t.rank not in self.exits
                ]
                _say(f"{self.prog}: error: {event.text}")
                for rank in lost:
                    lost_event = StepEvent("exit", rank=rank, code=EXIT_FAILED, text="lost")
                    if self._exited(rank, EXIT_FAILED, lost_event):
                        deadline = time.monotonic() + END_WAIT
        if self.first_bad is not None:
            self._end_job()
        if self.stop_reason is not None:
            return 128 + self.stop_reason
        if self.first_bad is not None:
            return self.exits[self.first_bad[0]]
        return max(self.exits.values(), default=0)

    def _exited(self, rank: int, status: int, event: StepEvent) -> bool:
        """Record a task's end; True when it makes the step stop (the first bad exit)."""
        if rank in self.exits or not 0 <= rank < self.layout.ntasks:
            return False
        self.exits[rank] = status
        self.router.flush(rank)
        if status == 0 or self.stop_reason is not None:
            return False
        node = self.layout.nodes[self.layout.tasks[rank].node_id]
        if event.text == "lost":
            what = "was lost with its node's step worker"
        elif event.signal is not None:
            what = f"was killed by {_signal_name(event.signal)}"
        else:
            what = f"exited {status}"
        if self.first_bad is None:
            _say(f"{self.prog}: error: {node}: task {rank}: {what}")
        if self.first_bad is not None or self.options.kill_on_bad_exit is False:
            return False
        self.first_bad = (rank, f"task {rank} on {node} {what} at {time.strftime('%H:%M:%S')}")
        self.stopped = [r for r in range(self.layout.ntasks) if r not in self.exits]
        if self.stopped:
            _say(f"{self.prog}: error: stopping {_tasks(self.stopped)} (--kill-on-bad-exit)")
        self._stop_all()
        return True

    def _give_up_waiting(self) -> None:
        """Tasks that did not report their end after being stopped: killed, counted as such."""
        self._kill_all_now()
        for task in self.layout.tasks:
            self.exits.setdefault(task.rank, 128 + signal.SIGKILL)

    def _stop_all(self) -> None:
        for remote in self.remotes:
            remote.kill()
        for process in self.local:
            process.stop()

    def _kill_all_now(self) -> None:
        for remote in self.remotes:
            remote.signal(signal.SIGKILL)
        for process in self.local:
            process.signal(signal.SIGKILL)

    def _forward(self, number: int) -> None:
        for remote in self.remotes:
            remote.signal(number)
        for process in self.local:
            process.signal(number)

    def _drain(self, deadline: float) -> None:
        """After a failed start: wait (bounded) for what did start to end."""
        for process in self.local:
            process.ended.wait(max(0.0, deadline - time.monotonic()))

    # ---- the job's end ---------------------------------------------------------------

    def _end_job(self) -> None:
        assert self.first_bad is not None
        reason = self.first_bad[1]
        if self.stopped:
            reason += f"; {stopped_text(self.stopped)}"
        end_job(self.job.job_id, reason, self.fail_job, self.fallback_pgid, self.prog)

    def _install_signals(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous

        def handler(number: int, frame: FrameType | None) -> None:
            self.events.put(StepEvent("signal", signal=number))

        for number in (*STOPPING, *FORWARDED):
            previous[number] = signal.signal(number, handler)
        return previous


def end_job(
    job_id: str, reason: str, fail_job: FailJob | None, fallback_pgid: int | None, prog: str
) -> None:
    """End the job through the coordinator; should that fail (any error, or no answer in
    FAIL_JOB_TIMEOUT), say why and end the batch script's process group instead."""
    call = fail_job or _coordinator_fail_job
    failure: list[str] = []

    def attempt() -> None:
        try:
            call(int(job_id), reason)
        except BaseException as exc:  # the job must end either way: every failure falls back
            failure.append(f"{type(exc).__name__}: {exc}")

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(FAIL_JOB_TIMEOUT)
    if worker.is_alive():
        failure.append(f"no answer in {FAIL_JOB_TIMEOUT:.0f} s")
    if not failure:
        return
    _say(f"{prog}: error: the coordinator did not end job {job_id} ({failure[0]}): {reason}")
    if fallback_pgid is None or fallback_pgid <= 1:
        return
    _say(f"{prog}: ending the batch script (process group {fallback_pgid})")
    with contextlib.suppress(OSError):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(fallback_pgid, signal.SIGTERM)
        time.sleep(STOP_GRACE)
        os.killpg(fallback_pgid, signal.SIGKILL)


def _coordinator_fail_job(job_id: int, reason: str) -> None:
    from gpuq.client import Client

    client: Any = Client()
    client.fail_job(job_id, reason)


def next_step_id(environ: Mapping[str, str]) -> int:
    """SLURM_STEP_ID: 0, 1, ... per srun within the job (a counter file in the job's TMPDIR or
    /tmp, locked; GPUQ_STEP_SEQ overrides). 0 when the file cannot be used."""
    given = environ.get("GPUQ_STEP_SEQ", "")
    if given.isdigit():
        return int(given)
    folder = environ.get("TMPDIR") or "/tmp"
    path = os.path.join(folder, f"gpuq-steps-{os.getuid()}-{environ.get('GPUQ_JOB_ID', '0')}")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return 0
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.read(fd, 32).decode(errors="replace").strip()
        current = int(text) if text.isdigit() else 0
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, str(current + 1).encode())
        return current
    except OSError:
        return 0
    finally:
        os.close(fd)


def stopped_text(ranks: Sequence[int]) -> str:
    """`task 0 was stopped`, `tasks 0,2-3 were stopped`."""
    return f"{_tasks(ranks)} {'was' if len(ranks) == 1 else 'were'} stopped"


def _tasks(ranks: Sequence[int]) -> str:
    return f"task {ranks[0]}" if len(ranks) == 1 else f"tasks {compact_ranks(ranks)}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _say(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
