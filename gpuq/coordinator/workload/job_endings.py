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
    LateEnd,
    decide_endings,
    decide_late_endings,
    decide_time_limit_stops,
)
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.scheduler_inputs import SchedulerInputs
from gpuq.coordinator.workload.running_telemetry import RunningTelemetry
from gpuq.domain.states import JobState
from gpuq.store.api import StoreTx

log = logging.getLogger(__name__)
TIME_LIMIT_SLACK = 10.0  # seconds past limit + grace before the coordinator steps in
# given-up starts remembered for their nodes' late reports, at most (the oldest go first)
MAX_GIVEN_UP = 100_000


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
        # starts given up with their node, whose ends may still be reported when it is back:
        # job -> (attempt, its nodes not yet heard from, the first node); memory only (after
        # a coordinator restart a late report is logged and dropped, as before)
        self._given_up: dict[int, tuple[int, set[str], str]] = {}

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
        running = self.jobs.running_on(node)
        lost = [Ending(j.id, JobState.NODE_FAIL, reason, attempt=j.start_count) for j in running]
        await self.record(lost, Cause.chore("heartbeat check"), node_down=(node, reason))
        for job in running:
            names = job.node_names
            self._given_up.pop(job.id, None)  # the newest last, for the bound
            self._given_up[job.id] = (job.start_count, set(names), names[0] if names else node)
        while len(self._given_up) > MAX_GIVEN_UP:
            del self._given_up[next(iter(self._given_up))]
        log.warning("node %s is down: %s", node, reason)

    async def record_late(self, node: str, endings: Sequence[Ending]) -> list[int]:
        """Ends of starts given up with their node, reported by that node once back
        (decide_late_endings); the jobs whose reports were not that (not this node's to
        report, or given up before this coordinator started)."""
        late: list[LateEnd] = []
        other: list[int] = []
        for ending in endings:
            given = self._given_up.get(ending.job_id)
            if given is None or given[0] != ending.attempt or node not in given[1]:
                other.append(ending.job_id)
                continue
            _, waiting, first = given
            waiting.discard(node)
            if not waiting:
                del self._given_up[ending.job_id]
            late.append(LateEnd(ending, node, leads=node == first))
        if not late:
            return other
        ids = [end.ending.job_id for end in late]

        def decide(tx: StoreTx, now: float) -> tuple[Effects, None]:
            facts = EndingFacts(tx.job_states(ids), tx.start_counts(ids), {})
            return decide_late_endings(late, facts, now), None

        await self.changes.commit(decide, Cause.agent(node))
        for end in late:
            log.info(
                "node %s reported late that job %d's start %d ended %s",
                node,
                end.ending.job_id,
                end.ending.attempt,
                end.ending.state.value,
            )
        self.wake()
        return other

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
