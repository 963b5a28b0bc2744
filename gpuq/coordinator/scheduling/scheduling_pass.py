"""One scheduling pass: snapshot from memory, the pure plan (gpuq.scheduler.plan), and its
decisions as effects (starts, preemptions, cancellations of jobs that can never start),
committed in one transaction through the one applier. Also the explanation of why jobs wait,
from a full pass that starts nothing.

One starter at a time: a pass, or a submission to an idle queue that starts its job in its own
transaction (`start_alone`, as SLURM tries a job at submission), each holding `starting` from
its snapshot until memory took its starts. A plan counts on every unit free in memory being
free in the store; two starters at once could give one unit twice.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.background_tasks import Background
from gpuq.coordinator.changes.effects import Cause, Effects, Move, StopOrder
from gpuq.coordinator.changes.job_changes import JobChanges
from gpuq.coordinator.changes.store_writer import is_storage_error
from gpuq.coordinator.memory.live_jobs import LiveJobs, queue_key
from gpuq.coordinator.memory.node_table import NodeTable
from gpuq.coordinator.memory.scheduler_inputs import SchedulerInputs
from gpuq.coordinator.scheduling.job_ports import choose_master_port, new_step_key
from gpuq.coordinator.workload.array_tasks import ArrayTasks
from gpuq.domain.model import Job, is_advisory
from gpuq.domain.node_constraints import compress_nodes
from gpuq.domain.states import JobState
from gpuq.scheduler.array_split import tasks_to_split
from gpuq.scheduler.eligibility import dependency_status
from gpuq.scheduler.fitting import NodeView
from gpuq.scheduler.plan import plan
from gpuq.scheduler.priority import Factors
from gpuq.scheduler.snapshot import Decisions, PendingJob, RunningJob, Start, Waiting
from gpuq.store.api import StoreTx
from gpuq.store.records import JobStart

log = logging.getLogger(__name__)
EXPLAIN_EVERY = 1.0  # seconds an explanation of the queue stays good, at least
# ... and at least this many times what it took to make (a queue of 200,000 pending jobs
# takes seconds, and CPU the scheduling passes need too)
EXPLAIN_SHARE = 20
# an explanation that took longer than this (seconds) is made in the background from then on
EXPLAIN_INLINE = 0.05
EXPLAIN_SLICE = 250  # queued jobs taken into its snapshot between two turns of other calls
# seconds an explanation stays good at most while nothing it was made from changed (SLURM's
# backfill interval): a periodic pass that changes nothing keeps it
EXPLAIN_KEEP = 30.0
_LIVE_RECORD = (JobState.PENDING, JobState.HELD)


@dataclass(frozen=True, slots=True)
class PendingDetail:
    """What `gpuq queue --long` and `gpuq show` print for a pending job."""

    waiting: Waiting
    priority: float
    factors: Factors


class SchedulingPass:
    def __init__(
        self,
        settings: CoordinatorSettings,
        jobs: LiveJobs,
        nodes: NodeTable,
        inputs: SchedulerInputs,
        arrays: ArrayTasks,
        changes: JobChanges,
        wake: Callable[[], None],
        steady: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.wake = wake  # ask for a pass
        self.jobs = jobs
        self.nodes = nodes
        self.inputs = inputs
        self.arrays = arrays
        self.changes = changes
        self.clock = changes.clock
        # how often the queue is explained is counted on this (monotonic) clock: after the
        # wall clock stepped back, the last explanation would stand until it caught up
        self.steady = steady
        self._explained: Mapping[int, Waiting] = {}
        self._explained_at = -1.0  # self.steady() of the last explanation (-1: none, or forgot)
        # what the explanation was made from: memory's version and the policy (checked when
        # asked), the nodes as the scheduler saw them (checked by each pass, which sees them),
        # and until when the clock changes nothing in it (a begin time, an expected end)
        self._explained_from: tuple[int, object] = (-1, None)
        self._explained_views: list[NodeView] | None = None
        self._explained_until = -1.0
        self._explain_took = 0.0  # seconds the last explanation took (the pass's clock)
        self._explaining = Background("explaining the queue")
        # held by whoever may start jobs, from its snapshot until memory took its starts
        self.starting = asyncio.Lock()

    def views(self) -> list[NodeView]:
        return self.nodes.views(self.jobs.in_state(JobState.RUNNING))

    def _running(self) -> list[RunningJob]:
        now = self.clock()
        running = list(self.jobs.in_state(JobState.RUNNING))
        # which node each unit is on: needed only to split a multi-node job's units
        units = self.nodes.unit_nodes() if any(j.nodes for j in running) else None
        return [part for job in running for part in self.inputs.running(job, now, units)]

    def _queue(self) -> Iterator[PendingJob]:
        return (self.inputs.pending(j, self.jobs) for j in self.jobs.queue())

    async def run(self, cause: Cause) -> None:
        async with self.starting:
            await self._run(cause)

    async def _run(self, cause: Cause) -> None:
        await self._split_arrays(cause)
        if not self.jobs.shapes:
            return
        now = self.clock()
        views = self.views()
        try:
            decided = self._plan(now, views)
        except Exception as error:  # one job's data must not stop everyone's scheduling
            if is_storage_error(error):
                raise  # not a job's fault: the schedule loop reloads and tries again
            await self._set_aside(now, error, cause)
            decided = self._plan(now, views)
        if views != self._explained_views or self.jobs.version != self._explained_from[0]:
            # what blocks whom changed: the next listing explains afresh (a job submitted
            # just now shows its own reason, "begin time", not "the next pass")
            self.forget_explanation()
        if decided.starts or decided.preemptions or decided.cancellations:
            stopped = await self.changes.commit(lambda tx, now: self._decide(decided, tx), cause)
            if stopped:
                log.info("preempting jobs %s", stopped)

    def start_alone(self, job: Job) -> Start | None:
        """The start a pass would give `job` (not yet in memory; its id a stand-in) were it
        the only job waiting, for its submitter to write with the job itself. The caller
        holds `starting` from this call until memory took the start. None when jobs or
        arrays wait (they go first, in the queue's order) or the plan would not start the
        job alone (it waits, can never run, or needs a preemption: a pass decides those)."""
        if self.jobs.shapes or self._waiting_records():
            return None
        now = self.clock()
        decided = plan(
            self.views(),
            self._running(),
            [self.inputs.pending(job, self.jobs)],
            self.inputs.policy,
            now,
        )
        if decided.preemptions or decided.cancellations or len(decided.starts) != 1:
            return None
        return decided.starts[0]

    def start_record(self, start: Start, job_id: int) -> JobStart:
        """The store's record of a start from start_alone, for the job's real id."""
        return self._start(replace(start, job_id=job_id), self._ports_by_node())

    def _waiting_records(self) -> list[Job]:
        """The arrays' records with tasks waiting (a held array's wait for its release)."""
        return [r for r in self.jobs.records.values() if r.state is JobState.PENDING]

    def _plan(self, now: float, views: list[NodeView]) -> Decisions:
        return plan(
            views, self._running(), self._queue(), self.inputs.policy, now, shapes=self.jobs.shapes
        )

    async def _set_aside(self, now: float, error: Exception, cause: Cause) -> None:
        """A pass failed: find the queued jobs it fails on, each alone, and hold them with the
        error as their reason, so the pass can go on without them."""
        log.error("scheduling pass failed (%s); looking for the jobs it fails on", error)
        views, running = self.views(), self._running()
        culprits: dict[int, str] = {}
        for job in list(self.jobs.queue()):
            try:
                pending = self.inputs.pending(job, self.jobs)
                plan(views, running, [pending], self.inputs.policy, now, explain=True)
            except Exception as exc:
                if is_storage_error(exc):
                    raise
                culprits[job.id] = f"held: scheduling failed on this job ({exc}); fix or cancel it"
        if not culprits:
            raise error
        for job_id, reason in culprits.items():
            log.error("job %d set aside: %s", job_id, reason)

        def decide(tx: StoreTx, now: float) -> tuple[Effects, None]:
            states = tx.job_states(culprits)
            held = [i for i in culprits if states.get(i) is JobState.PENDING]
            moves = [Move(i, JobState.PENDING, JobState.HELD, culprits[i]) for i in held]
            return Effects(moves=moves), None

        await self.changes.commit(decide, cause)

    async def _split_arrays(self, cause: Cause) -> None:
        """Split off waiting arrays' records as many tasks as can start (see
        gpuq.scheduler.arrays), one array at a time; one that fails is logged and skipped."""
        records = self._waiting_records()
        if not records:
            return
        now = self.clock()
        views = self.views()
        for record in sorted(records, key=lambda r: queue_key(r, self.inputs.priority(r, now))):
            try:
                async with self.arrays.splitting:
                    current = self.jobs.records.get(record.id)  # as it is now
                    if current is None or current.state is not JobState.PENDING:
                        continue
                    count = self._split_count(current, views, now)
                    if count:
                        await self.arrays.split(current.id, current.tasks[:count], cause)
            except Exception as exc:
                if is_storage_error(exc):
                    raise  # the store's fault, not the array's: the whole pass is tried again
                log.exception("splitting tasks off array %d failed", record.id)

    def _split_count(self, record: Job, views: list[NodeView], now: float) -> int:
        pending = self.inputs.pending(record, self.jobs)
        waiting = any(dependency_status(d) is not True for d in pending.dependencies)
        blocked = waiting or (pending.begin_time is not None and pending.begin_time > now)
        return tasks_to_split(
            record.spec.resources,
            views,
            left=len(record.tasks),
            queued=self.jobs.array_pending.get(record.id, 0),
            running=self.jobs.array_running.get(record.id, 0),
            max_running=pending.array_max_running,
            blocked=blocked,
            placement=record.spec.placement,
        )

    def _decide(self, decided: Decisions, tx: StoreTx) -> tuple[Effects, list[int]]:
        """What the pass decided, as the store has it now: what changed since the snapshot is
        skipped (a job cancelled since does not start)."""
        victims = {p.victim: p for p in decided.preemptions}
        ids = [s.job_id for s in decided.starts] + list(victims)
        ids += [c.job_id for c in decided.cancellations]
        states = tx.job_states(ids)
        effects = Effects()
        memory = self.jobs.jobs
        taken = self._ports_by_node()
        for s in decided.starts:
            start = self._start(s, taken)
            if states.get(s.job_id) is JobState.PENDING:
                effects.starts.append(start)
            # a start an earlier try of this write committed although its answer was lost
            # (the store failed during the commit): only passes start jobs, one pass at a
            # time, so a job running in the store and pending in memory is this pass's own
            elif (
                states.get(s.job_id) is JobState.RUNNING
                and (job := memory.get(s.job_id)) is not None
                and job.state is JobState.PENDING
            ):
                effects.landed.append(start)
        cancels = [c for c in decided.cancellations if states.get(c.job_id) is JobState.PENDING]
        effects.moves += [
            Move(c.job_id, JobState.PENDING, JobState.CANCELLED, c.reason) for c in cancels
        ]
        # a task's dependency is its whole array's: the tasks still in the record go too
        records = self._records_of([c.job_id for c in cancels])
        record_states = tx.job_states(records)
        effects.moves += [
            Move(r, record_states[r], JobState.CANCELLED, why)
            for r, why in records.items()
            if record_states.get(r) in _LIVE_RECORD
        ]
        for victim, preemption in victims.items():
            if states.get(victim) is JobState.RUNNING:
                effects.stops.append(self._preempt_order(victim, preemption.preemptor))
        return effects, [o.job_id for o in effects.stops]

    def _start(self, start: Start, taken: dict[str, set[int]]) -> JobStart:
        """A start as the store keeps it: every node's units, a MASTER_PORT no job on its
        nodes holds (taken grows with it), and a fresh step secret."""
        parts = start.parts if start.more else ()
        all_units = tuple(u for _, units in start.parts for u in units)
        job = self.jobs.jobs.get(start.job_id)
        attempt = job.start_count + 1 if job is not None else 1
        nodes = [node for node, _ in start.parts]
        port = choose_master_port(
            start.job_id, attempt, (p for n in nodes for p in taken.get(n, ()))
        )
        for node in nodes:
            taken.setdefault(node, set()).add(port)
        return JobStart(
            start.job_id,
            start.node,
            all_units,
            self._start_reason(start.node, compress_nodes(nodes)),
            start.shared,
            parts=parts,
            master_port=port,
            step_key=new_step_key(),
        )

    def _ports_by_node(self) -> dict[str, set[int]]:
        """The MASTER_PORTs running jobs hold, by node."""
        taken: dict[str, set[int]] = {}
        for job in self.jobs.in_state(JobState.RUNNING):
            if job.master_port is not None:
                for node in job.node_names:
                    taken.setdefault(node, set()).add(job.master_port)
        return taken

    def _records_of(self, job_ids: list[int]) -> dict[int, str]:
        """The live records of these jobs' arrays, with the reason the first job went."""
        records: dict[int, str] = {}
        for job_id in job_ids:
            job = self.jobs.jobs.get(job_id)
            array = job.array_job_id if job is not None else None
            if array is not None and array in self.jobs.records:
                records.setdefault(array, self.jobs.jobs[job_id].reason)
        return records

    def _start_reason(self, node: str, where: str) -> str:
        """`started on a` (`started on gpu[01-02]`: `where`), and where the first node cannot
        enforce a job's GPUs, says so: `started on a (GPU isolation advisory: not root)`."""
        entry = self.nodes.get(node)
        isolation = entry.node.isolation if entry is not None else ""
        return started_reason(where, isolation)

    def _preempt_order(self, victim: int, preemptor: int) -> StopOrder:
        """The victim's own warning signal (--signal), then SIGKILL after the grace period."""
        by = self.jobs.jobs.get(preemptor)
        reason = f"preempted by job {preemptor}" + (f" (qos {by.qos})" if by is not None else "")
        job = self.jobs.jobs.get(victim)
        warning = job.spec.signal.signal if job is not None and job.spec.signal else signal.SIGTERM
        return StopOrder(victim, JobState.PREEMPTED, reason, self.settings.kill_grace, int(warning))

    # ---- explaining ----------------------------------------------------------------------

    def pending_detail(self, job: Job) -> PendingDetail | None:
        """Why the job waits (every reason) and when it may start, from a full pass that
        starts nothing, at most once a second, and its priority factors."""
        waiting = self.explained().get(job.id)
        if waiting is None:
            return None
        priority = self.jobs.priority.get(job.id, 0.0)
        return PendingDetail(waiting, priority, self.inputs.factors(job, self.clock()))

    def explained(self) -> Mapping[int, Waiting]:
        """Why each queued job waits, from a full pass that starts nothing, at most once a
        second, or for a long queue once per EXPLAIN_SHARE times what it takes (listings and
        metrics scrapes share it). Between those, it is made anew only once what it was made
        from changed (a job, a ranking, the nodes a pass saw, the policy), a begin time or an
        expected end came, or EXPLAIN_KEEP passed: a listing after a periodic pass that
        changed nothing costs no explanation (issue 27: 500 pending jobs, 8 ms).

        A short queue is explained here and now. One whose explanation took longer than
        EXPLAIN_INLINE (tens of thousands of jobs: seconds) is explained in the background,
        its snapshot taken in slices and the pure plan run on a thread, so that no other
        call waits for it; meanwhile the last explanation stands."""
        now, tick = self.clock(), self.steady()
        if self._explained_at >= 0 and tick - self._explained_at <= max(
            EXPLAIN_EVERY, EXPLAIN_SHARE * self._explain_took
        ):
            return self._explained
        if (
            self._explained_at >= 0
            and now < self._explained_until
            and self._explained_from == (self.jobs.version, self.inputs.policy)
        ):
            return self._explained  # nothing it was made from changed
        if self._explain_took > EXPLAIN_INLINE:
            if not self._explaining.tasks:
                self._explained_at = tick  # asked for once
                self._explaining.spawn(self._explain_in_background())
            return self._explained
        started = time.perf_counter()
        try:
            made_from = (self.jobs.version, self.inputs.policy)
            views, running, queue = self.views(), self._running(), list(self._queue())
            decided = plan(views, running, queue, made_from[1], now, explain=True)
            self._explained = decided.waiting
            self._made_from(made_from, views, running, queue, now)
        except Exception:  # a listing must answer; the next pass sets the job aside
            log.exception("explaining the queue failed")
            self._explained = {}
            self._explained_until = -1.0
            self.wake()  # the pass sets the failing job aside
        self._explained_at = tick
        self._explain_took = time.perf_counter() - started
        return self._explained

    def _made_from(
        self,
        made_from: tuple[int, object],
        views: list[NodeView],
        running: list[RunningJob],
        queue: list[PendingJob],
        now: float,
    ) -> None:
        """Record what the explanation just made came from, and the first moment after `now`
        at which the clock alone changes it: a begin time, a running job's expected end."""
        until = now + EXPLAIN_KEEP
        for job in queue:
            if job.begin_time is not None and now < job.begin_time < until:
                until = job.begin_time
        for part in running:
            for moment in (part.end_estimate, part.expected_end):
                if moment is not None and now < moment < until:
                    until = moment
        self._explained_from = made_from
        self._explained_views = views
        self._explained_until = until

    async def _explain_in_background(self) -> None:
        started = time.perf_counter()
        try:
            now = self.clock()
            made_from: tuple[int, object] = (self.jobs.version, self.inputs.policy)
            views, running, queue = self.views(), self._running(), []
            for count, job in enumerate(list(self.jobs.queue()), 1):
                queue.append(self.inputs.pending(job, self.jobs))
                if count % EXPLAIN_SLICE == 0:
                    await asyncio.sleep(0)  # other calls go first
                    if made_from[0] != self.jobs.version:
                        made_from = (-1, None)  # a snapshot of memory as it changed: stale
            policy = self.inputs.policy
            decided = await asyncio.to_thread(
                plan, views, running, queue, policy, now, explain=True
            )
            self._explained = decided.waiting
            self._made_from(made_from, views, running, queue, now)
        except Exception:  # the last explanation stands; a pass sets a failing job aside
            log.exception("explaining the queue failed")
            self.wake()
        finally:
            self._explained_at = self.steady()
            self._explain_took = time.perf_counter() - started

    async def close(self) -> None:
        await self._explaining.cancel()

    def forget_explanation(self) -> None:
        """Explain afresh on the next ask (tests, and a pass that changed what blocks whom),
        unless explaining takes long (a queue of 100,000s): then when its share allows."""
        if EXPLAIN_SHARE * self._explain_took <= EXPLAIN_EVERY:
            self._explained_at = -1.0
        self._explained_until = -1.0


def started_reason(node: str, isolation: str) -> str:
    """A start event's reason: the node, and its GPU isolation when only advisory."""
    if is_advisory(isolation):
        why = isolation.partition(":")[2].strip() or "the node cannot enforce it"
        return f"started on {node} (GPU isolation advisory: {why})"
    return f"started on {node}"
