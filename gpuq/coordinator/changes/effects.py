"""What a change to jobs does, as data.

A change is decided once, by a decider that reads what it needs inside the store transaction
(gpuq.coordinator.changes.transitions and the parts that own each kind of change), and comes
back as Effects. One applier (gpuq.coordinator.changes.job_changes) then writes them to the
store in that same transaction, applies them to memory once it committed, and tells agents
and watchers. This is the pattern of Dask's scheduler: a transition returns its effects
instead of performing them, so no effect is computed twice (once for the store and again for
memory) and every path a job can take goes through the same applier.

Every change carries a Cause (Dask's stimulus): which RPC and caller, agent report, scheduling
pass or chore made it. It is kept with each event the change writes, and `gpuq show` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpuq.domain.model import Job, JobResult, JobTelemetry
from gpuq.domain.states import JobState
from gpuq.store.records import GivenUp, JobEdit, JobStart


@dataclass(frozen=True, slots=True)
class Cause:
    """What made a change happen, as `gpuq show` prints it: `Cancel by alice`,
    `report from node a`, `scheduling pass 1234`, `heartbeat check`."""

    text: str
    node: str | None = None  # an agent's report: its node (its own part of a job has ended)

    @classmethod
    def request(cls, verb: str, user: str, via: str = "") -> Cause:
        """A user's request: `Cancel by alice` (`via web` for the dashboard's)."""
        return cls(f"{verb} by {user}" + (f" via {via}" if via else ""))

    @classmethod
    def agent(cls, node: str) -> Cause:
        return cls(f"report from node {node}", node)

    @classmethod
    def chore(cls, name: str) -> Cause:
        return cls(name)


@dataclass(frozen=True, slots=True)
class Move:
    """One job's state change (one event). `at`: when it happened, when not now (an end the
    supervisor recorded)."""

    job_id: int
    before: JobState
    after: JobState
    reason: str
    result: JobResult | None = None
    at: float | None = None


@dataclass(frozen=True, slots=True)
class StopOrder:
    """A running job is to stop and then become `end_state`: recorded with the job, and sent
    to its agent (the warning `signal`, then SIGKILL after `grace` seconds)."""

    job_id: int
    end_state: JobState
    reason: str
    grace: float
    signal: int = 15
    attempt: int = 0  # the start it stops; 0: the job's current one
    hold_after: bool = False  # `gpuq requeue --hold`: held, not pending, once it ended


@dataclass(frozen=True, slots=True)
class Requeue:
    """An ended job queued again under its id (`gpuq requeue`): pending, or held."""

    job: Job  # as the store has it, ended
    before: JobState
    reason: str
    hold: bool


@dataclass(frozen=True, slots=True)
class Created:
    """A job the decider stored (a submission, a task split off its array): memory takes it
    and watchers are told, with `reason` as its first event's."""

    job: Job
    reason: str


@dataclass(frozen=True, slots=True)
class Telemetry:
    """What one start of a job measured, kept with the job."""

    job_id: int
    attempt: int
    figures: JobTelemetry


@dataclass(frozen=True, slots=True)
class Note:
    """Something noted in a job's events without a state change (an idle flag, an output file
    gone, an earlier start's late end), written only while the job is still in `state`."""

    job_id: int
    at: float
    text: str
    state: JobState = JobState.RUNNING


