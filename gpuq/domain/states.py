"""Job states and the one table of legal transitions.

Every state change anywhere in gpuq goes through `check_transition`; the store calls it inside the
transaction that writes the change and its event row, so an illegal change is never persisted.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from gpuq.errors import IllegalTransition, InvalidInput


class JobState(StrEnum):
    PENDING = "pending"
    HELD = "held"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    PREEMPTED = "preempted"
    NODE_FAIL = "node_fail"
    OUT_OF_MEMORY = "out_of_memory"

    @property
    def is_live(self) -> bool:
        """Pending, held or running: the job may still run or is running."""
        return self in LIVE_STATES


_ENDINGS = frozenset(
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

# how a start ends by itself (not stopped by anyone): a job requeued after its node was given
# up whose start then turns out to have ended so, reported late by its node once back, ends as
# that start did instead of running again (gpuq.coordinator.changes.transitions)
RAN_TO_AN_END = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.TIMEOUT, JobState.OUT_OF_MEMORY}
)

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    # a pending job starts, is held, or is cancelled (by a user, or because a dependency can
    # never be met); or it ends as its last start did, reported late (RAN_TO_AN_END)
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.HELD, JobState.CANCELLED})
    | RAN_TO_AN_END,
    JobState.HELD: frozenset({JobState.PENDING, JobState.CANCELLED}) | RAN_TO_AN_END,
    # a running job ends; or it goes back to pending when its agent never received the start
    # (the agent registers without it, or hands it back unstarted): it never ran, so that is
    # neither an ending nor a requeue (its GPUs are released, nothing is charged)
    JobState.RUNNING: _ENDINGS | {JobState.PENDING},
    # a preempted job goes back to the queue unless it was submitted with --no-requeue
    JobState.PREEMPTED: frozenset({JobState.PENDING}),
    JobState.COMPLETED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.TIMEOUT: frozenset(),
    # a job lost with its node goes back to the queue as often as its QOS allows
    # (requeue_on_node_fail), unless it was submitted with --no-requeue
    JobState.NODE_FAIL: frozenset({JobState.PENDING}),
    JobState.OUT_OF_MEMORY: frozenset(),
}

# A requeued job passes through preempted (or node_fail) and back to pending in one
# transaction, so a job is seen resting in either only when it was not requeued: then it has
# ended.
LIVE_STATES = frozenset({JobState.PENDING, JobState.HELD, JobState.RUNNING})


def check_transition(job_id: int, from_state: JobState, to_state: JobState) -> None:
    """Raise IllegalTransition unless the table allows from_state -> to_state."""
    if to_state not in TRANSITIONS[from_state]:
        raise IllegalTransition(job_id, from_state.value, to_state.value)


# SLURM's squeue codes (HD, held, is gpuq's own: SLURM shows a held job as PD)
SHORT_STATE: dict[JobState, str] = {
    JobState.PENDING: "PD",
    JobState.HELD: "HD",
    JobState.RUNNING: "R",
    JobState.COMPLETED: "CD",
    JobState.FAILED: "F",
    JobState.CANCELLED: "CA",
    JobState.TIMEOUT: "TO",
    JobState.PREEMPTED: "PR",
    JobState.NODE_FAIL: "NF",
    JobState.OUT_OF_MEMORY: "OOM",
}
_BY_TEXT = {code.lower(): state for state, code in SHORT_STATE.items()} | {
    state.value: state for state in JobState
}


def parse_states(texts: Iterable[str]) -> frozenset[JobState]:
    """State names or SLURM codes, any case, each possibly a comma list: `R,PD`, `running`."""
    found: set[JobState] = set()
    for text in texts:
        for part in str(text).split(","):
            state = _BY_TEXT.get(part.strip().lower())
            if state is None:
                known = ", ".join(f"{c} ({s.value})" for s, c in SHORT_STATE.items())
                raise InvalidInput("--state", part, f"not a job state; known: {known}")
            found.add(state)
    return frozenset(found)
