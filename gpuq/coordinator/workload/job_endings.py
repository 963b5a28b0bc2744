"""Where jobs end: every way a running job stops running comes through `JobEndings.record`
(its agent reported it gone, its start never reached the agent, its node was given up), which
decides with gpuq.coordinator.changes.transitions.decide_endings and commits through the one
applier.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.changes.effects import Cause, Effects
from gpuq.coordinator.changes.job_changes import JobChanges
from gpuq.coordinator.changes.transitions import (
    Ending,
    EndingFacts,
    EndingRules,
    decide_endings,
    decide_time_limit_stops,
)
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.scheduler_inputs import SchedulerInputs
from gpuq.coordinator.workload.running_telemetry import RunningTelemetry
from gpuq.domain.states import JobState
from gpuq.store.api import StoreTx

log = logging.getLogger(__name__)
TIME_LIMIT_SLACK = 10.0  # seconds past limit + grace before the coordinator steps in


class JobEndings:
    def __init__(
        self,
        settings: CoordinatorSettings,
        jobs: LiveJobs,
        inputs: SchedulerInputs,
        telemetry: RunningTelemetry,
        changes: JobChanges,
        wake: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.jobs = jobs
        self.inputs = inputs
        self.telemetry = telemetry
        self.changes = changes
        self.wake = wake

    async def record(
        self, endings: Sequence[Ending], cause: Cause, node_down: tuple[str, str] | None = None
    ) -> None:
        """Running jobs ended (see decide_endings), in one transaction; with the node marked
        down, when that is why."""
        ids = [e.job_id for e in endings]
        lost = [e.job_id for e in endings if e.state is JobState.NODE_FAIL]

        def decide(tx: StoreTx, now: float) -> tuple[Effects, None]:
            facts = EndingFacts(
                states=tx.job_states(ids),
                starts=tx.start_counts(ids),
                node_fail_requeues=tx.requeues_from(lost, JobState.NODE_FAIL),
            )
            rules = EndingRules(
                live=self.jobs.jobs,
                requeue_held=frozenset(self.jobs.requeue_held),
                tiers=self.settings.qos,
                charge=self.inputs.charge,
                latest=self.telemetry.latest,
            )
            return decide_endings(endings, facts, rules, now, node_down), None

        await self.changes.commit(decide, cause)
        self.wake()

    async def node_lost(self, node: str, reason: str) -> None:
        """The node is gone: mark it down and its running jobs node_fail (requeued as their
        QOS allows), in one transaction."""
        lost = [
            Ending(j.id, JobState.NODE_FAIL, reason, attempt=j.start_count)
            for j in self.jobs.running_on(node)
        ]
        await self.record(lost, Cause.chore("heartbeat check"), node_down=(node, reason))
        log.warning("node %s is down: %s", node, reason)

    async def check_time_limits(self) -> None:
        """A chore, and a backstop: supervisors enforce time limits; this catches one that
        could not."""
        now = self.changes.clock()
        grace = self.settings.kill_grace
        overdue: list[int] = []
        for job in list(self.jobs.in_state(JobState.RUNNING)):
            limit = self.inputs.time_limit(job)
            if not limit or job.start_time is None or job.stop is not None:
                continue
            if now > job.start_time + int(limit) + grace + TIME_LIMIT_SLACK:
                overdue.append(job.id)
        if overdue:
            await self.changes.commit(
                lambda tx, now: decide_time_limit_stops(overdue, tx.job_states(overdue)),
                Cause.chore("time-limit check"),
            )
