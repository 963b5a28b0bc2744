"""Transitions that return their effects: pure functions from what the store says (read in the
change's transaction) and what memory holds, to Effects and the caller's answer.

No I/O here: JobChanges calls these inside its transaction with the facts they need, and
carries out what they return (gpuq.coordinator.changes.job_changes). Tests call them with
plain data.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpuq.coordinator.changes.effects import Effects, Move, Note, Requeue, StopOrder, Telemetry
from gpuq.domain.model import Job, JobResult, JobTelemetry
from gpuq.domain.policy import QosTier
from gpuq.domain.states import RAN_TO_AN_END, JobState, check_transition
from gpuq.domain.units import format_size
from gpuq.errors import IllegalTransition, NotFound, Unsatisfiable
from gpuq.store.records import REQUEUABLE

# one answer per job of a user's action: what happened, or why not
Answer = str | Exception


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
class EndingFacts:
    """What the store says of the jobs that ended, read under the transaction's lock."""

    states: Mapping[int, JobState]
    starts: Mapping[int, int]  # how many times each was started
    node_fail_requeues: Mapping[int, int]  # how often each went node_fail -> pending


@dataclass(frozen=True, slots=True)
class EndingRules:
    """What endings need beyond the facts: memory and policy."""

    live: Mapping[int, Job]
    requeue_held: frozenset[int]  # `gpuq requeue --hold` asked: held once it ended
    tiers: Mapping[str, QosTier]
    charge: Callable[[str, float, float], float]  # (user, GPU-seconds, now) -> usage now
    latest: Callable[[int, int], JobTelemetry | None]  # (job, attempt) -> figures so far


def decide_endings(
    endings: Sequence[Ending],
    facts: EndingFacts,
    rules: EndingRules,
    now: float,
    node_down: tuple[str, str] | None = None,
) -> Effects:
    """Running jobs ended: each end is recorded (a preempted job goes back to the queue unless
    it said --no-requeue, a node_fail one as often as its QOS's requeue_on_node_fail allows;
    an Ending to pending is a start its agent never received) and its GPU time charged to its
    user's fair share; with the node marked down, when that is why."""
    effects = Effects(node_down=node_down)
    charges: dict[str, float] = {}
    for end in endings:
        job = rules.live.get(end.job_id)
        stored = facts.states.get(end.job_id)
        running = job is not None and job.state is JobState.RUNNING
        if running and stored is not None and stored is not JobState.RUNNING:
            effects.followed.append((end.job_id, stored))
        if stored is not JobState.RUNNING or job is None:
            continue  # already ended (node_fail, or a repeated report)
        if end.attempt and facts.starts.get(end.job_id) != end.attempt:
            continue  # about another start of the job (decided here, by the store)
        if end.state is JobState.PENDING:
            # the agent never received this start: the job never ran there, so it goes back
            # to the queue as it was (no requeue counted, nothing charged)
            effects.moves.append(Move(end.job_id, JobState.RUNNING, JobState.PENDING, end.reason))
            continue
        started = job.start_time or now
        # a clock that disagrees cannot put the end before the start or in the future
        ended = now if end.at is None else min(now, max(started, end.at))
        effects.moves.append(
            Move(end.job_id, JobState.RUNNING, end.state, end.reason, end.result, ended)
        )
        attempt = facts.starts.get(end.job_id, 0)
        measured = end.telemetry or rules.latest(end.job_id, attempt)
        if measured is not None:
            effects.telemetry.append(Telemetry(end.job_id, attempt, measured))
        effects.moves += _back_to_queue(job, end, facts, rules)
        seconds = len(job.gpus) * max(0.0, ended - started)
        charges[job.user] = charges.get(job.user, 0.0) + seconds
    effects.usage = {u: rules.charge(u, s, now) for u, s in charges.items() if s > 0}
    return effects


@dataclass(frozen=True, slots=True)
class LateEnd:
    """An end report of a start the coordinator gave up with its silent node, from that node
    once back: `leads`, the node runs the job's script (a multi-node job's first node)."""

    ending: Ending
    node: str
    leads: bool


def decide_late_endings(late: Sequence[LateEnd], facts: EndingFacts, now: float) -> Effects:
    """What a given-up start did is never dropped. If the job waits for its next start (it
    was requeued) and the late start ran to an end by itself, the requeue is withdrawn and
    the job ends as that start did; otherwise (it started again, it ended, or the start was
    stopped: fenced, cancelled) its history notes the start's end with its figures."""
    effects = Effects()
    for end in late:
        ending = end.ending
        state = facts.states.get(ending.job_id)
        if state is None:
            continue
        at = now if ending.at is None else min(now, ending.at)
        waiting = state in (JobState.PENDING, JobState.HELD)
        if (
            waiting
            and end.leads
            and ending.state in RAN_TO_AN_END
            and facts.starts.get(ending.job_id) == ending.attempt
        ):
            why = f"{ending.reason} (start {ending.attempt} on node {end.node}, reported late: "
            why += "its requeue is withdrawn)"
            move = Move(ending.job_id, state, ending.state, why, ending.result, at)
            effects.moves.append(move)
            if ending.telemetry is not None:
                effects.telemetry.append(Telemetry(ending.job_id, ending.attempt, ending.telemetry))
            continue
        effects.notes.append(Note(ending.job_id, now, _late_text(end, at), state))
    return effects


