"""The queue in the order the scheduler ranks it (the dashboard's Queue page, issue 26):
pending jobs by priority, then submission order (memory's queue order, LiveJobs.queue_order;
an array's record not yet split by its own priority, as a rerank would place it), then held
jobs and running ones by id; filtered by user, state, partition and a part of the name.

The walk lets the event loop run every SCAN places, and stops at the limit: a page's cost.
Where job names are hidden from other users, a name filter matches only the caller's own jobs
(else it would tell what the hidden names are), as the listings' does.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from gpuq.coordinator.memory.live_jobs import LiveJobs, QueueKey, queue_key
from gpuq.domain.limits import check_text
from gpuq.domain.model import Job
from gpuq.domain.states import JobState
from gpuq.errors import InvalidInput
from gpuq.identity import Caller

SCAN = 2000  # places looked at between two turns of the event loop
MAX_RANKED = 1000  # entries in one answer
STATES = {"pending": JobState.PENDING, "held": JobState.HELD, "running": JobState.RUNNING}


@dataclass(frozen=True, slots=True)
class QueueFilter:
    """Which live jobs (None: any): `name` is a part of the job's name, in any case."""

    user: str | None = None
    state: JobState | None = None
    partition: str | None = None
    name: str | None = None

    def matches(self, job: Job) -> bool:
        if self.user is not None and job.user != self.user:
            return False
        if self.partition is not None and self.partition not in job.spec.placement.partitions:
            return False
        return self.name is None or self.name in job.spec.name.casefold()

    def for_caller(self, caller: Caller, private_data: tuple[str, ...]) -> QueueFilter:
        """A name filter of a caller from whom other users' names are hidden: theirs only."""
        if self.name is None or "names" not in private_data or caller.admin:
            return self
        if self.user is not None and self.user != caller.user:
            return QueueFilter(self.user, self.state, self.partition, "\0")  # matches nothing
        return QueueFilter(caller.user, self.state, self.partition, self.name)


def queue_filter(user: str, state: str, partition: str, name: str) -> QueueFilter:
    """The filter from the dashboard's words ("": any), checked."""
    for what, text in (("user", user), ("partition", partition), ("name", name)):
        check_text(what, text, 128)
    if state and state not in STATES:
        raise InvalidInput("state", state[:20], f"expected one of {', '.join(STATES)}")
    return QueueFilter(user or None, STATES.get(state), partition or None, name.casefold() or None)


async def ranked(jobs: LiveJobs, wanted: QueueFilter, limit: int) -> tuple[list[Job], bool]:
    """Up to `limit` live jobs `wanted` matches, in rank order; and whether more match."""
    found: list[Job] = []
    async for job in _walk(jobs, wanted.state):
        if wanted.matches(job):
            if len(found) == limit:
                return found, True
            found.append(job)
    return found, False


async def _walk(jobs: LiveJobs, state: JobState | None) -> AsyncIterator[Job]:
    """Live jobs in rank order (of one state, or every one), the loop free every SCAN."""
    if state in (None, JobState.PENDING):
        records = sorted(
            (queue_key(j, jobs.priority_of(j)), j.id)
            for j in jobs.records.values()
            if j.state is JobState.PENDING
        )
        order: list[QueueKey] = jobs.queue_order()
        places = heapq.merge(((key, key[-1]) for key in order), records)
        async for job in _in_turns(jobs, (job_id for _, job_id in places), JobState.PENDING):
            yield job
    for later in (JobState.HELD, JobState.RUNNING):
        if state in (None, later):
            ids = sorted(j.id for j in jobs.in_state(later))
            async for job in _in_turns(jobs, iter(ids), later):
                yield job


async def _in_turns(jobs: LiveJobs, ids: Iterator[int], state: JobState) -> AsyncIterator[Job]:
    """The jobs of `ids` still live in `state` as each is reached (memory moves on while the
    loop runs)."""
    for count, job_id in enumerate(ids):
        if count and count % SCAN == 0:
            await asyncio.sleep(0)
        job = jobs.jobs.get(job_id)
        if job is not None and job.state is state:
            yield job
