"""What callers hand the store and get back besides domain objects: a submission (NewJob), a
state change, an edit, a start, a listing query, an outbox notification; and which endings an
explicit requeue may leave (REQUEUABLE).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuq.domain.model import JobResult, JobSpec
from gpuq.domain.states import JobState


@dataclass(frozen=True, slots=True)
class NewJob:
    """A validated submission; the coordinator has resolved its qos and priority."""

    spec: JobSpec
    user: str
    qos: str
    priority: int
    # the client's request key: a repeat of (user, key) adds nothing (StoreTx.add_job)
    key: str | None = None
    cause: str = ""  # kept with its "submitted" event: "Submit by alice", "cron entry 3"


@dataclass(frozen=True, slots=True)
class GivenUp:
    """A start given up with its silent node, whose end that node may still report when it
    is back: the nodes not yet heard from (none: forget it), the first (where its script ran),
    and when it was given up."""

    job_id: int
    attempt: int
    nodes: tuple[str, ...]
    first: str
    at: float


@dataclass(frozen=True, slots=True)
class StateChange:
    job_id: int
    to_state: JobState
    reason: str
    result: JobResult | None = None
    at: float | None = None  # when it happened, if not now (an end the supervisor recorded)


@dataclass(frozen=True, slots=True)
class JobEdit:
    """`gpuq update` of a waiting job: its whole new spec (validated by the coordinator), its
    qos and stored priority, and the event's reason ("updated by alice: time 1:00:00 -> ...")."""

    job_id: int
    spec: JobSpec
    qos: str
    priority: int
    reason: str


# an explicit requeue (`gpuq requeue`) is the one way back to the queue from these endings
# (preempted and node_fail also go back by themselves: the transition table)
REQUEUABLE = frozenset(
    {
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.PREEMPTED,
        JobState.NODE_FAIL,
        JobState.OUT_OF_MEMORY,
    }
)


@dataclass(frozen=True, slots=True)
class JobStart:
    job_id: int
    node: str
    gpus: tuple[str, ...]
    reason: str = ""  # the start event's reason; "": "started on NODE"
    shared: bool = False  # an MPS share: its unit may hold other shares at once
    # a multi-node start: every node and its units, `node` first (gpus is all of them);
    # (): every unit is on `node`
    parts: tuple[tuple[str, tuple[str, ...]], ...] = ()
    master_port: int | None = None  # MASTER_PORT for this start (step workers: one above)
    step_key: str | None = None  # the start's secret for srun and its step workers (hex)

    @property
    def node_parts(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(node, units) for every node of the start."""
        return self.parts or ((self.node, self.gpus),)

    @property
    def why(self) -> str:
        return self.reason or f"started on {self.node}"


@dataclass(frozen=True, slots=True)
class JobQuery:
    states: frozenset[JobState] | None = None
    user: str | None = None
    job_ids: tuple[int, ...] | None = None
    array_job_id: int | None = None
    node: str | None = None
    limit: int | None = None
    newest_first: bool = False
    # listing filters (gpuq queue / history): each given one must match; a tuple matches
    # any of its values. `since`/`until` bound end_time for ended jobs (by_end) and
    # submit_time otherwise; `names` are shell patterns (gpuq.domain.patterns)
    users: tuple[str, ...] | None = None
    names: tuple[str, ...] | None = None
    nodes: tuple[str, ...] | None = None
    since: float | None = None
    until: float | None = None
    by_end: bool = False
    # a page of a listing: the rows after this sort key in the query's order (the id; an
    # array's tasks: their index + 1, 0 for the record, then the id)
    after: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Notification:
    """A mail or webhook in the outbox (gpuq.coordinator.notifications): written before its first
    attempt, deleted once sent or given up, so that a coordinator's next start resumes it."""

    kind: str  # "mail" or "webhook"
    target: str  # the recipient, or the URL
    body: bytes  # the mail message, or the JSON
    trusted: bool = False  # an admin's webhook: any address
    attempts: int = 0  # attempts failed so far
    next_at: float = 0.0  # Unix seconds of the next attempt
    created_at: float = 0.0
    id: int | None = None  # None until stored
