"""Arrays, coordinator side: an array's record stands for its tasks until they are split off
into jobs of their own (to start, or to be acted on or shown one at a time), and dependencies
read a whole array as one outcome (gpuq.coordinator.memory.scheduler_inputs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import replace
from functools import partial

from gpuq.coordinator.access.permissions import check_splits
from gpuq.coordinator.changes.effects import Cause, Created, Effects
from gpuq.coordinator.changes.job_changes import JobChanges
from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.memory_loader import MemoryLoader
from gpuq.coordinator.memory.scheduler_inputs import SchedulerInputs
from gpuq.domain.dependencies import Dependency
from gpuq.domain.model import Job
from gpuq.domain.states import JobState
from gpuq.errors import NotFound
from gpuq.store.api import Store, StoreTx
from gpuq.store.records import JobQuery


class ArrayTasks:
    def __init__(
        self,
        writer: StoreWriter,
        jobs: LiveJobs,
        inputs: SchedulerInputs,
        changes: JobChanges,
        loader: MemoryLoader,
    ) -> None:
        self.writer = writer
        self.jobs = jobs
        self.inputs = inputs
        self.changes = changes
        self.loader = loader
        # held while tasks are split off arrays, and while a user's action selects and acts
        # on jobs: `cancel ARRAY` then reaches every task, none escapes into the queue
        self.splitting = asyncio.Lock()

    async def load_dependencies(self, deps: Iterable[Dependency]) -> list[str]:
        """Remember how the ended jobs that jobs depend on ended (a whole array: its worst
        ending); the dependencies that name nothing that exists."""
        inputs = self.inputs
        missing: list[str] = []
        for dep in {d for d in deps if inputs.state_of(d, self.jobs) is None}:
            key = (dep.job_id, dep.task)
            if dep.task is not None:
                job = await self.writer.read(partial(_find_task, key=(dep.job_id, dep.task)))
                if job is None:
                    missing.append(dep.display)
                else:
                    inputs.finished[key] = job.state
                continue
            found = await self.writer.read(
                partial(_list_jobs, query=JobQuery(job_ids=(dep.job_id,)))
            )
            if not found:
                missing.append(dep.display)
            elif found[0].array_job_id == dep.job_id:
                await self.loader.load_outcomes({dep.job_id})
                inputs.finished[key] = inputs.array_worst.pop(dep.job_id, JobState.COMPLETED)
            else:
                inputs.finished[key] = found[0].state
        return sorted(missing)

    async def split(self, record_id: int, tasks: Sequence[int], cause: Cause) -> list[Job]:
        """Give tasks of an array's record jobs of their own (in its state), to start, act on
        or show one at a time; the new jobs, in task order. The caller holds `self.splitting`
        (so the record in memory is the one the store splits: it changes only under it)."""
        record = self.jobs.jobs.get(record_id)

        def decide(tx: StoreTx, now: float) -> tuple[Effects, dict[int, int]]:
            state, ids = tx.split_tasks(record_id, tasks, now, cause=cause.text)
            if record is None:  # memory lost it: reloaded below
                return Effects(), ids
            return split_effects(record, state, ids, record_id), ids

        ids = await self.changes.commit(decide, cause)
        if record is None:  # the store is the truth
            await self.loader.reload_jobs()
            return [self.jobs.jobs[i] for i in ids.values() if i in self.jobs.jobs]
        return [self.jobs.jobs[i] for t, i in sorted(ids.items()) if i != record_id]

    async def find_task(
        self, array: int, task: int, user: str | None = None, cause: Cause | None = None
    ) -> Job:
        """Task `task` of the array as a job of its own; split off its record if it is live
        there and `user` (who will act on it) owns it."""
        job_id = self.jobs.task_jobs.get((array, task))
        if job_id is not None:
            return self.jobs.jobs[job_id]
        record = self.jobs.records.get(array)
        if record is not None and task in record.tasks:
            if user is None:
                return record
            check_splits(user, record.user, f"{array}_{task}")
            [job] = await self.split(array, [task], cause or Cause.request("select", user))
            return job
        found = await self.writer.read(lambda s: s.find_task(array, task))
        if found is None:
            raise NotFound(f"no job {array}_{task}")
        return found

    def first_waiting(self, job: Job) -> Job | None:
        """For an array's record with tasks not yet started: its first task that is queued
        on its own (what the array waits for), if any."""
        if not job.tasks or job.state is not JobState.PENDING:
            return None
        queued = [
            j
            for j in self.jobs.in_state(JobState.PENDING)
            if j.array_job_id == job.id and not j.tasks
        ]
        return min(queued, key=lambda j: j.array_task_id or 0) if queued else None


def split_effects(record: Job, state: JobState, ids: dict[int, int], record_id: int) -> Effects:
    """The record keeps the tasks not split off (the last one becomes its own task); each
    split task is a new job in the record's state."""
    left = tuple(t for t in record.tasks if t not in ids or ids[t] == record_id)
    if len(left) == 1:
        rest = replace(record, state=state, tasks=(), array_task_id=left[0])
    else:
        rest = replace(record, state=state, tasks=left)
    effects = Effects(replaced=[rest])
    for task, job_id in sorted(ids.items()):
        if job_id == record_id:
            continue
        job = replace(record, id=job_id, state=state, tasks=(), array_task_id=task, stop=None)
        effects.created.append(Created(job, f"array task split from {record_id}"))
    return effects


def _find_task(store: Store, key: tuple[int, int]) -> Job | None:
    return store.find_task(*key)


def _list_jobs(store: Store, query: JobQuery) -> list[Job]:
    return store.list_jobs(query)
