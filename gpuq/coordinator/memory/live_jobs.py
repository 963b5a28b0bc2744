"""The coordinator's memory of live jobs (pending, held, running), as the store last committed.

The store is the truth; this is the cache the scheduler and the listings read without a
database round trip. It changes only after a write committed, in commit order (through
gpuq.coordinator.changes.job_changes, the one applier).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from gpuq.domain.model import Job, JobSpec
from gpuq.domain.states import JobState
from gpuq.scheduler.fit_keys import FitKey

LIVE = (JobState.PENDING, JobState.HELD, JobState.RUNNING)


QueueKey = tuple[int, int, int, int]


def queue_key(job: Job, priority: float) -> QueueKey:
    """Higher priority first; among equals, submission order: the job id, or for an array
    task its array's id, then the task index (SLURM's order). Priorities rank as whole
    numbers, as SLURM's do, so float noise never reorders equal jobs."""
    order = job.array_job_id if job.array_job_id is not None else job.id
    return (-math.floor(priority), order, job.array_task_id or 0, job.id)


class LiveJobs:
    """Live jobs, indexed by state; pending ones also in queue order, kept sorted as they
    come and go (a scheduling pass then walks the queue without sorting it). A job's place in
    the queue is its priority when it was queued or last re-ranked (`rerank`).

    An array's record (a Job with `tasks`) is live but never queued: the passes split tasks
    off it as they can run (gpuq.coordinator.scheduling.scheduling_pass), so a held or waiting
    array of 100,000 tasks costs one entry."""

    def __init__(
        self, key_of: Callable[[Job], FitKey], priority_of: Callable[[Job], float]
    ) -> None:
        self.jobs: dict[int, Job] = {}  # pending, held and running jobs
        self.key_of = key_of
        self.priority_of = priority_of
        self.priority: dict[int, float] = {}  # of pending jobs, as ranked
        self.shapes: Counter[FitKey] = Counter()  # how many pending jobs have each fit key
        # each queued job's fit key, made once when it is queued: a pass that explains the
        # queue looks at every job, and making 100,000 keys again was a fifth of its time
        self.keys: dict[int, FitKey] = {}
        self._by_state: dict[JobState, dict[int, Job]] = {s: {} for s in LIVE}
        self._queue: list[QueueKey] = []  # of pending jobs, sorted
        self.records: dict[int, Job] = {}  # arrays' records with tasks not yet split off
        self.array_live: Counter[int] = Counter()  # live rows per array
        self.array_pending: Counter[int] = Counter()  # queued (split) tasks per array
        self.array_running: Counter[int] = Counter()
        self.task_jobs: dict[tuple[int, int], int] = {}  # live (array, task) -> job id
        self.user_tasks: Counter[str] = Counter()  # live jobs per user, a record its tasks
        # what each user's live jobs hold in this process (scripts, environments, arguments)
        self.user_bytes: Counter[str] = Counter()
        # running jobs `gpuq requeue --hold` stopped: held, not pending, once they end
        self.requeue_held: set[int] = set()
        # for listings in pages: live ids in order, each array's live rows, and tasks by
        # (state, qos), so that a page or a metrics scrape costs its size, not the queue's
        self._ids: list[int] = []
        self.members: dict[int, set[int]] = {}
        self.tally: Counter[tuple[JobState, str]] = Counter()
        # bumped by every change (a job's new version, a re-ranking): what was made from
        # memory as it was (an explanation of the queue, a listing's page) is good while the
        # count is the same
        self.version = 0

    def put(self, job: Job) -> None:
        """Record a job's new version; finished jobs leave memory."""
        self.version += 1
        old = self.jobs.pop(job.id, None)
        # a change of state keeps the spec (the same object): its size is not summed anew,
        # which would cost a walk of its environment per change (issue 27's drain profile)
        kept = (
            old is not None and job.state.is_live and old.spec is job.spec and old.user == job.user
        )
        if old is not None:
            self._forget(old, with_size=not kept)
            if not job.state.is_live:
                del self._ids[bisect.bisect_left(self._ids, job.id)]
        elif job.state.is_live:
            bisect.insort(self._ids, job.id)
        if job.state.is_live:
            self.jobs[job.id] = job
            self._by_state[job.state][job.id] = job
            self.user_tasks[job.user] += len(job.tasks) or 1
            self.tally[(job.state, job.qos)] += len(job.tasks) or 1
            if not kept:
                self.user_bytes[job.user] += spec_size(job.spec)
            array = job.array_job_id
            if job.tasks:
                self.records[job.id] = job
            elif job.state is JobState.PENDING:
                self._enqueue(job)
            if array is not None:
                self.array_live[array] += 1
                self.members.setdefault(array, set()).add(job.id)
                if job.array_task_id is not None:
                    self.task_jobs[(array, job.array_task_id)] = job.id
                if job.state is JobState.PENDING and not job.tasks:
                    self.array_pending[array] += 1
                elif job.state is JobState.RUNNING:
                    self.array_running[array] += 1

    def _forget(self, old: Job, with_size: bool = True) -> None:
        del self._by_state[old.state][old.id]
        self.records.pop(old.id, None)
        self.user_tasks[old.user] -= len(old.tasks) or 1
        if self.user_tasks[old.user] <= 0:
            del self.user_tasks[old.user]
        self.tally[(old.state, old.qos)] -= len(old.tasks) or 1
        if self.tally[(old.state, old.qos)] <= 0:
            del self.tally[(old.state, old.qos)]
        if with_size:
            self.user_bytes[old.user] -= spec_size(old.spec)
            if self.user_bytes[old.user] <= 0:
                del self.user_bytes[old.user]
        if old.state is JobState.PENDING and not old.tasks:
            self._dequeue(old)
        array = old.array_job_id
        if array is not None:
            _decrement(self.array_live, array)
            members = self.members[array]
            members.discard(old.id)
            if not members:
                del self.members[array]
            if old.array_task_id is not None:
                self.task_jobs.pop((array, old.array_task_id), None)
            if old.state is JobState.PENDING and not old.tasks:
                _decrement(self.array_pending, array)
            elif old.state is JobState.RUNNING:
                _decrement(self.array_running, array)

    def _enqueue(self, job: Job) -> None:
        priority = self.priority_of(job)
        self.priority[job.id] = priority
        bisect.insort(self._queue, queue_key(job, priority))
        key = self.keys[job.id] = self.key_of(job)
        self.shapes[key] += 1

    def _dequeue(self, job: Job) -> None:
        index = bisect.bisect_left(self._queue, queue_key(job, self.priority.pop(job.id)))
        del self._queue[index]
        key = self.keys.pop(job.id)
        self.shapes[key] -= 1
        if not self.shapes[key]:
            del self.shapes[key]

    def rerank(self) -> None:
        """Recompute every pending job's priority (age and fair share move)."""
        self.version += 1
        pending = [j for j in self._by_state[JobState.PENDING].values() if not j.tasks]
        self.priority = {job.id: self.priority_of(job) for job in pending}
        self._queue = sorted(queue_key(job, self.priority[job.id]) for job in pending)

    def reset(self, jobs: Iterable[Job]) -> None:
        self.version += 1
        self.jobs.clear()
        self._queue.clear()
        self.priority.clear()
        self.shapes.clear()
        self.keys.clear()
        for by_id in self._by_state.values():
            by_id.clear()
        for counter in (self.array_live, self.array_pending, self.array_running):
            counter.clear()
        self.user_tasks.clear()
        self.user_bytes.clear()
        self.records.clear()
        self.task_jobs.clear()
        self._ids.clear()
        self.members.clear()
        self.tally.clear()
        for job in jobs:
            self.put(job)

    def queue(self) -> Iterator[Job]:
        """Pending jobs by priority, then submit order."""
        pending = self._by_state[JobState.PENDING]
        return (pending[key[-1]] for key in list(self._queue))

    def queue_order(self) -> list[QueueKey]:
        """The pending jobs' places in the queue, in order (a copy: the job id is each
        key's last part), for a walk that lets the loop run between steps."""
        return list(self._queue)

    def any_waiting(self) -> bool:
        """Whether any job waits in the queue (a periodic pass has nothing to do otherwise)."""
        return bool(self._queue)

    def running_on(self, node: str) -> list[Job]:
        return [j for j in self.in_state(JobState.RUNNING) if node in j.node_names]

    def ids_after(self, after: int, count: int) -> list[int]:
        """Up to `count` live job ids above `after`, in order: where a listing's page goes on
        (a bisection, not a sort of the whole queue)."""
        start = bisect.bisect_right(self._ids, after)
        return self._ids[start : start + count]

    def in_state(self, state: JobState) -> Iterable[Job]:
        return self._by_state[state].values()

    def is_live(self, job_id: int) -> bool:
        """The job, or any task of the array of that id, may still run."""
        return job_id in self.jobs or bool(self.array_live.get(job_id))


def _decrement(counter: Counter[int], key: int) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


def spec_size(spec: JobSpec) -> int:
    """About what a job's spec holds in memory: its script, environment and arguments (the
    parts a user sizes; characters, which is cheap: the script is not encoded again)."""
    env = sum(len(k) + len(v) for k, v in spec.env.items())
    return len(spec.script) + env + sum(len(a) for a in spec.args)
