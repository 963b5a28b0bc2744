"""Submissions: what is refused at the door (what can never run, what exceeds a user's share
of the queue), request keys that make a retried submission idempotent, and the new job.

A job submitted to an idle queue starts in the transaction that creates it, as SLURM tries a
job at submission: one commit and one turn of the loop less between the submit and the job's
first command (issue 27). Only where commits run on the event loop (SQLite): a PostgreSQL
commit runs in the writer thread, and one that outlives its caller's timeout may land after
the caller let go of `starting`, its start unknown to the next pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.access.authority import user_groups
from gpuq.coordinator.changes.effects import Cause, Created, Effects
from gpuq.coordinator.changes.job_changes import JobChanges
from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.memory.live_jobs import LiveJobs, spec_size
from gpuq.coordinator.memory.node_table import NodeTable
from gpuq.coordinator.scheduling.scheduling_pass import SchedulingPass
from gpuq.coordinator.workload.array_tasks import ArrayTasks
from gpuq.domain.model import Job, JobSpec
from gpuq.domain.node_constraints import with_partitions
from gpuq.domain.partitions import admit
from gpuq.domain.states import JobState
from gpuq.domain.units import format_duration, format_size
from gpuq.errors import DoubleBooking, GpuqError, InvalidInput, Unsatisfiable
from gpuq.scheduler.fitting import never_fits, never_fits_reason
from gpuq.scheduler.gang import capable, is_gang, never_reason
from gpuq.scheduler.snapshot import Start
from gpuq.store.api import StoreTx
from gpuq.store.records import NewJob

# idempotent submission: a request key is kept (in the store) this long, and purged about
# hourly; the most recent keys are remembered, so a retry is answered from memory
KEY_TTL = 24 * 3600.0
KEY_PURGE_EVERY = 3600.0
KEYS_REMEMBERED = 10_000
MAX_REQUEST_KEY = 64
log = logging.getLogger(__name__)


class Submissions:
    def __init__(
        self,
        settings: CoordinatorSettings,
        writer: StoreWriter,
        jobs: LiveJobs,
        nodes: NodeTable,
        arrays: ArrayTasks,
        changes: JobChanges,
        scheduling: SchedulingPass,
        wake: Callable[[], None],
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.scheduling = scheduling  # a job submitted to an idle queue starts with it
        self.writer = writer
        self.jobs = jobs
        self.nodes = nodes
        self.arrays = arrays
        self.changes = changes
        self.wake = wake
        self.clock = clock
        # request keys of recent submissions -> (ids, when); then when to purge stored keys
        self._keys: dict[tuple[str, str], tuple[list[int], float]] = {}
        self._keys_purge_at = 0.0

    def in_partitions(self, spec: JobSpec, user: str) -> JobSpec:
        """The spec with its partitions settled: checked against `[partitions.NAME]` (the
        default partition for none; its default time and QOS filled in), or, where no
        partition is configured, read as node features, as they always were."""
        placement, partitions = spec.placement, self.settings.partitions
        if not partitions:
            if not placement.partitions:
                return spec
            constraint = with_partitions(placement.constraint, ",".join(placement.partitions))
            return replace(spec, placement=replace(placement, constraint=constraint, partitions=()))
        restricted = any(p.allow_groups for p in partitions.values())
        admitted = admit(
            partitions,
            placement.partitions,
            spec.resources.time_limit,
            spec.qos,
            user,
            user_groups(user) if restricted else (),
        )
        return replace(
            spec,
            placement=replace(placement, partitions=admitted.partitions),
            resources=replace(spec.resources, time_limit=admitted.time_limit),
            qos=admitted.qos,
        )

    async def check(self, spec: JobSpec, user: str) -> tuple[JobSpec, str, int]:
        """The job's spec as it is kept (its partitions settled), qos and stored priority;
        raises for what can never run."""
        spec = self.in_partitions(spec, user)
        qos = spec.qos or self.settings.default_qos
        tier = self.settings.qos.get(qos)
        if tier is None:
            known = ", ".join(sorted(self.settings.qos))
            raise InvalidInput("--qos", qos, f"no such qos; known: {known}")
        limit = spec.resources.time_limit
        if tier.max_time is not None and limit is not None and limit > tier.max_time:
            most = format_duration(tier.max_time)
            raise InvalidInput("--time", format_duration(limit), f"qos {qos} allows at most {most}")
        adding = len(spec.array.indices) if spec.array else 1
        self._check_share(spec, user, adding)
        views = self.nodes.views(self.jobs.in_state(JobState.RUNNING))
        if views and all(never_fits(v, spec.resources, spec.placement) for v in views):
            raise Unsatisfiable(never_fits_reason(views, spec.resources, spec.placement))
        if views and is_gang(spec.resources):  # N nodes, each able to hold its part
            found = capable(views, spec.resources, spec.placement)
            never = never_reason(spec.resources, spec.placement, found)
            if never is not None:
                raise Unsatisfiable(never)
        if tier.max_submitted_jobs is not None:
            mine = sum(
                len(j.tasks) or 1
                for j in self.jobs.jobs.values()
                if j.user == user and j.qos == qos
            )
            if mine + adding > tier.max_submitted_jobs:
                raise Unsatisfiable(
                    f"qos {qos} allows {tier.max_submitted_jobs} queued or running jobs per "
                    f"user; {user} has {mine} and this adds {adding}"
                )
        missing = await self.arrays.load_dependencies(spec.dependencies)
        if missing:
            raise InvalidInput("--after", missing[0], "no such job or array task")
        return spec, qos, tier.priority - spec.nice

    def _check_share(self, spec: JobSpec, user: str, adding: int) -> None:
        """A user's queued and running jobs are bounded in number and in bytes held."""
        settings = self.settings
        queued = self.jobs.user_tasks.get(user, 0)
        if queued + adding > settings.max_queued_per_user:
            raise Unsatisfiable(
                f"at most {settings.max_queued_per_user} queued or running jobs and array "
                f"tasks per user; {user} has {queued} and this adds {adding}"
            )
        held, size = self.jobs.user_bytes.get(user, 0), spec_size(spec)
        if held + size > settings.max_queued_bytes_per_user:
            raise Unsatisfiable(
                f"a user's queued and running jobs may hold at most "
                f"{format_size(settings.max_queued_bytes_per_user)} of scripts, "
                f"environments and arguments; {user}'s hold {format_size(held)} and this adds "
                f"{format_size(size)}"
            )

    async def submit(
        self,
        spec: JobSpec,
        user: str,
        cause: Cause,
        key: str | None = None,
        *,
        fail_fast: bool = False,
    ) -> list[int]:
        """The new job's ids; with a request key `key` that `user` gave before (within
        KEY_TTL), the first submission's ids, and nothing is created. `fail_fast`: a user's
        call, answered StorageUnavailable in bounded time when the store cannot take it (the
        user's retry with the same key is then no second job).

        A repeat is found in memory, or else by the store when the job is inserted (the key's
        primary key decides, also between two racing repeats): a new key costs no extra read."""
        if key is not None:
            check_request_key(key)
            known = self._keys.get((user, key))
            if known is not None and known[1] > self.clock() - KEY_TTL:
                return list(known[0])
        try:
            spec, qos, priority = await self.check(spec, user)
        except GpuqError:
            # the first request's own job may be why its retry no longer passes (a full queue)
            if key is not None:
                found = await self.writer.read(lambda s: s.submitted(user, key))
                if found is not None:
                    return found
            raise
        new = NewJob(spec, user, qos, priority, key, cause.text)
        if self._may_start_alone(new) and not self.scheduling.starting.locked():
            async with self.scheduling.starting:
                alone = self.scheduling.start_alone(new_job(new, 0, self.clock()))
                return await self._add(new, cause, fail_fast, alone)
        return await self._add(new, cause, fail_fast, None)

    def _may_start_alone(self, new: NewJob) -> bool:
        """A job that may start in its own transaction: one job (not held, no array), with
        commits on the loop (see the module docstring)."""
        return self.writer.commits_on_loop and not new.spec.hold and new.spec.array is None

    async def _add(
        self, new: NewJob, cause: Cause, fail_fast: bool, alone: Start | None
    ) -> list[int]:
        """Create the job, started with `alone` when that is given (and its units are still
        free in the store); its ids."""
        purge = self.clock() >= self._keys_purge_at
        if purge:
            self._keys_purge_at = self.clock() + KEY_PURGE_EVERY

        def decide(tx: StoreTx, now: float) -> tuple[Effects, tuple[list[int], bool, bool]]:
            if purge:
                tx.purge_submission_keys(now - KEY_TTL)
            ids, created = tx.add_job(new, now)
            if not created:
                return Effects(), (ids, False, False)
            effects = Effects(created=[Created(new_job(new, ids[0], now), "submitted")])
            if alone is not None:
                start = self.scheduling.start_record(alone, ids[0])
                try:
                    tx.start_jobs([start], now, cause=cause.text)
                except DoubleBooking as error:  # memory and the store disagree: a pass sees
                    log.warning("job %d waits for a pass: %s", ids[0], error)
                else:
                    effects.landed.append(start)  # written here: memory and the agent follow
            return effects, (ids, True, bool(effects.landed))

        ids, created, started = await self.changes.commit(decide, cause, fail_fast=fail_fast)
        if new.key is not None:
            self._remember(new.user, new.key, ids)
        if not created:
            await self._load_first(ids[0], cause)
            return ids
        if not new.spec.hold and not started:  # a held job changes nothing a pass could act on
            self.wake()
        return ids

    def _remember(self, user: str, key: str, ids: list[int]) -> None:
        if len(self._keys) >= KEYS_REMEMBERED:  # forget the older half (insertion order)
            for old in list(self._keys)[: KEYS_REMEMBERED // 2]:
                del self._keys[old]
        self._keys[(user, key)] = (ids, self.clock())

    async def _load_first(self, first: int, cause: Cause) -> None:
        """The first request's job; memory lacks it only if that write was committed but
        reported lost (and so tried again): then memory takes it now."""
        if self.jobs.is_live(first):
            return
        job = await self.writer.read(lambda s: s.get_job(first))
        if job.state.is_live and not self.jobs.is_live(first):
            self.changes.apply(Effects(loaded=[job]), self.clock(), cause)
            self.wake()


def new_job(new: NewJob, job_id: int, now: float) -> Job:
    """The job a submission made, as memory keeps it (the store made its row the same way)."""
    spec = new.spec
    tasks = spec.array.indices if spec.array else ()
    return Job(
        id=job_id,
        spec=spec,
        user=new.user,
        state=JobState.HELD if spec.hold else JobState.PENDING,
        qos=new.qos,
        priority=new.priority,
        submit_time=now,
        array_job_id=job_id if spec.array else None,
        array_task_id=tasks[0] if len(tasks) == 1 else None,
        reason="submitted",
        tasks=tasks if len(tasks) > 1 else (),
    )


def check_request_key(key: str) -> None:
    """A request key is 1 to MAX_REQUEST_KEY printable ASCII characters."""
    if not key or len(key) > MAX_REQUEST_KEY or not (key.isascii() and key.isprintable()):
        shown = key if len(key) <= MAX_REQUEST_KEY else key[:MAX_REQUEST_KEY] + "..."
        raise InvalidInput(
            "request key", shown, f"must be 1 to {MAX_REQUEST_KEY} printable ASCII characters"
        )
