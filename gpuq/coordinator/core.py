"""The coordinator: accepts work, runs scheduling passes, and keeps jobs and agents in step.

Every change follows one path: a write function decides inside a store transaction (through
StoreWriter, which batches), then memory follows, then agents and watchers are told. The
servicers call the public coroutines here and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.arrays import Arrays
from gpuq.coordinator.cluster import ClusterState, NodeEntry, spec_size
from gpuq.coordinator.edits import (
    Edit,
    Filters,
    Update,
    check_requeue,
    dependency_cycle,
    plan_update,
    select_live,
)
from gpuq.coordinator.idle import IdleWatch
from gpuq.coordinator.notifier import Notifier
from gpuq.coordinator.scheduling import SchedulingState
from gpuq.coordinator.telemetry import RunningTelemetry
from gpuq.coordinator.terminals import Terminals
from gpuq.coordinator.writer import RETRY_FIRST, RETRY_MOST, StoreWriter, is_storage_error
from gpuq.domain.dependencies import parse_job_ref
from gpuq.domain.limits import brief, check_text
from gpuq.domain.model import (
    Drain,
    GpuUnit,
    Job,
    JobEvent,
    JobResult,
    JobSpec,
    JobTelemetry,
    Node,
    NodeState,
)
from gpuq.domain.states import JobState, check_transition
from gpuq.domain.units import format_duration, format_size
from gpuq.errors import (
    GpuqError,
    IllegalTransition,
    InvalidInput,
    NotFound,
    PermissionDenied,
    StorageUnavailable,
    Unsatisfiable,
)
from gpuq.identity import new_user_token, token_digest
from gpuq.scheduler.fitting import never_fits, never_fits_reason
from gpuq.store.api import Store, StoreTx
from gpuq.store.records import REQUEUABLE, JobEdit, JobQuery, NewJob, StateChange

log = logging.getLogger(__name__)

LIVE = frozenset({JobState.PENDING, JobState.HELD, JobState.RUNNING})
# seconds from one scheduling pass to the next, at least: when idle a pass runs at once, and
# under load whatever arrived meanwhile (submissions, job ends) shares one pass and one commit
PASS_GAP = 0.005
WATCH_GAP = 0.003  # seconds between two batches of events to one watcher under load
# idempotent submission: a request key is kept (in the store) this long, and purged about
# hourly; the most recent keys are remembered, so a retry is answered from memory
KEY_TTL = 24 * 3600.0
KEY_PURGE_EVERY = 3600.0
KEYS_REMEMBERED = 10_000
MAX_REQUEST_KEY = 64
LOGGED_JOBS = 20  # an admin's action on others' jobs: logged one line per job up to this
MAX_DRAIN_REASON = 500  # characters of an admin's drain reason


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an action (cancel, hold, release) did to one job."""

    job_id: str
    done: bool
    message: str


@dataclass(frozen=True, slots=True)
class Ending:
    """A running job whose processes are gone (or are given up for lost)."""

    job_id: int
    state: JobState
    reason: str
    result: JobResult | None = None
    at: float | None = None  # when the supervisor saw it end; None: now
    # the start it is about (JobLaunch.attempt): an end of another start is ignored; 0: any
    attempt: int = 0
    # what its GPUs did over the run (its end report's); None: the latest heartbeat's stands in
    telemetry: JobTelemetry | None = None


@dataclass(frozen=True, slots=True)
class StopOrder:
    job_id: int
    end_state: JobState
    reason: str
    grace: float
    signal: int = 15
    attempt: int = 0  # the start it stops; 0: the job's current one


