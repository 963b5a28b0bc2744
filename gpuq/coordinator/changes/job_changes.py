"""The one path of every change to jobs: decide, write, apply, tell.

`JobChanges.commit(decide, cause)` runs `decide` inside a store transaction (through the
StoreWriter, which batches), where it reads the truth it needs and returns Effects (see
gpuq.coordinator.changes.effects); the same transaction writes them. Once it committed, memory
takes them and agents and watchers are told. Nothing else changes a job: a submission, a
user's action, a scheduling pass, an agent's report and a lost node all come through here, so
"where does a job end?" has one answer, and every effect is computed once.

Which version of a job an event is told with (listeners read its spec, owner and times):
the version memory had just before the change for a state change of a live job; the new
version for what has no earlier one in memory (a submission, a split-off task, an ended job
queued again) and for a start or an update.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from gpuq.coordinator.changes.effects import (
    Cause,
    Effects,
    StopOrder,
    brought_back,
    edited,
    evolve,
    followed_store,
    started,
)
from gpuq.coordinator.changes.event_bus import EventBus
from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.node_table import NodeTable
from gpuq.coordinator.memory.scheduler_inputs import SchedulerInputs
from gpuq.coordinator.nodes.agent_commands import AgentCommands
from gpuq.domain.model import Job, JobEvent, NodeState
from gpuq.domain.states import JobState
from gpuq.store.api import StoreTx
from gpuq.store.records import StateChange

log = logging.getLogger(__name__)
T = TypeVar("T")
Decide = Callable[[StoreTx, float], tuple[Effects, T]]
Told = tuple[JobEvent, Job | None]  # an event, and the version of its job it is told with
# seconds between SIGTERM and SIGKILL for what is left of a job that ended elsewhere (a
# rank waiting in a collective for one that died must not hold its GPUs for a full grace)
LEFT_BEHIND_GRACE = 5.0


class JobChanges:
    def __init__(
        self,
        writer: StoreWriter,
        jobs: LiveJobs,
        nodes: NodeTable,
        inputs: SchedulerInputs,
        bus: EventBus,
        agents: AgentCommands,
        clock: Callable[[], float],
    ) -> None:
        self.writer = writer
        self.jobs = jobs
        self.nodes = nodes
        self.inputs = inputs
        self.bus = bus
        self.agents = agents
        self.clock = clock

    async def commit(self, decide: Decide[T], cause: Cause, *, fail_fast: bool = False) -> T:
        """Decide and write in one transaction, then apply to memory and tell; `decide`'s
        answer. `fail_fast`: a user's call, who may retry (StorageUnavailable at once, or after
        the writer's write_timeout at most)."""
        now = self.clock()

        def write(tx: StoreTx) -> tuple[Effects, T]:
            effects, answer = decide(tx, now)
            write_effects(tx, effects, now, cause.text)
            return effects, answer

        def late(result: tuple[Effects, T]) -> None:  # landed after the caller was answered
            self.apply(result[0], now, cause)

        effects, answer = await self.writer.write(write, fail_fast=fail_fast, on_late=late)
        self.apply(effects, now, cause)
        return answer

    # ---- memory follows the store, then agents and watchers are told -------------------------

    def apply(self, effects: Effects, now: float, cause: Cause) -> None:
        """What committed, applied to memory and told (see the module docstring)."""
        if effects.usage:
            self.inputs.usage.update({u: (v, now) for u, v in effects.usage.items()})
        if effects.node_down is not None:
            self._node_down(*effects.node_down)
        for job in (*effects.replaced, *effects.loaded):
            self.jobs.put(job)
        events = self._new_versions(effects, now)
        left = self._left_running(effects)
        events += self._moves(effects, now)
        events += self._requeues(effects, now)
        launched = self._starts(effects, now)
        events += [(started_event(job, now), job) for job in launched]
        self._stops(effects)
        events += self._followed(effects, now)
        try:
            # agents first: their messages then leave before the watchers' (each stream's
            # writer runs in the order told), a start ~0.5 ms sooner per watcher
            if launched:
                self.agents.send_starts(launched)
            if effects.stops:
                self.agents.send_stops(effects.stops)
            if left:
                self.agents.stop_left_behind(left, skip=cause.node)
        finally:
            for event, version in events:  # each carries the change's cause
                self.bus.job_event(replace(event, cause=cause.text), version)

    def _left_running(self, effects: Effects) -> list[tuple[Job, StopOrder]]:
        """Jobs this change takes out of running (as memory has them now, with every node
        they run on), and the stop each of their nodes gets: one job, one fate. The node whose
        report made the change is skipped by the caller; a lost node's agent is not there."""
        left: dict[int, tuple[Job, StopOrder]] = {}
        for move in effects.moves:
            job = self.jobs.jobs.get(move.job_id)
            if (
                job is None
                or move.before is not JobState.RUNNING
                or move.after is JobState.RUNNING
                or move.job_id in left
            ):
                continue
            grace = min(self.agents.kill_grace, LEFT_BEHIND_GRACE)
            order = StopOrder(job.id, move.after, move.reason, grace, attempt=job.start_count)
            left[job.id] = (job, order)
        return list(left.values())

    def _new_versions(self, effects: Effects, now: float) -> list[Told]:
        """Jobs the change made (told with their first event) and specs it changed."""
        events: list[Told] = []
        for made in effects.created:
            self.jobs.put(made.job)
            events.append((JobEvent(made.job.id, now, None, made.job.state, made.reason), made.job))
        for edit in effects.edits:
            live = self.jobs.jobs.get(edit.job_id)
            if live is not None:
                self.jobs.put(new := edited(live, edit))
                state = live.state
                events.append((JobEvent(edit.job_id, now, state, state, edit.reason), new))
        return events

    def _requeues(self, effects: Effects, now: float) -> list[Told]:
        events: list[Told] = []
        for requeue in effects.requeues:
            self.jobs.put(back := brought_back(requeue))
            job_id, reason, before = requeue.job.id, requeue.reason, requeue.before
            events.append((JobEvent(job_id, now, before, JobState.PENDING, reason), back))
            if requeue.hold:
                events.append(
                    (JobEvent(job_id, now, JobState.PENDING, JobState.HELD, reason), back)
                )
        return events

    def _starts(self, effects: Effects, now: float) -> list[Job]:
        launched: list[Job] = []
        for start in (*effects.starts, *effects.landed):
            job = started(self.jobs.jobs[start.job_id], start, now)
            self.jobs.put(job)
            launched.append(job)
        return launched

    def _stops(self, effects: Effects) -> None:
        for order in effects.stops:
            live = self.jobs.jobs.get(order.job_id)
            if live is not None:
                self.jobs.put(replace(live, stop=(order.end_state, order.reason)))
            if order.hold_after:
                self.jobs.requeue_held.add(order.job_id)

    def _moves(self, effects: Effects, now: float) -> list[Told]:
        """State changes, job by job: memory takes each job's last version; a job that ended
        is remembered for the jobs that depend on it (in order: an array's outcome is decided
        by its last task to end)."""
        before: dict[int, Job | None] = {}
        after: dict[int, Job] = {}
        for move in effects.moves:
            job = before.setdefault(move.job_id, self.jobs.jobs.get(move.job_id))
            current = after.get(move.job_id, job)
            if current is not None:
                after[move.job_id] = evolve(current, move)
            if move.after is JobState.HELD:
                self.jobs.requeue_held.discard(move.job_id)
        for job in after.values():
            self.jobs.put(job)
            if not job.state.is_live:
                self.inputs.job_ended(job, job.state, self.jobs)
        return [
            (JobEvent(m.job_id, now, m.before, m.after, m.reason), before[m.job_id])
            for m in effects.moves
        ]

    def _followed(self, effects: Effects, now: float) -> list[Told]:
        events: list[Told] = []
        for job_id, stored in effects.followed:
            job = self.jobs.jobs.get(job_id)
            if job is None or job.state is not JobState.RUNNING:
                continue  # followed meanwhile (an earlier write's answer)
            log.warning("job %d ended in the store while memory had it running", job_id)
            new, reason = followed_store(job, stored)
            self.jobs.put(new)
            if not stored.is_live:
                self.inputs.job_ended(job, stored, self.jobs)
            events.append((JobEvent(job_id, now, JobState.RUNNING, stored, reason), job))
        return events

    def _node_down(self, node: str, reason: str) -> None:
        entry = self.nodes.get(node)
        if entry is not None:
            entry.node = replace(entry.node, state=NodeState.DOWN, reason=reason)


