"""Arrays, coordinator side: an array's record stands for its tasks until they are split off
into jobs of their own (to start, or to be acted on or shown one at a time), and dependencies
read a whole array as one outcome (gpuq.coordinator.scheduling). Memory follows the store here
as in gpuq.coordinator.core.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from gpuq.domain.dependencies import Dependency
from gpuq.domain.model import Job, JobEvent
from gpuq.domain.states import JobState
from gpuq.errors import NotFound, PermissionDenied
from gpuq.store.api import Store
from gpuq.store.records import JobQuery

if TYPE_CHECKING:
    from gpuq.coordinator.core import Coordinator


class Arrays:
    def __init__(self, coordinator: Coordinator) -> None:
        self.co = coordinator
        # held while tasks are split off arrays, and while a user's action selects and acts
        # on jobs: `cancel ARRAY` then reaches every task, none escapes into the queue
        self.splitting = asyncio.Lock()

    async def load_dependencies(self, deps: Iterable[Dependency]) -> list[str]:
        """Remember how the ended jobs that jobs depend on ended (a whole array: its worst
        ending); the dependencies that name nothing that exists."""
        missing: list[str] = []
        for dep in {d for d in deps if self.co.sched.state_of(d, self.co.cluster) is None}:
            key = (dep.job_id, dep.task)
            if dep.task is not None:
                job = await self.co.writer.read(partial(_find_task, key=(dep.job_id, dep.task)))
                if job is None:
                    missing.append(dep.display)
                else:
                    self.co.sched.finished[key] = job.state
                continue
            found = await self.co.writer.read(
                partial(_list_jobs, query=JobQuery(job_ids=(dep.job_id,)))
            )
            if not found:
                missing.append(dep.display)
            elif found[0].array_job_id == dep.job_id:
                await self.load_outcomes({dep.job_id})
                self.co.sched.finished[key] = self.co.sched.array_worst.pop(
                    dep.job_id, JobState.COMPLETED
                )
            else:
                self.co.sched.finished[key] = found[0].state
        return sorted(missing)

    async def load_outcomes(self, arrays: set[int | None]) -> None:
        """The worst ending so far of each array's ended tasks (see SchedulingState)."""
        wanted = sorted(a for a in arrays if a is not None)
        if not wanted:
            return
        counts = await self.co.writer.read(lambda s: s.array_states(wanted))
        for array, by_state in counts.items():
            failed = sorted(s for s in by_state if not s.is_live and s is not JobState.COMPLETED)
            if failed:
                self.co.sched.array_worst[array] = failed[0]

    async def split(self, record_id: int, tasks: Sequence[int]) -> list[Job]:
        """Give tasks of an array's record jobs of their own (in its state), to start, act on
        or show one at a time; the new jobs, in task order. The caller holds `self.splitting`."""
        now = self.co.clock()
        state, ids = await self.co.writer.write(lambda tx: tx.split_tasks(record_id, tasks, now))
        record = self.co.cluster.jobs.get(record_id)
        if record is None:  # changed in memory meanwhile: the store is the truth
            await self.co.reload_jobs()
            return [self.co.cluster.jobs[i] for i in ids.values() if i in self.co.cluster.jobs]
        left = tuple(t for t in record.tasks if t not in ids or ids[t] == record_id)
        if len(left) == 1:
            self.co.cluster.put(replace(record, state=state, tasks=(), array_task_id=left[0]))
        else:
            self.co.cluster.put(replace(record, state=state, tasks=left))
        split: list[Job] = []
        for task, job_id in sorted(ids.items()):
            if job_id == record_id:
                continue
            job = replace(record, id=job_id, state=state, tasks=(), array_task_id=task, stop=None)
            self.co.cluster.put(job)
            split.append(job)
            self.co.publish(
                JobEvent(job_id, now, None, state, f"array task split from {record_id}"), job
            )
        return split

    async def find_task(self, array: int, task: int, user: str | None = None) -> Job:
        """Task `task` of the array as a job of its own; split off its record if it is live
        there and `user` (who will act on it) owns it."""
        job_id = self.co.cluster.task_jobs.get((array, task))
        if job_id is not None:
            return self.co.cluster.jobs[job_id]
        record = self.co.cluster.records.get(array)
        if record is not None and task in record.tasks:
            if user is None:
                return record
            if record.user != user:
                raise PermissionDenied(f"job {array}_{task} belongs to {record.user}")
            [job] = await self.split(array, [task])
            return job
        found = await self.co.writer.read(lambda s: s.find_task(array, task))
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
            for j in self.co.cluster.in_state(JobState.PENDING)
            if j.array_job_id == job.id and not j.tasks
        ]
        return min(queued, key=lambda j: j.array_task_id or 0) if queued else None


def _find_task(store: Store, key: tuple[int, int]) -> Job | None:
    return store.find_task(*key)


def _list_jobs(store: Store, query: JobQuery) -> list[Job]:
    return store.list_jobs(query)