class Coordinator:
    def __init__(
        self,
        store: Store,
        settings: CoordinatorSettings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        # per-user tokens for TCP callers, digest -> user (shared with the Authority)
        self.tokens: dict[str, str] = {}
        self.writer = StoreWriter(store)
        self.sched = SchedulingState(settings)
        self.cluster = ClusterState(
            self.sched.key, lambda job: self.sched.priority(job, self.sched.ranked_at)
        )
        self._dirty = asyncio.Event()
        self._watchers: set[tuple[frozenset[int], asyncio.Queue[tuple[JobEvent, int | None]]]] = (
            set()
        )
        self._tasks: list[asyncio.Task[None]] = []
        self.passes = 0
        self.arrays = Arrays(self)
        # request keys of recent submissions -> (ids, when); then when to purge stored keys
        self._keys: dict[tuple[str, str], tuple[list[int], float]] = {}
        self._keys_purge_at = 0.0
        # set by the agent module (gpuq.coordinator.agents) to tell agents what to do
        self.send_stops: Callable[[Sequence[StopOrder]], None] = lambda orders: None
        self.send_starts: Callable[[Sequence[Job]], None] = lambda jobs: None
        # set by gpuq.coordinator.passes: run one scheduling pass
        self.run_pass: Callable[[], Awaitable[None]] | None = None
        # told of every job event once watchers are (gpuq.coordinator.metrics counts them)
        self.observe: Callable[[JobEvent, Job | None], None] = lambda event, job: None
        # running jobs' idle and hung flags, from their agents' samples (gpuq.coordinator.agents)
        self.idle = IdleWatch()
        # running jobs' GPU telemetry so far, from the same samples (gpuq.coordinator.telemetry)
        self.telemetry = RunningTelemetry(self)
        # running jobs `gpuq requeue --hold` stopped: held, not pending, once they end
        self._requeue_held: set[int] = set()
        # interactive jobs' terminals (gpuq run, gpuq alloc): relayed, and followed here
        self.terminals = Terminals(self)
        # mail and webhooks on state changes, admins' webhooks on health changes
        self.notifier = Notifier(self)

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Load live jobs and nodes; nodes get a full heartbeat timeout to reconnect."""
        jobs = await self.writer.read(lambda s: s.list_jobs(JobQuery(states=LIVE)))
        nodes = await self.writer.read(lambda s: s.list_nodes())
        self.sched.usage = await self.writer.read(lambda s: s.usage())
        now = self.clock()
        self.sched.refresh_shares({j.user for j in jobs}, now)
        self.cluster.reset(jobs)
        await self.arrays.load_outcomes({j.array_job_id for j in jobs} - {None})
        await self.arrays.load_dependencies(d for j in jobs for d in j.spec.dependencies)
        for node in nodes:
            self.cluster.nodes[node.name] = NodeEntry(node, last_seen=now)
        self.tokens.update(await self.writer.read(lambda s: s.user_tokens()))
        drains = await self.writer.read(lambda s: s.drains())
        self.cluster.drains = {(d.node, d.unit): d for d in drains}
        self.writer.start()
        self._tasks.append(asyncio.create_task(self._schedule_loop(), name="scheduler"))
        self.notifier.start()
        self.wake()
        log.info("coordinator started: %d live jobs, %d known nodes", len(jobs), len(nodes))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for entry in self.cluster.nodes.values():
            if entry.session is not None:
                entry.session.close()
        await self.telemetry.close()
        await self.notifier.close()
        await self.writer.close()

    def wake(self) -> None:
        """Ask for a scheduling pass (many asks before it runs make one pass)."""
        self._dirty.set()

    # ---- submissions and user actions ----------------------------------------------------

    def effective_time_limit(self, job: Job) -> int | None:
        limit = self.sched.time_limit(job)
        return int(limit) if limit else None

    async def check_submission(self, spec: JobSpec, user: str) -> tuple[str, int]:
        """The job's qos and stored priority; raises for what can never run."""
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
        queued = self.cluster.user_tasks.get(user, 0)
        if queued + adding > self.settings.max_queued_per_user:
            raise Unsatisfiable(
                f"at most {self.settings.max_queued_per_user} queued or running jobs and array "
                f"tasks per user; {user} has {queued} and this adds {adding}"
            )
        held, size = self.cluster.user_bytes.get(user, 0), spec_size(spec)
        if held + size > self.settings.max_queued_bytes_per_user:
            raise Unsatisfiable(
                f"a user's queued and running jobs may hold at most "
                f"{format_size(self.settings.max_queued_bytes_per_user)} of scripts, "
                f"environments and arguments; {user}'s hold {format_size(held)} and this adds "
                f"{format_size(size)}"
            )
        views = self.cluster.node_views()
        if views and all(never_fits(v, spec.resources, spec.placement) for v in views):
            raise Unsatisfiable(never_fits_reason(views, spec.resources, spec.placement))
        if tier.max_submitted_jobs is not None:
            mine = sum(
                len(j.tasks) or 1
                for j in self.cluster.jobs.values()
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
        return qos, tier.priority - spec.nice

    async def submit(self, spec: JobSpec, user: str, key: str | None = None) -> list[int]:
        """The new job's ids; with a request key `key` that `user` gave before (within
        KEY_TTL), the first submission's ids, and nothing is created.

        A repeat is found in memory, or else by the store when the job is inserted (the key's
        primary key decides, also between two racing repeats): a new key costs no extra read."""
        if key is not None:
            check_request_key(key)
            known = self._keys.get((user, key))
            if known is not None and known[1] > self.clock() - KEY_TTL:
                return list(known[0])
        try:
            qos, priority = await self.check_submission(spec, user)
        except GpuqError:
            # the first request's own job may be why its retry no longer passes (a full queue)
            if key is not None:
                found = await self.writer.read(lambda s: s.submitted(user, key))
                if found is not None:
                    return found
            raise
        new = NewJob(spec, user, qos, priority, key)
        now = self.clock()
        purge = now >= self._keys_purge_at
        if purge:
            self._keys_purge_at = now + KEY_PURGE_EVERY

        def write(tx: StoreTx) -> tuple[list[int], bool]:
            if purge:
                tx.purge_submission_keys(now - KEY_TTL)
            return tx.add_job(new, now)

        ids, created = await self.writer.write(write)
        if key is not None:
            if len(self._keys) >= KEYS_REMEMBERED:  # forget the older half (insertion order)
                for old in list(self._keys)[: KEYS_REMEMBERED // 2]:
                    del self._keys[old]
            self._keys[(user, key)] = (ids, now)
        if not created:
            # the first request's job; memory lacks it only if that write was committed but
            # reported lost (and so tried again): then memory takes it now
            first = ids[0]
            if not self._is_live(first):
                job = await self.writer.read(lambda s: s.get_job(first))
                if job.state.is_live and not self._is_live(first):
                    self.cluster.put(job)
                    self.wake()
            return ids
        state = JobState.HELD if spec.hold else JobState.PENDING
        [job_id] = ids
        tasks = spec.array.indices if spec.array else ()
        job = Job(
            id=job_id,
            spec=spec,
            user=user,
            state=state,
            qos=qos,
            priority=priority,
            submit_time=now,
            array_job_id=job_id if spec.array else None,
            array_task_id=tasks[0] if len(tasks) == 1 else None,
            reason="submitted",
            tasks=tasks if len(tasks) > 1 else (),
        )
        self.cluster.put(job)
        self.publish(JobEvent(job_id, now, None, state, "submitted"), job)
        if state is JobState.PENDING:  # a held job changes nothing a pass could act on
            self.wake()
        return ids

    async def cancel(
        self,
        selection: Sequence[str],
        user: str,
        reason: str = "",
        *,
        admin: bool = False,
        filters: Filters | None = None,
    ) -> list[Outcome]:
        why = reason or f"cancelled by {user}"
        return await self._act(
            "cancelled",
            selection,
            user,
            admin,
            lambda jobs: self._cancel_many(jobs, why),
            filters,
            LIVE,
        )

    async def hold(
        self,
        selection: Sequence[str],
        user: str,
        *,
        admin: bool = False,
        filters: Filters | None = None,
    ) -> list[Outcome]:
        return await self._act(
            "held",
            selection,
            user,
            admin,
            lambda jobs: self._change_many(jobs, JobState.HELD, f"held by {user}"),
            filters,
            frozenset({JobState.PENDING}),
        )

    async def release(
        self,
        selection: Sequence[str],
        user: str,
        *,
        admin: bool = False,
        filters: Filters | None = None,
    ) -> list[Outcome]:
        return await self._act(
            "released",
            selection,
            user,
            admin,
            lambda jobs: self._change_many(jobs, JobState.PENDING, f"released by {user}"),
            filters,
            frozenset({JobState.HELD}),
        )

    async def update(
        self, selection: Sequence[str], changes: Update, user: str, *, admin: bool = False
    ) -> list[Outcome]:
        """`gpuq update`: change waiting jobs (gpuq.coordinator.edits has the rules). Each
        job's change is decided first; one refused change (another's job, an owner raising a
        limit) refuses the request as a whole, before anything changes."""
        if not changes:
            raise InvalidInput("update", "nothing", "say what to change, e.g. --time 1:00:00")
        if not selection:
            raise InvalidInput("job ids", "none", "name the jobs to update")
        return await self._act(
            "updated",
            selection,
            user,
            admin,
            lambda jobs: self._update_many(jobs, changes, user, admin),
        )

    async def _update_many(
        self, jobs: list[Job], changes: Update, user: str, admin: bool
    ) -> list[str | Exception]:
        tiers = self.settings.qos
        edits: list[Edit] = []
        results: list[str | Exception | Edit] = []
        for job in jobs:
            try:
                edit = plan_update(job, changes, user, admin, tiers)
            except PermissionDenied:
                raise  # an owner asked for what only admins may: nothing changes
            except GpuqError as exc:
                results.append(exc)
                continue
            edits.append(edit)
            results.append(edit)
        if changes.set_dependencies and edits:
            missing = await self.arrays.load_dependencies(changes.dependencies)
            if missing:
                raise InvalidInput("--after", missing[0], "no such job or array task")
            waits_on = {
                j.id: [d.job_id for d in j.spec.dependencies] for j in self.cluster.jobs.values()
            }
            for edit in edits:
                looped = dependency_cycle(edit.job.id, changes.dependencies, waits_on)
                if looped is not None:
                    raise InvalidInput(
                        "--after",
                        str(looped),
                        f"it waits for job {edit.job.display_id} (a cycle never starts)",
                    )
        if not admin:
            self._check_qos_room(edits)
        if edits:
            views = self.cluster.node_views()
            for edit in edits:
                if views and all(
                    never_fits(v, edit.spec.resources, edit.spec.placement) for v in views
                ):
                    raise Unsatisfiable(
                        f"job {edit.job.display_id}: "
                        + never_fits_reason(views, edit.spec.resources, edit.spec.placement)
                    )
        now = self.clock()
        written = [e for e in edits if e.changes or e.to_state is not None]

        def write(tx: StoreTx) -> None:
            tx.edit_jobs(
                [
                    JobEdit(
                        e.job.id,
                        e.spec,
                        e.qos,
                        e.priority,
                        f"updated by {user}: " + "; ".join(e.changes),
                    )
                    for e in written
                    if e.changes
                ],
                now,
            )
            moves = [e for e in written if e.to_state is not None]
            tx.transition(
                [
                    StateChange(
                        e.job.id,
                        e.to_state,
                        f"{'held' if e.to_state is JobState.HELD else 'released'} by {user}",
                    )
                    for e in moves
                    if e.to_state is not None
                ],
                now,
            )

        if written:
            await self.writer.write(write, fail_fast=True)  # the user may retry
        out: list[str | Exception] = []
        for result in results:
            if not isinstance(result, Edit):
                out.append(result)
                continue
            edit = result
            live = self.cluster.jobs.get(edit.job.id)
            words = list(edit.changes)
            if live is not None and edit.changes:
                live = replace(live, spec=edit.spec, qos=edit.qos, priority=edit.priority)
                self.cluster.put(live)
                reason = f"updated by {user}: " + "; ".join(edit.changes)
                self.publish(JobEvent(live.id, now, live.state, live.state, reason), live)
            if edit.to_state is not None and live is not None:
                verb = "held" if edit.to_state is JobState.HELD else "released"
                self._moved(live.id, live.state, edit.to_state, f"{verb} by {user}")
                words.append(verb)
            out.append("updated: " + "; ".join(words) if words else "unchanged")
        return out

    def _check_qos_room(self, edits: Sequence[Edit]) -> None:
        """A QOS's max_submitted_jobs binds owners who move jobs into it, as at submit."""
        moving: Counter[tuple[str, str]] = Counter()
        for edit in edits:
            if edit.qos != edit.job.qos:
                moving[(edit.job.user, edit.qos)] += len(edit.job.tasks) or 1
        for (owner, qos), adding in moving.items():
            most = self.settings.qos[qos].max_submitted_jobs
            if most is None:
                continue
            mine = sum(
                len(j.tasks) or 1
                for j in self.cluster.jobs.values()
                if j.user == owner and j.qos == qos
            )
            if mine + adding > most:
                raise Unsatisfiable(
                    f"qos {qos} allows {most} queued or running jobs per user; {owner} has "
                    f"{mine} and this adds {adding}"
                )

    async def requeue(
        self,
        selection: Sequence[str],
        user: str,
        *,
        admin: bool = False,
        filters: Filters | None = None,
        hold: bool = False,
    ) -> list[Outcome]:
        """`gpuq requeue` (SLURM's scontrol requeue): running jobs are stopped as a
        preemption stops them and go back to the queue with the same id; ended jobs are
        queued again at once; `hold`: held instead of pending. Jobs submitted with
        --no-requeue are refused, as SLURM refuses them."""
        reason = f"requeued by {user}" + (" (held)" if hold else "")
        return await self._act(
            "requeued",
            selection,
            user,
            admin,
            lambda jobs: self._requeue_many(jobs, reason, hold),
            filters,
            frozenset({JobState.RUNNING}),
        )

    async def _requeue_many(
        self, jobs: list[Job], reason: str, hold: bool
    ) -> list[str | Exception]:
        results: list[str | Exception] = []
        running: list[Job] = []
        ended: list[Job] = []
        for job in jobs:
            try:
                check_requeue(job)
            except GpuqError as exc:
                results.append(exc)
                continue
            (running if job.state is JobState.RUNNING else ended).append(job)
            results.append("")
        now = self.clock()

        def write(tx: StoreTx) -> tuple[dict[int, JobState], list[int]]:
            states = tx.job_states([j.id for j in running + ended])
            stopping = [j.id for j in running if states.get(j.id) is JobState.RUNNING]
            for job_id in stopping:
                tx.request_stop(job_id, JobState.PREEMPTED, reason)
            back = [j.id for j in ended if states.get(j.id) in REQUEUABLE]
            tx.requeue_jobs(back, reason, now, hold=hold)
            return states, stopping

        states, stopping = await self.writer.write(write, fail_fast=True)
        grace = self.settings.kill_grace
        stops: list[StopOrder] = []
        done: dict[int, str | Exception] = {}
        for job in running:
            if job.id in stopping:
                self._stop_requested(job.id, JobState.PREEMPTED, reason)
                if hold:
                    self._requeue_held.add(job.id)
                warning = job.spec.signal.signal if job.spec.signal else 15
                stops.append(StopOrder(job.id, JobState.PREEMPTED, reason, grace, int(warning)))
                done[job.id] = f"stopping to requeue (then SIGKILL after {grace:g} s)"
            else:
                done[job.id] = Unsatisfiable(
                    f"job {job.display_id} is {states.get(job.id, 'gone')}: not requeued"
                )
        for job in ended:
            state = states.get(job.id)
            if state not in REQUEUABLE:
                done[job.id] = Unsatisfiable(f"job {job.display_id} is {state}: not requeued")
                continue
            after = JobState.HELD if hold else JobState.PENDING
            back = replace(
                job,
                state=after,
                node=None,
                end_time=None,
                result=None,
                stop=None,
                reason=reason,
                requeue_count=job.requeue_count + 1,
            )
            self.cluster.put(back)
            self.publish(JobEvent(job.id, now, state, JobState.PENDING, reason), back)
            if hold:
                self.publish(JobEvent(job.id, now, JobState.PENDING, JobState.HELD, reason), back)
            done[job.id] = f"requeued ({after.value})"
        if stops:
            self.send_stops(stops)
        return [
            result if result != "" else done[job.id]
            for job, result in zip(jobs, results, strict=True)
        ]

    async def _owners(self, selection: Sequence[str]) -> dict[str, str]:
        """Who owns each selected job or array (ids that name nothing are left out): read
        before anything changes, so that a request naming another's job changes nothing."""
        owners: dict[str, str] = {}
        unknown: dict[str, int] = {}
        for text in selection:
            try:
                job_id, _ = parse_job_ref(text)
            except InvalidInput:
                continue
            known = self.cluster.jobs.get(job_id) or self.cluster.records.get(job_id)
            if known is not None:
                owners[text] = known.user
            else:
                unknown[text] = job_id
        if unknown:  # ended jobs: one read for all of them
            query = JobQuery(job_ids=tuple(sorted(set(unknown.values()))))
            stored = {j.id: j.user for j in await self.writer.read(lambda s: s.list_jobs(query))}
            owners.update({t: stored[i] for t, i in unknown.items() if i in stored})
        return owners

    async def _act(
        self,
        verb: str,
        selection: Sequence[str],
        user: str,
        admin: bool,
        action: Callable[[list[Job]], Awaitable[list[str | Exception]]],
        filters: Filters | None = None,
        applies_to: frozenset[JobState] = LIVE,
    ) -> list[Outcome]:
        """Act on the selected jobs: the ids in `selection`, or (with filters and no ids)
        every live job that matches them and that the verb applies to (`applies_to`). A user
        may act on their own jobs only (an admin on any: logged); one job of another user's
        in the request refuses all of it, before anything changes.

        One request is one batch: the jobs are resolved first, then changed in one store
        transaction (`action` gets them all), then one scheduling pass follows."""
        if filters is not None and filters.user and filters.user != user and not admin:
            raise PermissionDenied(f"only admins may act on another user's jobs ({filters.user})")
        owners = await self._owners(selection)
        for text, owner in owners.items():
            if owner != user and not admin:
                raise PermissionDenied(f"job {brief(text)} belongs to {owner}, not to {user}")
        outcomes: list[Outcome] = []
        async with self.arrays.splitting:  # no task leaves an array between select and action
            if selection:
                jobs, failed = await self._select_all(selection, user, admin)
                if filters is not None:
                    jobs = [j for j in jobs if filters.matches(j)]
            else:
                assert filters is not None
                jobs, failed = select_live(self.cluster.jobs.values(), filters, user, admin), []
                jobs = [j for j in jobs if j.state in applies_to]
            outcomes.extend(failed)
            for job in jobs:
                if job.user != user and not admin:
                    raise PermissionDenied(f"job {job.display_id} belongs to {job.user}")
            others = [j for j in jobs if j.user != user]
            for job in others[:LOGGED_JOBS]:
                log.warning("admin %s %s job %s of %s", user, verb, job.display_id, job.user)
            if len(others) > LOGGED_JOBS:
                log.warning(
                    "admin %s %s %d more jobs of other users", user, verb, len(others) - LOGGED_JOBS
                )
            try:
                results = await action(jobs) if jobs else []
            except StorageUnavailable:  # the whole call fails (UNAVAILABLE): the user retries
                self.wake()
                raise
        for job, result in zip(jobs, results, strict=True):
            if isinstance(result, BaseException):
                outcomes.append(Outcome(job.display_id, False, str(result)))
            else:
                outcomes.append(Outcome(job.display_id, True, result))
        self.wake()
        return outcomes

    async def _select_all(
        self, selection: Sequence[str], user: str, admin: bool
    ) -> tuple[list[Job], list[Outcome]]:
        """The jobs the ids name (each once, in the order named) and an outcome for each id
        that names none. Array ids are looked up in one index built for the request."""
        by_array: dict[int, list[Job]] = {}
        for job in self.cluster.jobs.values():
            if job.array_job_id is not None:
                by_array.setdefault(job.array_job_id, []).append(job)
        jobs: dict[int, Job] = {}
        failed: list[Outcome] = []
        unknown: list[tuple[str, int]] = []
        for text in selection:
            try:
                job_id, task = parse_job_ref(text)
                if task is not None:
                    found = [await self._select(text, user, admin)]
                elif job_id in by_array:
                    found = sorted(by_array[job_id], key=lambda j: (j.array_task_id or -1, j.id))
                elif job_id in self.cluster.jobs:
                    found = [self.cluster.jobs[job_id]]
                else:
                    unknown.append((text, job_id))
                    continue
            except (InvalidInput, NotFound) as exc:
                failed.append(Outcome(text, False, str(exc)))
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
                    failed.append(Outcome(text, False, f"no job {job_id}"))
        return list(jobs.values()), failed

    async def _select(self, text: str, user: str, admin: bool = False) -> Job:
        """`120_3`: a task not yet split off its array's record is split off first, so it
        can be acted on alone."""
        job_id, task = parse_job_ref(text)
        assert task is not None
        record = self.cluster.records.get(job_id)
        acting = record.user if admin and record is not None else user
        return await self.arrays.find_task(job_id, task, acting)

    async def _cancel_many(self, jobs: list[Job], reason: str) -> list[str | Exception]:
        """Cancel in one transaction: a running job is asked to stop (it ends when its agent
        reports it gone), a waiting one is cancelled at once."""
        grace = self.settings.kill_grace
        now = self.clock()

        def write(tx: StoreTx) -> dict[int, JobState]:
            states = tx.job_states([j.id for j in jobs])
            changes: list[StateChange] = []
            for job in jobs:
                state = states.get(job.id)
                if state is JobState.RUNNING:
                    tx.request_stop(job.id, JobState.CANCELLED, reason)
                elif state is not None and state.is_live:
                    changes.append(StateChange(job.id, JobState.CANCELLED, reason))
            tx.transition(changes, now)
            return states

        states = await self.writer.write(write, fail_fast=True)  # the user may retry
        results: list[str | Exception] = []
        stops: list[StopOrder] = []
        for job in jobs:
            state = states.get(job.id)
            if state is None:
                results.append(NotFound(f"no job {job.id}"))
            elif state is JobState.RUNNING:
                self._stop_requested(job.id, JobState.CANCELLED, reason)
                stops.append(StopOrder(job.id, JobState.CANCELLED, reason, grace))
                results.append(f"stopping (SIGTERM, then SIGKILL after {grace:g} s)")
            elif not state.is_live:
                results.append(f"already {state.value}")
            else:
                self._ended(job.id, state, JobState.CANCELLED, reason)
                results.append("cancelled")
        if stops:
            self.send_stops(stops)
        return results

    async def _change_many(
        self, jobs: list[Job], to_state: JobState, reason: str
    ) -> list[str | Exception]:
        """Move jobs to `to_state` in one transaction; a job the table refuses (or that is
        gone) gets its error as its outcome and the others still change."""
        now = self.clock()

        def write(tx: StoreTx) -> list[JobState | Exception]:
            states = tx.job_states([j.id for j in jobs])
            befores: list[JobState | Exception] = []
            changes: list[StateChange] = []
            for job in jobs:
                state = states.get(job.id)
                if state is None:
                    befores.append(NotFound(f"no job {job.id}"))
                    continue
                try:
                    check_transition(job.id, state, to_state)
                except IllegalTransition as exc:
                    befores.append(exc)
                    continue
                befores.append(state)
                changes.append(StateChange(job.id, to_state, reason))
            tx.transition(changes, now)
            return befores

        befores = await self.writer.write(write, fail_fast=True)  # the user may retry
        results: list[str | Exception] = []
        for job, before in zip(jobs, befores, strict=True):
            if isinstance(before, Exception):
                results.append(before)
            else:
                self._moved(job.id, before, to_state, reason)
                results.append(to_state.value)
        return results

    # ---- admins: drain and resume -------------------------------------------------------------

    def drain_targets(self, node: str, gpu: str) -> tuple[NodeEntry, list[GpuUnit]]:
        """The node and the units `gpu` names there: an index as `gpuq nodes` shows it (every
        MIG slice of that GPU), a unit's UUID, or "" (the whole node: no units). NotFound
        for an unknown node or GPU."""
        entry = self.cluster.nodes.get(node)
        if entry is None:
            known = ", ".join(sorted(self.cluster.nodes)) or "none yet"
            raise NotFound(f"no node {brief(node)} (known nodes: {brief(known)})")
        if not gpu:
            return entry, []
        units = entry.node.units
        if gpu.isascii() and gpu.isdigit():
            found = [u for u in units if str(u.index) == gpu.lstrip("0").rjust(1, "0")]
        else:
            found = [u for u in units if u.uuid == gpu]
        if not found:
            indices = sorted({u.index for u in units})
            have = f"GPUs {', '.join(map(str, indices))}" if indices else "no GPUs"
            raise NotFound(
                f"node {node} has no GPU {brief(gpu)} (it has {have}; give an index as "
                "gpuq nodes shows it, or a GPU or MIG UUID)"
            )
        return entry, found

    async def drain(self, node: str, gpu: str, reason: str, user: str) -> tuple[list[str], str]:
        """An admin takes a node (gpu "") or a GPU out of service: no new work goes there,
        running jobs continue. Kept in the store until resume. (units drained, message)"""
        reason = " ".join(reason.split())
        if not reason:
            raise InvalidInput("--reason", "", "say why (it is shown in gpuq nodes)")
        check_text("--reason", reason, MAX_DRAIN_REASON)
        _, units = self.drain_targets(node, gpu)
        now = self.clock()
        drains = [Drain(node, u.uuid, reason, user, now) for u in units] or [
            Drain(node, "", reason, user, now)
        ]

        def write(tx: StoreTx) -> None:
            for drain in drains:
                tx.set_drain(drain)

        await self.writer.write(write, fail_fast=True)  # the admin may retry
        for drain in drains:
            self.cluster.drains[(drain.node, drain.unit)] = drain
        what = _target_text(node, units)
        running = [
            j.id
            for j in self.cluster.running_on(node)
            if not units or set(j.gpus) & {u.uuid for u in units}
        ]
        log.warning("%s drained by %s: %s", what, user, reason)
        self.wake()  # pending reasons change
        message = f"{what} drained: {reason}"
        if running:
            jobs = ", ".join(map(str, running[:10])) + (", ..." if len(running) > 10 else "")
            message += f" (running jobs continue: {jobs})"
        return [u.uuid for u in units], message

    async def issue_token(self, user: str, by: str) -> str:
        """A new per-user token for `user` (gpuq.identity), kept as its digest."""
        check_user_name(user)
        token = new_user_token()
        digest = token_digest(token)
        now = self.clock()
        await self.writer.write(lambda tx: tx.add_user_token(digest, user, by, now))
        self.tokens[digest] = user
        log.warning("token issued for %s by %s", user, by)
        return token

    async def revoke_tokens(self, user: str, by: str) -> int:
        check_user_name(user)
        count = await self.writer.write(lambda tx: tx.revoke_user_tokens(user))
        for digest in [d for d, owner in self.tokens.items() if owner == user]:
            del self.tokens[digest]
        log.warning("%d token(s) of %s revoked by %s", count, user, by)
        return count

    async def resume(self, node: str, gpu: str, user: str) -> tuple[list[str], str]:
        """Undo an admin's drain of a node or a GPU. A unit its agent reports unhealthy or
        dirty stays out of service, and the message says so."""
        entry, units = self.drain_targets(node, gpu)
        keys = [(node, u.uuid) for u in units] or [(node, "")]

        def write(tx: StoreTx) -> list[bool]:
            return [tx.clear_drain(n, u) for n, u in keys]

        cleared = await self.writer.write(write, fail_fast=True)
        for key in keys:
            self.cluster.drains.pop(key, None)
        what = _target_text(node, units)
        if any(cleared):
            log.warning("%s resumed by %s", what, user)
            message = f"{what} resumed"
        else:
            message = f"{what} was not drained"
        notes: list[str] = []
        agent = entry.agent_health()
        for unit in units:
            if unit.uuid in agent:
                health, why = agent[unit.uuid]
                notes.append(f"{unit.label} stays {health.value} per its agent: {why}")
        if not units:
            still = [u for u in entry.node.units if (node, u.uuid) in self.cluster.drains]
            if still:
                labels = ", ".join(sorted({u.label for u in still}))
                notes.append(f"still drained: {labels} (gpuq resume {node}:{still[0].index})")
            if entry.drained:
                notes.append(f"its agent still takes no work: {entry.drained}")
        self.wake()
        return [u.uuid for u in units], "; ".join([message, *notes])

    # ---- reads -----------------------------------------------------------------------------

    async def get_job(
        self, job_id: int, task: int | None = None
    ) -> tuple[Job, list[JobEvent], dict[JobState, int]]:
        """A job (or task `task` of array `job_id`), its history and, for an array's id (or a
        task still in its record), how many of the array's tasks are in each state."""
        if task is not None:
            job_id = (await self.arrays.find_task(job_id, task)).id
        job, events = await self.writer.read(lambda s: (s.get_job(job_id), s.events(job_id)))
        if job.state is JobState.RUNNING:  # the figures of its latest heartbeat, not yet stored
            latest = self.telemetry.latest(job.id, job.start_count)
            if latest is not None:
                job = replace(job, telemetry=latest)
        counts: dict[JobState, int] = {}
        if job.array_job_id == job.id:
            array = job.id
            counts = (await self.writer.read(lambda s: s.array_states([array]))).get(array, {})
        return job, events, counts

    async def list_jobs(self, query: JobQuery) -> list[Job]:
        return await self.writer.read(lambda s: s.list_jobs(query))

    def live_jobs(self, user: str | None = None) -> list[Job]:
        """From memory: what `gpuq queue` shows, without a database round trip."""
        jobs = sorted(self.cluster.jobs.values(), key=lambda j: j.id)
        return [j for j in jobs if user is None or j.user == user]

    async def watch(self, job_ids: Iterable[int]) -> AsyncIterator[list[JobEvent]]:
        """Events as they commit, in batches (whatever queued up since the last one); ends
        once every watched job has finished.

        Under load (a batch came within WATCH_GAP of the one before, twice in a row) batches
        leave WATCH_GAP apart, so one message carries many events; otherwise an event leaves
        at once, and the few events of one job (submitted, running, ended) are not delayed."""
        loop = asyncio.get_running_loop()
        last = -WATCH_GAP
        busy = False
        wanted = frozenset(job_ids)
        queue: asyncio.Queue[tuple[JobEvent, int | None]] = asyncio.Queue()
        entry = (wanted, queue)
        self._watchers.add(entry)
        try:
            # memory holds every live job: what is not there has ended
            remaining = {i for i in wanted if self._is_live(i)}
            while not wanted or remaining or not queue.empty():
                items = [await queue.get()]
                gap = last + WATCH_GAP - loop.time()
                if gap > 0 and busy:
                    await asyncio.sleep(gap)
                busy = gap > 0
                while not queue.empty():
                    items.append(queue.get_nowait())
                last = loop.time()  # when it left: the yield returns once it was written
                yield [event for event, _ in items]
                touched = {i for e, a in items for i in (e.job_id, a) if i in wanted}
                remaining -= {i for i in touched if not self._is_live(i)}
                remaining |= {i for i in touched if self._is_live(i)}
        finally:
            self._watchers.discard(entry)

    def _is_live(self, job_id: int) -> bool:
        """The job, or any task of the array of that id, may still run."""
        return job_id in self.cluster.jobs or bool(self.cluster.array_live.get(job_id))

    # ---- memory follows the store ----------------------------------------------------------

    def publish(self, event: JobEvent, job: Job | None) -> None:
        """To watchers of the job, or of its array."""
        array = job.array_job_id if job is not None else None
        for wanted, queue in self._watchers:
            if not wanted or event.job_id in wanted or array in wanted:
                queue.put_nowait((event, array))
        self.terminals.published(event, job)
        self.notifier.published(event, job)
        self.observe(event, job)

    def _moved(self, job_id: int, before: JobState, after: JobState, reason: str) -> None:
        now = self.clock()
        job = self.cluster.jobs.get(job_id)
        if after is not JobState.RUNNING:
            self.idle.forget(job_id)  # its flags were about its run
        if job is not None:
            self.cluster.put(replace(job, state=after, reason=reason))
            if not after.is_live:
                self.sched.job_ended(job, after, self.cluster)
        self.publish(JobEvent(job_id, now, before, after, reason), job)

    def _ended(self, job_id: int, before: JobState, after: JobState, reason: str) -> None:
        self._moved(job_id, before, after, reason)

    def _stop_requested(self, job_id: int, end_state: JobState, reason: str) -> None:
        job = self.cluster.jobs.get(job_id)
        if job is not None:
            self.cluster.put(replace(job, stop=(end_state, reason)))

    # ---- job ends reported by agents -------------------------------------------------------

    async def record_ends(
        self, node: str, ends: Sequence[tuple[int, JobState, JobResult, float | None]]
    ) -> None:
        """Agents report jobs whose processes are gone, and when (the supervisor's clock)."""
        endings = [
            Ending(i, state, result.reason or state.value, result, at)
            for i, state, result, at in ends
        ]
        await self.end_jobs(endings)

    async def end_jobs(self, endings: Sequence[Ending], node_down: str | None = None) -> None:
        """Running jobs ended: record each end (a preempted job goes back to the queue unless
        it said --no-requeue, a node_fail one as often as its QOS's requeue_on_node_fail
        allows; an Ending to pending is a start its agent never received) and
        charge the GPU time to its user's fair share, in one
        transaction (with the node marked down, when that is why)."""
        now = self.clock()
        stale: list[tuple[int, JobState]] = []

        def write(
            tx: StoreTx,
        ) -> tuple[list[tuple[int, JobState, JobState, str]], dict[str, float]]:
            if node_down is not None:
                tx.set_node_state(node_down, NodeState.DOWN, endings[0].reason if endings else "")
            states = tx.job_states([e.job_id for e in endings])
            starts = tx.start_counts([e.job_id for e in endings if e.attempt])
            lost = [e.job_id for e in endings if e.state is JobState.NODE_FAIL]
            node_fail_requeues = tx.requeues_from(lost, JobState.NODE_FAIL)
            stale.clear()  # from an earlier try of this write
            changes: list[StateChange] = []
            moved: list[tuple[int, JobState, JobState, str]] = []
            charges: dict[str, float] = {}
            for end in endings:
                job = self.cluster.jobs.get(end.job_id)
                stored = states.get(end.job_id)
                running = job is not None and job.state is JobState.RUNNING
                if running and stored is not None and stored is not JobState.RUNNING:
                    stale.append((end.job_id, stored))  # see _follow_store
                if stored is not JobState.RUNNING or job is None:
                    continue  # already ended (node_fail, or a repeated report)
                if end.attempt and starts.get(end.job_id) != end.attempt:
                    continue  # about another start of the job (decided here, by the store)
                if end.state is JobState.PENDING:
                    # the agent never received this start: the job never ran there, so it
                    # goes back to the queue as it was (no requeue counted, nothing charged)
                    changes.append(StateChange(end.job_id, JobState.PENDING, end.reason))
                    moved.append((end.job_id, JobState.RUNNING, JobState.PENDING, end.reason))
                    continue
                started = job.start_time or now
                # a clock that disagrees cannot put the end before the start or in the future
                ended = now if end.at is None else min(now, max(started, end.at))
                changes.append(StateChange(end.job_id, end.state, end.reason, end.result, ended))
                attempt = tx.start_counts([end.job_id]).get(end.job_id, 0)
                measured = end.telemetry or self.telemetry.latest(end.job_id, attempt)
                if measured is not None:
                    tx.set_telemetry(end.job_id, attempt, measured)
                moved.append((end.job_id, JobState.RUNNING, end.state, end.reason))
                if end.state is JobState.PREEMPTED and job.spec.requeue:
                    changes.append(StateChange(end.job_id, JobState.PENDING, "requeued"))
                    moved.append((end.job_id, JobState.PREEMPTED, JobState.PENDING, "requeued"))
                    if end.job_id in self._requeue_held:  # gpuq requeue --hold
                        why = "held (requeued with --hold)"
                        changes.append(StateChange(end.job_id, JobState.HELD, why))
                        moved.append((end.job_id, JobState.PENDING, JobState.HELD, why))
                elif end.state is JobState.NODE_FAIL and job.spec.requeue:
                    tier = self.settings.qos.get(job.qos)
                    allowed = tier.requeue_on_node_fail if tier is not None else 0
                    done = node_fail_requeues.get(end.job_id, 0)
                    if done < allowed:
                        why = (
                            f"requeued after node_fail ({done + 1} of {allowed} allowed by "
                            f"qos {job.qos})"
                        )
                        changes.append(StateChange(end.job_id, JobState.PENDING, why))
                        moved.append((end.job_id, JobState.NODE_FAIL, JobState.PENDING, why))
                seconds = len(job.gpus) * max(0.0, ended - started)
                charges[job.user] = charges.get(job.user, 0.0) + seconds
            tx.transition(changes, now)
            usage = {u: self.sched.charge(u, s, now) for u, s in charges.items() if s > 0}
            for user, value in usage.items():
                tx.set_usage(user, value, now)
            return moved, usage

        moved, usage = await self.writer.write(write)
        self.telemetry.forget(
            job_id for job_id, before, _, _ in moved if before is JobState.RUNNING
        )
        self.sched.usage.update({u: (v, now) for u, v in usage.items()})
        requeued = {job_id for job_id, _, after, _ in moved if after is JobState.PENDING}
        for job_id, before, after, reason in moved:
            if after is JobState.PENDING:
                job = self.cluster.jobs[job_id]
                requeues = job.requeue_count + (before is not JobState.RUNNING)
                self.cluster.put(
                    replace(
                        job,
                        state=after,
                        node=None,
                        stop=None,
                        reason=reason,
                        requeue_count=requeues,
                    )
                )
                self.publish(JobEvent(job_id, now, before, after, reason), job)
            elif after is JobState.HELD:  # requeued held (gpuq requeue --hold)
                self._requeue_held.discard(job_id)
                self._moved(job_id, before, after, reason)
            elif job_id in requeued:  # preempted, and back in the queue just below
                job = self.cluster.jobs[job_id]
                self.publish(JobEvent(job_id, now, before, after, reason), job)
            else:
                self._ended(job_id, before, after, reason)
        self._follow_store(stale)
        self.wake()

    def _follow_store(self, stale: Sequence[tuple[int, JobState]]) -> None:
        """Jobs memory still shows running that the store has ended: a write whose commit
        landed although its answer was lost (the store failed during the commit) and was tried
        again. Memory follows the store, so they do not hold their node for good."""
        for job_id, stored in stale:
            job = self.cluster.jobs.get(job_id)
            if job is None or job.state is not JobState.RUNNING:
                continue  # followed meanwhile (an earlier write's answer)
            log.warning("job %d ended in the store while memory had it running", job_id)
            if stored.is_live:  # requeued (after preemption or a start never received)
                requeued = replace(job, state=stored, node=None, stop=None, reason="requeued")
                self.cluster.put(replace(requeued, requeue_count=job.requeue_count + 1))
                self.publish(
                    JobEvent(job_id, self.clock(), JobState.RUNNING, stored, "requeued"), job
                )
            else:
                self._ended(job_id, JobState.RUNNING, stored, stored.value)

    async def fail_node_jobs(self, node: str, reason: str) -> None:
        """The node is gone: mark it down and its running jobs node_fail (requeued as their
        QOS allows), in one transaction."""
        lost = [
            Ending(j.id, JobState.NODE_FAIL, reason, attempt=j.start_count)
            for j in self.cluster.running_on(node)
        ]
        await self.end_jobs(lost, node_down=node)
        entry = self.cluster.nodes[node]
        entry.node = replace(entry.node, state=NodeState.DOWN, reason=reason)
        log.warning("node %s is down: %s", node, reason)

    async def save_node(self, node: Node) -> None:
        await self.writer.write(lambda tx: tx.save_node(node))

    # ---- scheduling ------------------------------------------------------------------------

    async def _schedule_loop(self) -> None:
        loop = asyncio.get_running_loop()
        last = -PASS_GAP
        while True:
            await self._dirty.wait()
            if (wait := last + PASS_GAP - loop.time()) > 0:
                await asyncio.sleep(wait)
            self._dirty.clear()
            last = loop.time()
            self.passes += 1
            if self.run_pass is None:
                continue
            try:
                await self.run_pass()
            except Exception as exc:
                if is_storage_error(exc):
                    log.warning("scheduling pass failed: the job store failed (%s)", exc)
                else:
                    log.exception("scheduling pass failed; reloading live jobs from the store")
                await self._reload_until_done()
                self.wake()
                await asyncio.sleep(0.5)

    async def _reload_until_done(self) -> None:
        """Reload live jobs after a failed pass; while the store is down, wait for it (with
        backoff) instead of ending the scheduler."""
        delay = RETRY_FIRST
        while True:
            try:
                await self.reload_jobs()
                return
            except Exception as exc:
                if not is_storage_error(exc):
                    raise
                log.debug("reloading live jobs: the job store is still down (%s)", exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MOST)

    async def reload_jobs(self) -> None:
        jobs = await self.writer.read(lambda s: s.list_jobs(JobQuery(states=LIVE)))
        self.cluster.reset(jobs)
        await self.arrays.load_outcomes({j.array_job_id for j in jobs} - {None})


def check_request_key(key: str) -> None:
    """A request key is 1 to MAX_REQUEST_KEY printable ASCII characters."""
    if not key or len(key) > MAX_REQUEST_KEY or not (key.isascii() and key.isprintable()):
        shown = key if len(key) <= MAX_REQUEST_KEY else key[:MAX_REQUEST_KEY] + "..."
        raise InvalidInput(
            "request key", shown, f"must be 1 to {MAX_REQUEST_KEY} printable ASCII characters"
        )


def _target_text(node: str, units: Sequence[GpuUnit]) -> str:
    """`node a`, `node a GPU 1`, `node m GPU 0 slice 3g.40gb, GPU 0 slice 3g.40gb`."""
    if not units:
        return f"node {node}"
    return f"node {node} " + ", ".join(u.label for u in units)


_USER_NAME = re.compile(r"[a-z_][a-z0-9_.-]{0,31}\$?", re.IGNORECASE)


def check_user_name(user: str) -> None:
    """A Unix user name (as useradd takes them): what a token may be issued for."""
    if not isinstance(user, str) or not _USER_NAME.fullmatch(user):
        raise InvalidInput("user", brief(str(user)), "is not a Unix user name")
