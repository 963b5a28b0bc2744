"""Scheduling passes: snapshot from memory, the pure plan, its decisions applied in one store
transaction, then agents told. Also the explanation of why jobs wait, and the periodic
re-ranking of the queue (age and fair share move; SLURM's PriorityCalcPeriod).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from dataclasses import dataclass, replace

from gpuq.coordinator.cluster import queue_key
from gpuq.coordinator.core import Coordinator, StopOrder
from gpuq.coordinator.writer import is_storage_error
from gpuq.domain.model import Job, JobEvent, is_advisory
from gpuq.domain.states import JobState
from gpuq.scheduler.array_split import tasks_to_split
from gpuq.scheduler.eligibility import dependency_status
from gpuq.scheduler.fitting import NodeView
from gpuq.scheduler.plan import plan
from gpuq.scheduler.priority import Factors
from gpuq.scheduler.snapshot import Decisions, PendingJob, RunningJob, Waiting
from gpuq.store.api import StoreTx
from gpuq.store.records import JobStart, StateChange

log = logging.getLogger(__name__)
EXPLAIN_EVERY = 1.0  # seconds an explanation of the queue stays good
_LIVE_RECORD = (JobState.PENDING, JobState.HELD)


@dataclass(frozen=True, slots=True)
class PendingDetail:
    """What `gpuq queue --long` and `gpuq show` print for a pending job."""

    waiting: Waiting
    priority: float
    factors: Factors


class Passes:
    def __init__(self, coordinator: Coordinator) -> None:
        self.co = coordinator
        self._explained: dict[int, Waiting] = {}
        self._explained_at = -1.0
        coordinator.run_pass = self.run

    def _running(self) -> list[RunningJob]:
        now = self.co.clock()
        return [self.co.sched.running(j, now) for j in self.co.cluster.in_state(JobState.RUNNING)]

    def _queue(self) -> Iterator[PendingJob]:
        cluster = self.co.cluster
        return (self.co.sched.pending(j, cluster) for j in cluster.queue())

    async def run(self) -> None:
        co = self.co
        await self._split_arrays()
        if not co.cluster.shapes:
            return
        now = co.clock()
        try:
            decided = self._plan(now)
        except Exception as error:  # one job's data must not stop everyone's scheduling
            if is_storage_error(error):
                raise  # not a job's fault: the schedule loop reloads and tries again
            await self._set_aside(now, error)
            decided = self._plan(now)
        self._explained_at = -1.0  # what blocks whom may have changed
        if decided.starts or decided.preemptions or decided.cancellations:
            await self._apply(decided, now)

    def _plan(self, now: float, explain: bool = False) -> Decisions:
        co = self.co
        return plan(
            co.cluster.node_views(),
            self._running(),
            self._queue(),
            co.sched.policy,
            now,
            shapes=None if explain else co.cluster.shapes,
            explain=explain,
        )

    async def _set_aside(self, now: float, error: Exception) -> None:
        """A pass failed: find the queued jobs it fails on, each alone, and hold them with the
        error as their reason, so the pass can go on without them."""
        co = self.co
        log.error("scheduling pass failed (%s); looking for the jobs it fails on", error)
        views, running = co.cluster.node_views(), self._running()
        culprits: dict[int, str] = {}
        for job in list(co.cluster.queue()):
            try:
                pending = co.sched.pending(job, co.cluster)
                plan(views, running, [pending], co.sched.policy, now, explain=True)
            except Exception as exc:
                if is_storage_error(exc):
                    raise
                culprits[job.id] = f"held: scheduling failed on this job ({exc}); fix or cancel it"
        if not culprits:
            raise error
        for job_id, reason in culprits.items():
            log.error("job %d set aside: %s", job_id, reason)

        def write(tx: StoreTx) -> list[int]:
            states = tx.job_states(culprits)
            held = [i for i in culprits if states.get(i) is JobState.PENDING]
            tx.transition([StateChange(i, JobState.HELD, culprits[i]) for i in held], now)
            return held

        for job_id in await co.writer.write(write):
            co._moved(job_id, JobState.PENDING, JobState.HELD, culprits[job_id])

    async def _split_arrays(self) -> None:
        """Split off waiting arrays' records as many tasks as can start (see
        gpuq.scheduler.arrays), one array at a time; one that fails is logged and skipped."""
        co = self.co
        records = [r for r in co.cluster.records.values() if r.state is JobState.PENDING]
        if not records:
            return
        now = co.clock()
        views = co.cluster.node_views()
        for record in sorted(records, key=lambda r: queue_key(r, co.sched.priority(r, now))):
            try:
                async with co.arrays.splitting:
                    current = co.cluster.records.get(record.id)  # as it is now
                    if current is None or current.state is not JobState.PENDING:
                        continue
                    count = self._split_count(current, views, now)
                    if count:
                        await co.arrays.split(current.id, current.tasks[:count])
            except Exception as exc:
                if is_storage_error(exc):
                    raise  # the store's fault, not the array's: the whole pass is tried again
                log.exception("splitting tasks off array %d failed", record.id)

    def _split_count(self, record: Job, views: list[NodeView], now: float) -> int:
        co = self.co
        pending = co.sched.pending(record, co.cluster)
        waiting = any(dependency_status(d) is not True for d in pending.dependencies)
        blocked = waiting or (pending.begin_time is not None and pending.begin_time > now)
        return tasks_to_split(
            record.spec.resources,
            views,
            left=len(record.tasks),
            queued=co.cluster.array_pending.get(record.id, 0),
            running=co.cluster.array_running.get(record.id, 0),
            max_running=pending.array_max_running,
            blocked=blocked,
            placement=record.spec.placement,
        )

    async def _apply(self, decided: Decisions, now: float) -> None:
        """Everything the pass decided, in one transaction; what changed meanwhile is skipped
        (a job cancelled since the snapshot does not start)."""
        victims = {p.victim: p for p in decided.preemptions}

        def write(
            tx: StoreTx,
        ) -> tuple[list[JobStart], list[tuple[int, JobState, str]], list[int]]:
            ids = [s.job_id for s in decided.starts] + list(victims)
            ids += [c.job_id for c in decided.cancellations]
            states = tx.job_states(ids)
            starts = [
                JobStart(s.job_id, s.node, s.gpus, self._start_reason(s.node), s.shared)
                for s in decided.starts
                if states.get(s.job_id) is JobState.PENDING
            ]
            tx.start_jobs(starts, now)
            # starts an earlier try of this write committed although its answer was lost (the
            # store failed during the commit): only passes start jobs, one pass at a time, so a
            # job running in the store and pending in memory is this pass's own start
            memory = self.co.cluster.jobs
            landed = [
                JobStart(s.job_id, s.node, s.gpus, self._start_reason(s.node), s.shared)
                for s in decided.starts
                if states.get(s.job_id) is JobState.RUNNING
                and (job := memory.get(s.job_id)) is not None
                and job.state is JobState.PENDING
            ]
            cancels = [c for c in decided.cancellations if states.get(c.job_id) is JobState.PENDING]
            tx.transition(
                [StateChange(c.job_id, JobState.CANCELLED, c.reason) for c in cancels], now
            )
            stopping = [v for v in victims if states.get(v) is JobState.RUNNING]
            for victim in stopping:
                tx.request_stop(
                    victim, JobState.PREEMPTED, self._why_preempted(victims[victim].preemptor)
                )
            # a task's dependency is its whole array's: the tasks still in the record go too
            records = self._records_of([c.job_id for c in cancels])
            record_states = tx.job_states(records)
            ended_records = [r for r in records if record_states.get(r) in _LIVE_RECORD]
            tx.transition(
                [StateChange(r, JobState.CANCELLED, records[r]) for r in ended_records], now
            )
            ended = [(c.job_id, JobState.PENDING, c.reason) for c in cancels]
            ended += [(r, record_states[r], records[r]) for r in ended_records]
            return starts + landed, ended, stopping

        starts, cancelled, stopping = await self.co.writer.write(write)
        self._started(starts, now)
        for job_id, before, reason in cancelled:
            self.co._ended(job_id, before, JobState.CANCELLED, reason)
        orders = []
        for victim in stopping:
            why = self._why_preempted(victims[victim].preemptor)
            self.co._stop_requested(victim, JobState.PREEMPTED, why)
            orders.append(self._preempt_order(victim, why))
        if orders:
            log.info("preempting jobs %s", [o.job_id for o in orders])
            self.co.send_stops(orders)

    def _records_of(self, job_ids: list[int]) -> dict[int, str]:
        """The live records of these jobs' arrays, with the reason the first job went."""
        records: dict[int, str] = {}
        for job_id in job_ids:
            job = self.co.cluster.jobs.get(job_id)
            array = job.array_job_id if job is not None else None
            if array is not None and array in self.co.cluster.records:
                records.setdefault(array, self.co.cluster.jobs[job_id].reason)
        return records

    def _start_reason(self, node: str) -> str:
        """`started on a`, and where the node cannot enforce a job's GPUs, says so:
        `started on a (GPU isolation advisory: not root)`."""
        entry = self.co.cluster.nodes.get(node)
        isolation = entry.node.isolation if entry is not None else ""
        return started_reason(node, isolation)

    def _why_preempted(self, preemptor: int) -> str:
        job = self.co.cluster.jobs.get(preemptor)
        tier = f" (qos {job.qos})" if job is not None else ""
        return f"preempted by job {preemptor}{tier}"

    def _preempt_order(self, victim: int, reason: str) -> StopOrder:
        """The victim's own warning signal (--signal), then SIGKILL after the grace period."""
        job = self.co.cluster.jobs.get(victim)
        warning = job.spec.signal.signal if job is not None and job.spec.signal else signal.SIGTERM
        return StopOrder(
            victim, JobState.PREEMPTED, reason, self.co.settings.kill_grace, int(warning)
        )

    def _started(self, starts: list[JobStart], now: float) -> None:
        co = self.co
        started: list[Job] = []
        for start in starts:
            before = co.cluster.jobs[start.job_id]
            job = replace(
                before,
                start_count=before.start_count + 1,  # as start_jobs counted it in the store
                state=JobState.RUNNING,
                node=start.node,
                gpus=start.gpus,
                start_time=now,
                end_time=None,
                result=None,
                stop=None,
                reason=start.why,
            )
            co.cluster.put(job)
            started.append(job)
            co.publish(JobEvent(job.id, now, JobState.PENDING, JobState.RUNNING, job.reason), job)
        if started:
            co.send_starts(started)

    # ---- explaining and re-ranking ---------------------------------------------------------

    def pending_detail(self, job: Job) -> PendingDetail | None:
        """Why the job waits (every reason) and when it may start, from a full pass that
        starts nothing, at most once a second, and its priority factors."""
        co = self.co
        waiting = self.explained().get(job.id)
        if waiting is None:
            return None
        priority = co.cluster.priority.get(job.id, 0.0)
        return PendingDetail(waiting, priority, co.sched.factors(job, co.clock()))

    def explained(self) -> dict[int, Waiting]:
        """Why each queued job waits, from a full pass that starts nothing, at most once a
        second (listings and metrics scrapes share it)."""
        co = self.co
        now = co.clock()
        if now - self._explained_at > EXPLAIN_EVERY:
            try:
                self._explained = self._plan(now, explain=True).waiting
            except Exception:  # a listing must answer; the next pass sets the job aside
                log.exception("explaining the queue failed")
                self._explained = {}
                co.wake()
            self._explained_at = now
        return self._explained

    def rerank(self) -> None:
        """Recompute fair shares and every pending job's priority, then schedule."""
        co = self.co
        now = co.clock()
        co.sched.refresh_shares({j.user for j in co.cluster.jobs.values()}, now)
        co.cluster.rerank()
        wanted = {(d.job_id, d.task) for j in co.cluster.jobs.values() for d in j.spec.dependencies}
        co.sched.finished = {k: v for k, v in co.sched.finished.items() if k in wanted}
        co.wake()


def started_reason(node: str, isolation: str) -> str:
    """A start event's reason: the node, and its GPU isolation when only advisory."""
    if is_advisory(isolation):
        why = isolation.partition(":")[2].strip() or "the node cannot enforce it"
        return f"started on {node} (GPU isolation advisory: {why})"
    return f"started on {node}"
