"""`gpuq.Executor`: a concurrent.futures.Executor that runs Python callables as gpuq jobs.

    import gpuq
    with gpuq.Executor(gpus=1, mem="8G") as executor:
        future = executor.submit(train, config, time="2:00:00")    # one job
        print(future.result())                                      # train's return value
        losses = list(executor.map(evaluate, seeds, gpus=1))        # one array job

The callable and its arguments are pickled with cloudpickle (closures and lambdas travel by
value) into files of a run folder; the job runs `python -m gpuq.executor_worker` on them
(gpuq.executor_worker) and writes the result there. So the folder must be on a file system
that the submitting machine and the GPU nodes share (as with submitit); by default it is
`~/.cache/gpuq/executor/<run>/`, home folders being the usual shared one. Only the
submitter can read it (0700, files 0600), and no file is unpickled unless it is the
submitter's and writable by nobody else.

One thread per Executor follows every outstanding job over one Watch stream
(gpuq.executor_watch) and completes the futures with the outcomes this module reads.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import os
import pickle
import re
import shlex
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from gpuq.domain.states import JobState
from gpuq.errors import GpuqError
from gpuq.executor_watch import Tracked, Watcher
from gpuq.executor_worker import OK, read_trusted, write_atomically
from gpuq.options import BY_NAME

if TYPE_CHECKING:
    from gpuq.client import Client
    from gpuq.domain.model import JobSpec

__all__ = ["Executor", "JobFailed", "JobFuture", "RemoteError"]

# keywords of submit() and map() that configure the job (those of `gpuq submit`); `array`
# is map's business
JOB_OPTIONS = frozenset(BY_NAME) - {"array"}
CANCEL_REASON = "cancelled through gpuq.Executor"


class JobFailed(GpuqError):
    """A job of the Executor ended without a result: cancelled, timed out, out of memory, its
    node lost, killed, or its result file missing. Says which job, how it ended and why, and
    where its output is."""

    def __init__(self, job: str, state: str, reason: str, output: str, detail: str = "") -> None:
        self.job, self.state, self.reason, self.output = job, state, reason, output
        why = f" ({reason})" if reason and reason != state else ""
        text = detail or "without a result"
        super().__init__(f"gpuq job {job} ended {state}{why} {text}; its output: {output}")


class RemoteError(GpuqError):
    """An exception the function raised that cannot be unpickled here (its class does not
    import, or it does not pickle): its type and message; the traceback is a note."""


class JobFuture(concurrent.futures.Future[Any]):
    """A Future for one job (or one task of an array job); `job` is its gpuq id (`12`,
    `12_3`). cancel() of a job that has not started cancels it in gpuq too."""

    def __init__(self, executor: Executor, job: str) -> None:
        super().__init__()
        self.job = job
        self._executor = executor

    def cancel(self) -> bool:
        if self.cancel_here():
            self._executor._cancel_jobs([self.job])
        return self.cancelled()

    def cancel_here(self) -> bool:
        """The base class's cancel, waiters notified; True when this call cancelled it
        (not once the job runs or ended, nor when it was cancelled already)."""
        with self._executor._lock:
            if self.cancelled() or not super().cancel():
                return False
            self.set_running_or_notify_cancel()  # tells concurrent.futures.wait()
            return True


class Executor(concurrent.futures.Executor):
    """Runs callables as gpuq jobs: `submit(fn, *args, gpus=1, **kwargs)`, `map(fn, items)`.

    Keywords that are `gpuq submit` options (gpus, gpu_mem, cpus, mem, time, name, qos,
    after, env, nice, ...: gpuq.options.OPTIONS) configure the job; the others are fn's.
    The defaults come from the constructor, and one submit overrides them. To give fn a
    keyword named like an option, bind it: `submit(functools.partial(fn, name="x"))`. One
    rule that needs no second way to say "this is the job's" (a `gpuq_options={}` dict, or
    an options() copy of the executor), and partial is how the standard library's own
    loop.run_in_executor passes keywords.

    folder: where the run folder goes (it must be shared with the nodes); client: a
    gpuq.Client to use (one is made, and closed at shutdown, when None); python: the
    interpreter the jobs run (this one by default: it must exist on the nodes, with gpuq and
    cloudpickle installed).
    """

    def __init__(
        self,
        folder: str | Path | None = None,
        client: Client | None = None,
        python: str | None = None,
        **default_options: Any,
    ) -> None:
        self._defaults = _job_options(default_options, strict=True)
        self.folder = _make_run_folder(Path(folder) if folder else _default_folder())
        self.python = python or sys.executable
        self._own_client = client is None
        if client is None:
            from gpuq.client import Client

            client = Client()
        self.client = client
        self._lock = threading.RLock()
        self._submitting = 0  # submissions under way (shutdown waits for them)
        self._submitted = threading.Condition(self._lock)
        self._shutdown = False
        self._numbers = itertools.count()
        self._watcher: Watcher | None = None

    # ---- submitting ------------------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> JobFuture:
        """One job that calls fn(*args, **kwargs); keywords that are job options are taken
        (see the class). The future's result is fn's return value; an exception fn raised
        is raised again, with the remote traceback as a note."""
        options = _job_options(kwargs)
        for name in options:
            del kwargs[name]
        return self._submit_calls(fn, [[(args, kwargs)]], options)[0]

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
        **options: Any,
    ) -> Iterator[Any]:
        """fn over the items as ONE array job (task i calls fn on `chunksize` items from item
        i*chunksize); results in order, as the base class gives them. Job options as for
        submit; fn gets positional arguments only, as with the base class."""
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        options = _job_options(options, strict=True)
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]]
        calls = [(item, {}) for item in zip(*iterables, strict=False)]
        chunks = [calls[i : i + chunksize] for i in range(0, len(calls), chunksize)]
        futures = self._submit_calls(fn, chunks, options, as_list=True) if chunks else []
        deadline = None if timeout is None else time.monotonic() + timeout

        def results() -> Iterator[Any]:
            pending = list(reversed(futures))
            try:
                while pending:
                    left = None if deadline is None else deadline - time.monotonic()
                    yield from pending[-1].result(left)
                    pending.pop()
            finally:
                self._cancel_futures(pending)

        return results()

    def _submit_calls(
        self,
        fn: Callable[..., Any],
        chunks: list[list[tuple[tuple[Any, ...], dict[str, Any]]]],
        options: dict[str, Any],
        as_list: bool = False,
    ) -> list[JobFuture]:
        """One job (one chunk) or one array job (a task per chunk); a future per chunk."""
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._submitting += 1
        number = next(self._numbers)
        try:
            fn_path = self._write_payload(number, fn, chunks, as_list)
            spec = self._job_spec(number, fn, fn_path, len(chunks), as_list, options)
            job_ids = self.client.submit_spec(spec)
        except BaseException:  # nothing was submitted: its files go
            for path in self.folder.glob(f"{number}.*"):
                path.unlink(missing_ok=True)
            raise
        try:
            return self._follow(number, job_ids[0], len(chunks), as_list, options)
        finally:
            with self._lock:
                self._submitting -= 1
                self._submitted.notify_all()

    def _write_payload(
        self,
        number: int,
        fn: Callable[..., Any],
        chunks: list[list[tuple[tuple[Any, ...], dict[str, Any]]]],
        as_list: bool,
    ) -> Path:
        """N.fn (the callable, and this interpreter's sys.path for the imports it needs),
        and N.args or N.T.args (each task's calls)."""
        import cloudpickle

        paths = [entry or os.getcwd() for entry in sys.path]
        fn_path = self.folder / f"{number}.fn"
        outer = {"sys_path": paths, "fn": cloudpickle.dumps(fn)}
        write_atomically(fn_path, pickle.dumps(outer))
        for task, calls in enumerate(chunks):
            name = f"{number}.{task}.args" if as_list else f"{number}.args"
            write_atomically(self.folder / name, cloudpickle.dumps(calls))
        return fn_path

    def _job_spec(
        self,
        number: int,
        fn: Callable[..., Any],
        fn_path: Path,
        tasks: int,
        as_list: bool,
        options: dict[str, Any],
    ) -> JobSpec:
        from gpuq.submission import build_spec

        merged = {**self._defaults, **options}
        merged.setdefault("name", _job_name(fn))
        merged.setdefault(
            "output", str(self.folder / (f"{number}.%a.out" if as_list else f"{number}.out"))
        )
        if as_list:
            merged["array"] = f"0-{tasks - 1}"
        command = (
            f"exec {shlex.quote(self.python)} -m gpuq.executor_worker {shlex.quote(str(fn_path))}"
        )
        return build_spec(wrap=command, **merged)

    def _follow(
        self, number: int, job_id: int, tasks: int, as_list: bool, options: dict[str, Any]
    ) -> list[JobFuture]:
        """Futures for the submitted job (or each task), handed to the watcher thread."""
        merged = {**self._defaults, **options}
        requeued = not merged.get("no_requeue")  # a preempted job comes back to the queue
        tracked, futures = [], []
        for task in range(tasks) if as_list else [None]:
            job = str(job_id) if task is None else f"{job_id}_{task}"
            base = f"{number}" if task is None else f"{number}.{task}"
            output = merged.get("output") or str(self.folder / f"{base}.out")
            output = output.replace("%a", str(task)).replace("%j", str(job_id))
            future = JobFuture(self, job)
            futures.append(future)
            tracked.append(
                Tracked(
                    future, job_id, task, self.folder / f"{base}.result", output, as_list, requeued
                )
            )
        with self._lock:
            if self._watcher is None:
                end, outcome = self._on_watcher_end, self._outcome
                self._watcher = Watcher(self.client, self._lock, end, outcome)
            self._watcher.add(tracked, self.folder / f"{number}.fn")
        return futures

    # ---- outcomes --------------------------------------------------------------------------

    def _outcome(self, tracked: Tracked, state: JobState | None, reason: str) -> tuple[bool, Any]:
        """(True, fn's value) or (False, the exception) for a job that ended (the watcher
        completes its future with it): from its result file, or JobFailed when it wrote none."""
        try:
            return _read_result(tracked)
        except FileNotFoundError:
            return False, self._failed(tracked, state, reason)
        except Exception as error:  # an unreadable result: say so through the future
            return False, error

    def _failed(self, tracked: Tracked, state: JobState | None, reason: str) -> JobFailed:
        """The error of a job that ended without a result file."""
        detail = "without a result"
        if state is JobState.COMPLETED:
            detail = (
                f"but wrote no result at {tracked.result_path}: is "
                f"{tracked.result_path.parent} on a file system this machine and the node share?"
            )
        output = tracked.output
        if "%" in output:  # a pattern of the user's: the coordinator knows what it became
            with contextlib.suppress(GpuqError):
                output = self.client.output_path(tracked.job)
        state_text = state.value if state is not None else "unknown"
        return JobFailed(tracked.job, state_text, reason, output, detail)

    # ---- cancelling and ending -------------------------------------------------------------

    def _cancel_jobs(self, jobs: list[str]) -> None:
        """Cancel these jobs in gpuq (their futures are cancelled already): one request."""
        if jobs:
            self.client.cancel(*jobs, reason=CANCEL_REASON)

    def _cancel_futures(self, futures: Iterable[JobFuture]) -> None:
        self._cancel_jobs([f.job for f in futures if f.cancel_here()])

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more submissions. cancel_futures: the futures whose jobs have not started are
        cancelled, and their jobs in gpuq (one request). wait: returns once every future is
        done. The jobs' output files stay in the run folder (their payloads and results are
        removed once read)."""
        with self._lock:
            self._shutdown = True
            while self._submitting:
                self._submitted.wait()
            watcher = self._watcher
        # the JobFutures this Executor handed it (it knows them as plain Futures)
        futures = cast("list[JobFuture]", watcher.futures()) if watcher is not None else []
        if cancel_futures:
            self._cancel_futures(futures)
        if watcher is not None:
            watcher.stop_when_idle()
        if wait:
            concurrent.futures.wait(futures)
            if watcher is not None:
                watcher.join()
        if watcher is None and self._own_client:
            self.client.close()

    def _on_watcher_end(self) -> None:
        """The watcher thread ends (shut down, nothing left to follow)."""
        if self._own_client:
            self.client.close()


def _job_options(values: dict[str, Any], strict: bool = False) -> dict[str, Any]:
    """The job options among `values` (strict: every one must be one)."""
    if "array" in values:
        raise TypeError(
            "array jobs come from Executor.map; pass `array` to fn with functools.partial"
        )
    if strict:
        unknown = sorted(set(values) - JOB_OPTIONS)
        if unknown:
            raise TypeError(f"{unknown[0]!r} is not a gpuq job option")
    return {k: v for k, v in values.items() if k in JOB_OPTIONS}


def _job_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return re.sub(r"[^A-Za-z0-9_.+@=:,-]", "_", name)[:128] or "fn"


def _default_folder() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(cache) / "gpuq" / "executor"


def _make_run_folder(base: Path) -> Path:
    """A new folder of this run under `base` (made 0700 when missing). `base` must be this
    user's and writable by nobody else: another user could otherwise swap the run folder."""
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.stat(base)
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(
            f"{base} must be yours and writable by you only to hold Executor payloads"
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.mkdtemp(prefix=f"{stamp}-", dir=base))


def _read_result(tracked: Tracked) -> tuple[bool, Any]:
    """(True, its value) or (False, the exception) from the result file of a job that ended;
    FileNotFoundError when it wrote none."""
    import cloudpickle  # noqa: F401 - what the results' pickles refer to

    result = pickle.loads(read_trusted(tracked.result_path))
    if result[0] == OK:
        return True, result[1] if tracked.as_list else result[1][0]
    _, index, pickled, text, kind, message = result
    error: BaseException = RemoteError(f"{kind}: {message}")
    if pickled is not None:
        with contextlib.suppress(Exception):  # its class may not import here
            error = pickle.loads(pickled)
    item = f" (item {index} of its chunk)" if tracked.as_list else ""
    error.add_note(f"remote traceback of gpuq job {tracked.job}{item}:\n{text.rstrip()}")
    return False, error