@dataclass(slots=True)
class Effects:
    """Everything one change does, in the order the applier carries it out."""

    created: list[Created] = field(default_factory=list)
    # jobs whose stored row changed without an event of their own (an array's record whose
    # tasks were split off): memory takes the new version
    replaced: list[Job] = field(default_factory=list)
    # jobs the store has that memory lacks (a write that landed although its answer was
    # lost): memory takes them as they are, nobody is told
    loaded: list[Job] = field(default_factory=list)
    edits: list[JobEdit] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    requeues: list[Requeue] = field(default_factory=list)
    starts: list[JobStart] = field(default_factory=list)
    # starts the store already has: written by the decider itself (a submission's own start,
    # gpuq.coordinator.workload.submissions), or committed by an earlier try of the same
    # write although its answer was lost; memory and the agents follow
    landed: list[JobStart] = field(default_factory=list)
    stops: list[StopOrder] = field(default_factory=list)
    # jobs memory still shows running that the store has ended meanwhile (a write whose commit
    # landed although its answer was lost, tried again): memory follows the store
    followed: list[tuple[int, JobState]] = field(default_factory=list)
    telemetry: list[Telemetry] = field(default_factory=list)
    usage: dict[str, float] = field(default_factory=dict)  # user -> fair-share usage now
    notes: list[Note] = field(default_factory=list)
    # starts given up with their node, or what is left of them once a node reported (none
    # left: forgotten); see JobEndings
    given_up: list[GivenUp] = field(default_factory=list)
    node_down: tuple[str, str] | None = None  # (node, reason): marked down with the change

    def __bool__(self) -> bool:
        return any(
            (
                self.created,
                self.replaced,
                self.loaded,
                self.edits,
                self.moves,
                self.requeues,
                self.starts,
                self.landed,
                self.stops,
                self.followed,
                self.telemetry,
                self.usage,
                self.notes,
                self.given_up,
                self.node_down,
            )
        )


def evolve(job: Job, move: Move) -> Job:
    """The job as memory keeps it after `move` (the store's own rule is in StoreTx.transition:
    both must agree). Memory keeps live jobs only, so an ending's result and end time are the
    store's business: a job that ends leaves memory."""
    if move.after is JobState.PENDING and move.before in (JobState.PREEMPTED, JobState.NODE_FAIL):
        return _requeued(job, move.reason, job.requeue_count + 1)
    if move.after is JobState.PENDING and move.before is JobState.RUNNING:
        # a start the agent never received: the job never ran there, no requeue counted
        return _requeued(job, move.reason, job.requeue_count)
    return _with_state(job, move.after, move.reason)


def started(job: Job, start: JobStart, now: float) -> Job:
    """The job as memory keeps it once `start` committed (start_jobs counted the start)."""
    return replace(
        job,
        start_count=job.start_count + 1,
        state=JobState.RUNNING,
        node=start.node,
        nodes=tuple(node for node, _ in start.parts),
        gpus=start.gpus,
        master_port=start.master_port,
        step_key=start.step_key,
        start_time=now,
        end_time=None,
        result=None,
        stop=None,
        reason=start.why,
    )


def edited(job: Job, edit: JobEdit) -> Job:
    return replace(job, spec=edit.spec, qos=edit.qos, priority=edit.priority)


def followed_store(job: Job, stored: JobState) -> tuple[Job, str]:
    """A running job memory kept that the store has moved on (see Effects.followed): the
    version memory takes, and the event's reason."""
    if stored.is_live:  # requeued (after preemption or a start never received)
        return _requeued(job, "requeued", job.requeue_count + 1, stored), "requeued"
    return _with_state(job, stored, stored.value), stored.value


def brought_back(requeue: Requeue) -> Job:
    """An ended job as `gpuq requeue` puts it back: a fresh wait, its last run forgotten."""
    return replace(
        requeue.job,
        state=JobState.HELD if requeue.hold else JobState.PENDING,
        node=None,
        nodes=(),
        end_time=None,
        result=None,
        stop=None,
        reason=requeue.reason,
        requeue_count=requeue.job.requeue_count + 1,
    )


# ---- the field changes, one place each ------------------------------------------------------


def _with_state(job: Job, state: JobState, reason: str) -> Job:
    return replace(job, state=state, reason=reason)


def _requeued(job: Job, reason: str, requeues: int, state: JobState = JobState.PENDING) -> Job:
    return replace(
        job, state=state, node=None, nodes=(), stop=None, reason=reason, requeue_count=requeues
    )