def _late_text(end: LateEnd, at: float) -> str:
    """`start 1 on node b ended completed at 12:03:04 (exit 0; peak GPU memory 3.1G),
    reported late by its node`."""
    ending = end.ending
    text = f"start {ending.attempt} on node {end.node} ended {ending.state.value} at "
    text += time.strftime("%H:%M:%S", time.localtime(at))
    result = ending.result
    figures = []
    if result is not None and result.exit_code is not None:
        figures.append(f"exit {result.exit_code}")
    if result is not None and result.signal:
        figures.append(f"signal {result.signal}")
    if ending.reason and ending.reason != ending.state.value:
        figures.append(ending.reason)
    measured = ending.telemetry
    if measured is not None and measured.samples:
        figures.append(f"peak GPU memory {format_size(measured.peak_gpu_mem)}")
        if measured.util_mean is not None:
            figures.append(f"mean GPU utilisation {measured.util_mean:.0f} %")
    if figures:
        text += f" ({'; '.join(figures)})"
    return text + ", reported late by its node"


def _back_to_queue(job: Job, end: Ending, facts: EndingFacts, rules: EndingRules) -> list[Move]:
    """A preempted job, or one lost with its node as often as its QOS allows, is queued
    again (held instead where `gpuq requeue --hold` stopped it)."""
    if not job.spec.requeue:
        return []
    if end.state is JobState.PREEMPTED:
        moves = [Move(job.id, JobState.PREEMPTED, JobState.PENDING, "requeued")]
        if job.id in rules.requeue_held:  # gpuq requeue --hold
            why = "held (requeued with --hold)"
            moves.append(Move(job.id, JobState.PENDING, JobState.HELD, why))
        return moves
    if end.state is JobState.NODE_FAIL:
        tier = rules.tiers.get(job.qos)
        allowed = tier.requeue_on_node_fail if tier is not None else 0
        done = facts.node_fail_requeues.get(job.id, 0)
        if done < allowed:
            why = f"requeued after node_fail ({done + 1} of {allowed} allowed by qos {job.qos})"
            return [Move(job.id, JobState.NODE_FAIL, JobState.PENDING, why)]
    return []


def decide_cancel(
    jobs: Sequence[Job], states: Mapping[int, JobState], reason: str, grace: float
) -> tuple[Effects, list[Answer]]:
    """A running job is asked to stop (it ends when its agent reports it gone), a waiting
    one is cancelled at once."""
    effects = Effects()
    answers: list[Answer] = []
    for job in jobs:
        state = states.get(job.id)
        if state is None:
            answers.append(NotFound(f"no job {job.id}"))
        elif state is JobState.RUNNING:
            effects.stops.append(StopOrder(job.id, JobState.CANCELLED, reason, grace))
            answers.append(f"stopping (SIGTERM, then SIGKILL after {grace:g} s)")
        elif not state.is_live:
            answers.append(f"already {state.value}")
        else:
            effects.moves.append(Move(job.id, state, JobState.CANCELLED, reason))
            answers.append("cancelled")
    return effects, answers


def decide_state_change(
    jobs: Sequence[Job], states: Mapping[int, JobState], to_state: JobState, reason: str
) -> tuple[Effects, list[Answer]]:
    """Hold or release: a job the table refuses (or that is gone) gets its error as its
    answer, and the others still change."""
    effects = Effects()
    answers: list[Answer] = []
    for job in jobs:
        state = states.get(job.id)
        if state is None:
            answers.append(NotFound(f"no job {job.id}"))
            continue
        try:
            check_transition(job.id, state, to_state)
        except IllegalTransition as exc:
            answers.append(exc)
            continue
        effects.moves.append(Move(job.id, state, to_state, reason))
        answers.append(to_state.value)
    return effects, answers


def decide_requeue(
    running: Sequence[Job],
    ended: Sequence[Job],
    states: Mapping[int, JobState],
    reason: str,
    hold: bool,
    grace: float,
) -> tuple[Effects, dict[int, Answer]]:
    """`gpuq requeue`: a running job is stopped as a preemption stops it and goes back to the
    queue when it ended (held with `hold`); an ended job is queued again at once."""
    effects = Effects()
    answers: dict[int, Answer] = {}
    for job in running:
        if states.get(job.id) is JobState.RUNNING:
            warning = int(job.spec.signal.signal) if job.spec.signal else 15
            order = StopOrder(job.id, JobState.PREEMPTED, reason, grace, warning, hold_after=hold)
            effects.stops.append(order)
            answers[job.id] = f"stopping to requeue (then SIGKILL after {grace:g} s)"
        else:
            answers[job.id] = Unsatisfiable(
                f"job {job.display_id} is {states.get(job.id, 'gone')}: not requeued"
            )
    for job in ended:
        state = states.get(job.id)
        if state not in REQUEUABLE:
            answers[job.id] = Unsatisfiable(f"job {job.display_id} is {state}: not requeued")
            continue
        assert state is not None
        effects.requeues.append(Requeue(job, state, reason, hold))
        after = JobState.HELD if hold else JobState.PENDING
        answers[job.id] = f"requeued ({after.value})"
    return effects, answers


def decide_time_limit_stops(
    overdue: Sequence[int], states: Mapping[int, JobState]
) -> tuple[Effects, None]:
    """The coordinator's backstop for a supervisor that did not enforce a time limit: stop
    each overdue job that still runs, at once (no grace)."""
    effects = Effects()
    for job_id in overdue:
        if states.get(job_id) is JobState.RUNNING:
            effects.stops.append(StopOrder(job_id, JobState.TIMEOUT, "time limit reached", 0.0))
    return effects, None
