"""Where jobs end: every way a running job stops running comes through `JobEndings.record`
(its agent reported it gone, its start never reached the agent, its node was given up), which
decides with gpuq.coordinator.changes.transitions.decide_endings and commits through the one
applier.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

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
from gpuq.domain.diagnosis import EndEvidence
from gpuq.domain.model import Job
from gpuq.domain.states import JobState
from gpuq.store.api import StoreTx
from gpuq.store.records import GivenUp

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
        # starts given up with their node, whose ends may still be reported when it is back
        # (kept in the store too: `load` brings them back after a restart), oldest first
        self._given_up: dict[tuple[int, int], GivenUp] = {}  # by (job, attempt)

    def load(self, given_up: Sequence[GivenUp]) -> None:
        """At start: the given-up starts the store kept."""
        self._given_up = {(item.job_id, item.attempt): item for item in given_up}

    async def record(
        self,
        endings: Sequence[Ending],
        cause: Cause,
        node_down: tuple[str, str] | None = None,
        given_up: Sequence[GivenUp] = (),
        evidence: Sequence[tuple[int, EndEvidence]] = (),
    ) -> None:
        """Running jobs ended (see decide_endings), in one transaction; with the node marked
        down, when that is why, and the starts given up with it; with what their node sent
        with the ends (`gpuq diagnose`, `gpuq eff`), kept first: an end is never seen without
        its evidence, and both cost one commit."""
        ids = [e.job_id for e in endings]
        lost = [e.job_id for e in endings if e.state is JobState.NODE_FAIL]

        def decide(tx: StoreTx, now: float) -> tuple[Effects, None]:
            tx.keep_evidence(evidence, now)
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
            effects = decide_endings(endings, facts, rules, now, node_down)
            effects.given_up.extend(given_up)
            return effects, None

        await self.changes.commit(decide, cause)
        self._remember(given_up)
        self.wake()

    async def node_lost(self, node: str, reason: str) -> None:
        """The node is gone: mark it down and its running jobs node_fail (requeued as their
        QOS allows), in one transaction; their starts are remembered for the node's late
        reports (record_late)."""
        running = self.jobs.running_on(node)
        lost = [Ending(j.id, JobState.NODE_FAIL, reason, attempt=j.start_count) for j in running]
        now = self.changes.clock()
        given_up = []
        for job in running:
            names = job.node_names or (node,)
            given_up.append(GivenUp(job.id, job.start_count, names, names[0], now))
        await self.record(lost, Cause.chore("heartbeat check"), (node, reason), given_up)
        log.warning("node %s is down: %s", node, reason)

    async def parts_lost(self, job: Job, nodes: Sequence[str], why: str, cause: Cause) -> None:
        """A multi-node job's step failed because some of its nodes went silent (their parts
        are being fenced): it ends node_fail, requeued as its QOS allows, as when the
        coordinator gives those nodes up; their late reports are its history."""
        names = ", ".join(nodes)
        reason = f"node {names} stopped answering (its part of the job was fenced): {why}"
        ending = Ending(job.id, JobState.NODE_FAIL, reason, attempt=job.start_count)
        first = (job.node_names or tuple(nodes))[0]
        given = GivenUp(job.id, job.start_count, tuple(nodes), first, self.changes.clock())
        await self.record([ending], cause, given_up=[given])

    async def record_late(self, node: str, endings: Sequence[Ending]) -> list[int]:
        """Ends of starts given up with their node, reported by that node once back
        (decide_late_endings); the jobs whose reports were not that (not this node's to
        report, or given up more than GIVEN_UP_KEEP ago)."""
        late: list[LateEnd] = []
        heard: dict[tuple[int, int], GivenUp] = {}
        other: list[int] = []
        for ending in endings:
            key = (ending.job_id, ending.attempt)
            given = heard.get(key) or self._given_up.get(key)
            if given is None or node not in given.nodes:
                other.append(ending.job_id)
                continue
            heard[key] = replace(given, nodes=tuple(n for n in given.nodes if n != node))
            late.append(LateEnd(ending, node, leads=node == given.first))
        if not late:
            return other
        ids = [end.ending.job_id for end in late]

        def decide(tx: StoreTx, now: float) -> tuple[Effects, None]:
            facts = EndingFacts(tx.job_states(ids), tx.start_counts(ids), {})
            effects = decide_late_endings(late, facts, now)
            effects.given_up.extend(heard.values())
            return effects, None

        await self.changes.commit(decide, Cause.agent(node))
        self._remember(heard.values())
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

    def _remember(self, items: Iterable[GivenUp]) -> None:
        """Memory follows what the store now keeps (an item with no node left is gone)."""
        for item in items:
            key = (item.job_id, item.attempt)
            self._given_up.pop(key, None)  # the newest last, for the bound
            if item.nodes:
                self._given_up[key] = item
        while len(self._given_up) > MAX_GIVEN_UP:
            del self._given_up[next(iter(self._given_up))]

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
