"""Scheduling passes: snapshot from memory, the pure plan, its decisions applied in one store
transaction, then agents told. Also the explanation of why jobs wait, and the periodic
re-ranking of the queue (age and fair share move; SLURM's PriorityCalcPeriod).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from dataclasses import dataclass, replace

from gpuq.coordinator.core import Coordinator, StopOrder
from gpuq.domain.model import Job, JobEvent
from gpuq.domain.states import JobState
from gpuq.scheduler.plan import plan
from gpuq.scheduler.priority import Factors
from gpuq.scheduler.snapshot import Decisions, PendingJob, RunningJob, Waiting
from gpuq.store.api import JobStart, StateChange, StoreTx

log = logging.getLogger(__name__)
EXPLAIN_EVERY = 1.0  # seconds an explanation of the queue stays good


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
        live = self.co.cluster.jobs
        return (self.co.sched.pending(j, live) for j in self.co.cluster.queue())

    async def run(self) -> None:
        co = self.co
        if not co.cluster.shapes:
            return
        now = co.clock()
        decided = plan(
            co.cluster.node_views(),
            self._running(),
            self._queue(),
            co.sched.policy,
            now,
            shapes=co.cluster.shapes,
        )
        self._explained_at = -1.0  # what blocks whom may have changed
        if decided.starts or decided.preemptions or decided.cancellations:
            await self._apply(decided, now)

    async def _apply(self, decided: Decisions, now: float) -> None:
        """Everything the pass decided, in one transaction; what changed meanwhile is skipped
        (a job cancelled since the snapshot does not start)."""
        victims = {p.victim: p for p in decided.preemptions}

        def write(tx: StoreTx) -> tuple[list[JobStart], list[int], list[int]]:
            ids = [s.job_id for s in decided.starts] + list(victims)
            ids += [c.job_id for c in decided.cancellations]
            states = tx.job_states(ids)
            starts = [
                JobStart(s.job_id, s.node, s.gpus)
                for s in decided.starts
                if states.get(s.job_id) is JobState.PENDING
            ]
            tx.start_jobs(starts, now)
            cancels = [c for c in decided.cancellations if states.get(c.job_id) is JobState.PENDING]
            tx.transition(
                [StateChange(c.job_id, JobState.CANCELLED, c.reason) for c in cancels], now
            )
            stopping = [v for v in victims if states.get(v) is JobState.RUNNING]
            for victim in stopping:
                tx.request_stop(
                    victim, JobState.PREEMPTED, self._why_preempted(victims[victim].preemptor)
                )
            return starts, [c.job_id for c in cancels], stopping

        starts, cancelled, stopping = await self.co.writer.write(write)
        self._started(starts, now)
        reasons = {c.job_id: c.reason for c in decided.cancellations}
        for job_id in cancelled:
            self.co._ended(job_id, JobState.PENDING, JobState.CANCELLED, reasons[job_id])
        orders = []
        for victim in stopping:
            why = self._why_preempted(victims[victim].preemptor)
            self.co._stop_requested(victim, JobState.PREEMPTED, why)
            orders.append(self._preempt_order(victim, why))
        if orders:
            log.info("preempting jobs %s", [o.job_id for o in orders])
            self.co.send_stops(orders)

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
            job = replace(
                co.cluster.jobs[start.job_id],
                state=JobState.RUNNING,
                node=start.node,
                gpus=start.gpus,
                start_time=now,
                end_time=None,
                result=None,
                stop=None,
                reason=f"started on {start.node}",
            )
            co.cluster.put(job)
            started.append(job)
            co._publish(JobEvent(job.id, now, JobState.PENDING, JobState.RUNNING, job.reason))
        if started:
            co.send_starts(started)

    # ---- explaining and re-ranking ---------------------------------------------------------

    def pending_detail(self, job: Job) -> PendingDetail | None:
        """Why the job waits (every reason) and when it may start, from a full pass that
        starts nothing, at most once a second, and its priority factors."""
        co = self.co
        now = co.clock()
        if now - self._explained_at > EXPLAIN_EVERY:
            decided = plan(
                co.cluster.node_views(),
                self._running(),
                self._queue(),
                co.sched.policy,
                now,
                explain=True,
            )
            self._explained = decided.waiting
            self._explained_at = now
        waiting = self._explained.get(job.id)
        if waiting is None:
            return None
        priority = co.cluster.priority.get(job.id, 0.0)
        return PendingDetail(waiting, priority, co.sched.factors(job, now))

    def rerank(self) -> None:
        """Recompute fair shares and every pending job's priority, then schedule."""
        co = self.co
        now = co.clock()
        co.sched.refresh_shares({j.user for j in co.cluster.jobs.values()}, now)
        co.cluster.rerank()
        wanted = {d.job_id for j in co.cluster.jobs.values() for d in j.spec.dependencies}
        co.sched.finished = {k: v for k, v in co.sched.finished.items() if k in wanted}
        co.wake()
