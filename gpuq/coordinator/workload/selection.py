"""Which jobs a user's action acts on: a Selection (ids, or filters that pick live jobs), and
how it is resolved to jobs (ids of array tasks split off their records first, ended jobs read
from the store in one query).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

from gpuq.coordinator.changes.effects import Cause
from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.workload.array_tasks import ArrayTasks
from gpuq.domain.dependencies import parse_job_ref
from gpuq.domain.limits import brief
from gpuq.domain.model import Job
from gpuq.domain.states import JobState
from gpuq.errors import GpuqError, InvalidInput, NotFound
from gpuq.identity import Caller
from gpuq.store.records import JobQuery

MAX_PATTERN = 128  # characters of a --name pattern


@dataclass(frozen=True, slots=True)
class Filters:
    """A bulk selection (`gpuq cancel -u alice --state PD --name 'sweep*'`): every live job
    that matches all the filters given. `user` None: the caller's own jobs unless the caller
    is an admin (who then matches everyone's)."""

    user: str | None = None
    states: frozenset[JobState] | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.name is not None and len(self.name) > MAX_PATTERN:
            raise InvalidInput("--name", brief(self.name), f"at most {MAX_PATTERN} characters")

    def __bool__(self) -> bool:
        return bool(self.user or self.states or self.name)

    def matches(self, job: Job) -> bool:
        if self.user and job.user != self.user:
            return False
        if self.states is not None and job.state not in self.states:
            return False
        return self.name is None or fnmatch.fnmatchcase(job.spec.name, self.name)


def select_live(jobs: Iterable[Job], filters: Filters, user: str, admin: bool) -> list[Job]:
    """The live jobs (an array's record stands for its unstarted tasks) that `filters`
    select for `user`, in id order. A non-admin's filters without a user match only their
    own jobs; naming another user needs an admin (checked by the caller, before this)."""
    owner = filters.user or (None if admin else user)
    found = [j for j in jobs if (owner is None or j.user == owner) and filters.matches(j)]
    return sorted(found, key=lambda j: j.id)


@dataclass(frozen=True, slots=True)
class Selection:
    """What a cancel, hold, release, requeue or update names: `ids` (`12`, `40_3`, an
    array's id for all its tasks), each kept only if it matches `filters`; or, with no ids,
    every live job that `filters` match."""

    ids: tuple[str, ...] = ()
    filters: Filters | None = None


@dataclass(frozen=True, slots=True)
class Unselected:
    """An id that names no job (or names it wrongly): its answer."""

    named: str
    why: GpuqError  # NotFound, or InvalidInput for an id that is not one


class SelectionResolver:
    def __init__(self, writer: StoreWriter, jobs: LiveJobs, arrays: ArrayTasks) -> None:
        self.writer = writer
        self.jobs = jobs
        self.arrays = arrays

    async def owners(self, selection: Selection) -> dict[str, str]:
        """Who owns each selected job or array (ids that name nothing are left out): read
        before anything changes, so that a request naming another's job changes nothing."""
        owners: dict[str, str] = {}
        unknown: dict[str, int] = {}
        for text in selection.ids:
            try:
                job_id, _ = parse_job_ref(text)
            except InvalidInput:
                continue
            known = self.jobs.jobs.get(job_id) or self.jobs.records.get(job_id)
            if known is not None:
                owners[text] = known.user
            else:
                unknown[text] = job_id
        if unknown:  # ended jobs: one read for all of them
            query = JobQuery(job_ids=tuple(sorted(set(unknown.values()))))
            stored = {j.id: j.user for j in await self.writer.read(lambda s: s.list_jobs(query))}
            owners.update({t: stored[i] for t, i in unknown.items() if i in stored})
        return owners

    async def resolve(
        self, selection: Selection, caller: Caller, applies_to: frozenset[JobState], cause: Cause
    ) -> tuple[list[Job], list[Unselected]]:
        """The jobs selected (each once, in the order named; by filters: in id order, only
        those in `applies_to`) and what named none. The caller holds `arrays.splitting`."""
        filters = selection.filters
        if not selection.ids:
            assert filters is not None
            found = select_live(self.jobs.jobs.values(), filters, caller.user, caller.admin)
            return [j for j in found if j.state in applies_to], []
        jobs, failed = await self._by_ids(selection.ids, caller, cause)
        if filters is not None:
            jobs = [j for j in jobs if filters.matches(j)]
        return jobs, failed

    async def _by_ids(
        self, ids: Iterable[str], caller: Caller, cause: Cause
    ) -> tuple[list[Job], list[Unselected]]:
        """Array ids are looked up in one index built for the request."""
        by_array: dict[int, list[Job]] = {}
        for job in self.jobs.jobs.values():
            if job.array_job_id is not None:
                by_array.setdefault(job.array_job_id, []).append(job)
        jobs: dict[int, Job] = {}
        failed: list[Unselected] = []
        unknown: list[tuple[str, int]] = []
        for text in ids:
            try:
                job_id, task = parse_job_ref(text)
                if task is not None:
                    found = [await self._task(job_id, task, caller, cause)]
                elif job_id in by_array:
                    found = sorted(by_array[job_id], key=lambda j: (j.array_task_id or -1, j.id))
                elif job_id in self.jobs.jobs:
                    found = [self.jobs.jobs[job_id]]
                else:
                    unknown.append((text, job_id))
                    continue
            except (InvalidInput, NotFound) as exc:
                failed.append(Unselected(text, exc))
                continue
            for job in found:
                jobs.setdefault(job.id, job)
        if unknown:  # not live: ended jobs (or none), read in one query
            query = JobQuery(job_ids=tuple(sorted({i for _, i in unknown})))
            stored = {j.id: j for j in await self.writer.read(lambda s: s.list_jobs(query))}
            for text, job_id in unknown:
                if job_id in stored:
                    jobs.setdefault(job_id, stored[job_id])
                else:
                    failed.append(Unselected(text, NotFound(f"no job {job_id}")))
        return list(jobs.values()), failed

    async def _task(self, array: int, task: int, caller: Caller, cause: Cause) -> Job:
        """`120_3`: a task not yet split off its array's record is split off first, so it
        can be acted on alone (an admin splits it as its owner)."""
        record = self.jobs.records.get(array)
        acting = record.user if caller.admin and record is not None else caller.user
        return await self.arrays.find_task(array, task, acting, cause)