def started_event(job: Job, now: float) -> JobEvent:
    return JobEvent(job.id, now, JobState.PENDING, JobState.RUNNING, job.reason)


def write_effects(tx: StoreTx, effects: Effects, now: float, cause: str) -> None:
    """The store's part of `effects`, in the transaction that decided them (created and
    replaced jobs were written by their decider, which needed the ids)."""
    if effects.node_down is not None:
        node, reason = effects.node_down
        tx.set_node_state(node, NodeState.DOWN, reason)
    tx.edit_jobs(effects.edits, now, cause=cause)
    tx.transition(
        [StateChange(m.job_id, m.after, m.reason, m.result, m.at) for m in effects.moves],
        now,
        cause=cause,
    )
    groups: dict[tuple[str, bool], list[int]] = {}  # one per request: one statement
    for requeue in effects.requeues:
        groups.setdefault((requeue.reason, requeue.hold), []).append(requeue.job.id)
    for (reason, hold), job_ids in groups.items():
        tx.requeue_jobs(job_ids, reason, now, hold=hold, cause=cause)
    tx.start_jobs(effects.starts, now, cause=cause)
    for order in effects.stops:
        tx.request_stop(order.job_id, order.end_state, order.reason)
    tx.set_telemetries([(m.job_id, m.attempt, m.figures) for m in effects.telemetry])
    for user, value in effects.usage.items():
        tx.set_usage(user, value, now)
    for note in effects.notes:
        tx.add_event(note.job_id, note.at, note.state, note.text, cause=cause)
    tx.save_given_up(effects.given_up, now)
