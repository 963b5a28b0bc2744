"""The thread behind a gpuq.Executor that completes its futures.

It follows every outstanding job (single jobs by id, array jobs by the array's id) over one
Watch stream, and when a job ends it completes the future with the job's outcome (the
Executor's: fn's value or exception from the result file gpuq.executor_worker wrote, or
gpuq.executor.JobFailed) and removes the job's files. The set of ids a Watch stream follows
is fixed when it opens, so jobs submitted meanwhile are taken in by opening a new stream: at
the next event, or when the stream's short deadline passes. Each time a stream opens, the
jobs' states are read once (one ListJobs for the single jobs, one per array), which finds the
jobs that ended while no stream was open.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuq.domain.array_specs import parse_indices
from gpuq.domain.states import JobState
from gpuq.errors import GpuqError, NotFound

if TYPE_CHECKING:
    from gpuq.client import Client

# a stream's deadline: short while jobs are being submitted (new ones are taken in by a new
# stream), longer once the submitter waits
BUSY_WINDOW, QUIET_WINDOW, QUIET_AFTER = 2.0, 10.0, 30.0
MIN_STREAM = 0.5  # seconds a stream stays open at least, however many jobs come meanwhile
MAX_IDS = 10_000  # job ids in one ListJobs request (the coordinator's bound)
LOG = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Tracked:
    """One job (or task of an array job) and its future."""

    future: Future[Any]  # the Executor's JobFuture
    job_id: int  # the job's id, or the array job's
    task: int | None  # the task index of an array job's task
    result_path: Path
    output: str  # the job's output file, for messages
    as_list: bool  # the result is a list of values (a chunk of map's items)
    requeued: bool  # a preempted job goes back to the queue (it was not --no-requeue)

    @property
    def job(self) -> str:
        """Its gpuq id: `12`, or `12_3` for task 3 of array job 12."""
        return str(self.job_id) if self.task is None else f"{self.job_id}_{self.task}"


# (True, fn's value) or (False, the exception) for a job that ended (state None: the queue no
# longer knows it), with the reason it ended: the Executor's, which reads the result file
Outcome = Callable[[Tracked, JobState | None, str], tuple[bool, Any]]


class Watcher:
    """Follows the Executor's jobs on a thread of its own until stopped with none left."""

    def __init__(
        self,
        client: Client,
        lock: threading.RLock,
        on_end: Callable[[], None],
        outcome: Outcome,
    ) -> None:
        self._client = client
        self._outcome = outcome
        self._lock = lock  # the Executor's: guards the tables and the futures' transitions
        self._wake = threading.Condition(lock)
        self._on_end = on_end
        self._singles: dict[int, Tracked] = {}
        self._arrays: dict[int, dict[int, Tracked]] = {}
        self._task_ids: dict[int, Tracked] = {}  # the own ids of array tasks that started
        self._payloads: dict[Path, int] = {}  # a callable's file: its jobs not ended yet
        self._fresh = False  # jobs were added since the stream opened
        self._last_add = 0.0
        self._stopping = False
        self.broken: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="gpuq-executor", daemon=True)
        self._thread.start()

    # ---- called by the Executor ------------------------------------------------------------

    def add(self, tracked: list[Tracked], payload: Path) -> None:
        with self._lock:
            if self.broken is not None:
                raise RuntimeError("the Executor's watcher thread failed") from self.broken
            for item in tracked:
                if item.task is None:
                    self._singles[item.job_id] = item
                else:
                    self._arrays.setdefault(item.job_id, {})[item.task] = item
            self._payloads[payload] = len(tracked)
            self._fresh, self._last_add = True, time.monotonic()
            self._wake.notify_all()

    def futures(self) -> list[Future[Any]]:
        """The futures not done yet."""
        with self._lock:
            items = [*self._singles.values()]
            items += [t for tasks in self._arrays.values() for t in tasks.values()]
            return [t.future for t in items if not t.future.done()]

    def stop_when_idle(self) -> None:
        with self._lock:
            self._stopping = True
            self._wake.notify_all()

    def join(self) -> None:
        if threading.current_thread() is not self._thread:  # a future's done callback
            self._thread.join()

    # ---- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        try:
            while self._next_ids() is not None:
                try:
                    self._read_states()
                    ids = self._next_ids(block=False)
                    opened = time.monotonic()
                    if ids and not self._stream(ids) and time.monotonic() - opened < 0.1:
                        time.sleep(0.1)  # it ended at once, no event: a job just ended?
                    failures = 0
                except GpuqError as error:  # the coordinator is away (restarting?): retry
                    failures += 1
                    if failures == 1:
                        LOG.warning("gpuq.Executor cannot follow its jobs, retrying: %s", error)
                    time.sleep(min(5.0, 0.1 * 2**failures))
        except BaseException as error:  # a bug here must not leave futures waiting forever
            self._fail_all(error)
        finally:
            self._on_end()

    def _next_ids(self, block: bool = True) -> list[int] | None:
        """The ids to follow (jobs and arrays); waits while there are none. None: stopped
        with none left (or, not blocking, none left)."""
        with self._lock:
            while not self._singles and not self._arrays:
                if self._stopping or not block:
                    return None
                self._wake.wait()
            self._fresh = False
            return sorted({*self._singles, *self._arrays})

    def _stream(self, ids: list[int]) -> bool:
        """Follow `ids` until they ended, jobs were added, or the deadline; whether any
        event came."""
        opened = time.monotonic()
        quiet = opened - self._last_add > QUIET_AFTER
        events = self._client.watch(ids, timeout=QUIET_WINDOW if quiet else BUSY_WINDOW)
        seen = False
        try:
            for event in events:
                seen = True
                with self._lock:
                    tracked = self._singles.get(event.job_id) or self._task_ids.get(event.job_id)
                    record = event.job_id in self._arrays
                if tracked is not None:
                    self._apply(tracked, event.to_state, event.reason)
                elif record:  # it stands for the tasks not started yet, or is the last one
                    self._read_array_states([event.job_id])
                else:  # a task that just got an id of its own
                    self._learn_task(event.job_id, event.to_state, event.reason)
                if self._fresh and time.monotonic() - opened > MIN_STREAM:
                    break  # a new stream takes in the jobs added (not more often than this)
        except TimeoutError:
            seen = True
        finally:
            if isinstance(events, Generator):
                events.close()  # ends the call
        return seen

    def _read_states(self) -> None:
        with self._lock:
            singles = sorted(self._singles)
        for start in range(0, len(singles), MAX_IDS):
            chunk = singles[start : start + MAX_IDS]
            jobs = self._client.list_raw(job_ids=chunk)
            for job in jobs:
                with self._lock:
                    tracked = self._singles.get(job.id)
                if tracked is not None:
                    self._apply(tracked, JobState(job.state), job.reason)
            self._lost(set(chunk) - {j.id for j in jobs})
        self._read_array_states()

    def _lost(self, job_ids: set[int]) -> None:
        """Jobs the queue no longer knows (removed from its history): they end here."""
        with self._lock:
            lost = [t for i in job_ids for t in [self._singles.get(i)] if t is not None]
            lost += [t for i in job_ids for t in self._arrays.get(i, {}).values()]
        for tracked in lost:
            self._resolve(tracked, None, "the queue no longer knows the job")

    def _learn_task(self, job_id: int, state: JobState, reason: str) -> None:
        """Which task of which array the job `job_id` is (one read, the first time)."""
        try:
            job = self._client.get(job_id)
        except NotFound:
            return
        with self._lock:
            tasks = self._arrays.get(job.array_job_id or 0, {})
            tracked = tasks.get(job.array_task_id) if job.array_task_id is not None else None
            if tracked is not None:
                self._task_ids[job_id] = tracked
        if tracked is not None:
            self._apply(tracked, state, reason)

    def _read_array_states(self, arrays: list[int] | None = None) -> None:
        """Each array's tasks (a record stands for the tasks not started on their own)."""
        if arrays is None:
            with self._lock:
                arrays = sorted(self._arrays)
        for array in arrays:
            jobs = self._client.list_raw(array_job_id=array)
            if not jobs:
                self._lost({array})
            for job in jobs:
                own = not job.array_tasks and job.id != array  # a task with an id of its own
                for task in parse_indices(job.array_tasks) or (job.array_task_id,):
                    with self._lock:
                        tracked = self._arrays.get(array, {}).get(task)
                        if tracked is not None and own:
                            self._task_ids[job.id] = tracked
                    if tracked is not None:
                        self._apply(tracked, JobState(job.state), job.reason)

    def _apply(self, tracked: Tracked, state: JobState, reason: str) -> None:
        if state is JobState.RUNNING:
            with self._lock:
                if not tracked.future.running() and not tracked.future.done():
                    tracked.future.set_running_or_notify_cancel()
        elif not state.is_live and not (state is JobState.PREEMPTED and tracked.requeued):
            self._resolve(tracked, state, reason)

    # ---- results ---------------------------------------------------------------------------

    def _resolve(self, tracked: Tracked, state: JobState | None, reason: str) -> None:
        with self._lock:
            if tracked.task is None:
                if self._singles.pop(tracked.job_id, None) is None:
                    return  # resolved already
            else:
                tasks = self._arrays.get(tracked.job_id, {})
                if tasks.pop(tracked.task, None) is None:
                    return
                if not tasks:  # the array ended: forget its tasks' ids
                    self._arrays.pop(tracked.job_id, None)
                    array = tracked.job_id
                    self._task_ids = {k: v for k, v in self._task_ids.items() if v.job_id != array}
        future = tracked.future
        if not future.done():
            ok, value = self._outcome(tracked, state, reason)
            with contextlib.suppress(InvalidStateError):  # cancelled meanwhile
                future.set_result(value) if ok else future.set_exception(value)
        self._remove_files(tracked)

    def _remove_files(self, tracked: Tracked) -> None:
        """Its arguments and result (its output file stays); the callable's file once every
        job that calls it ended."""
        tracked.result_path.unlink(missing_ok=True)
        tracked.result_path.with_suffix(".args").unlink(missing_ok=True)
        payload = tracked.result_path.with_name(tracked.result_path.name.split(".")[0] + ".fn")
        with self._lock:
            left = self._payloads.get(payload, 1) - 1
            if left > 0:
                self._payloads[payload] = left
                return
            self._payloads.pop(payload, None)
        payload.unlink(missing_ok=True)

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            self.broken = error
            items = [*self._singles.values()]
            items += [t for tasks in self._arrays.values() for t in tasks.values()]
            self._singles.clear()
            self._arrays.clear()
        for tracked in items:
            with contextlib.suppress(InvalidStateError):
                tracked.future.set_exception(error)
