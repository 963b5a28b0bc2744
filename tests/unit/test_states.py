"""The one transition table."""

from __future__ import annotations

import pytest

from gpuq.domain.states import LIVE_STATES, TRANSITIONS, JobState, check_transition
from gpuq.errors import IllegalTransition

P, H, R = JobState.PENDING, JobState.HELD, JobState.RUNNING
CD, F, CA, TO = JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT
PR, NF, OOM = JobState.PREEMPTED, JobState.NODE_FAIL, JobState.OUT_OF_MEMORY

# The whole table, written out by hand: a change to gpuq.domain.states.TRANSITIONS must change
# this too (and say why in its review). Every pair not listed here is refused.
EXPECTED: dict[JobState, set[JobState]] = {
    # starts, is held, or is cancelled; or (requeued after its node was given up) ends as its
    # last start did when that start's end is reported late: never preempted or node_fail
    P: {R, H, CA, CD, F, TO, OOM},
    H: {P, CA, CD, F, TO, OOM},  # released or cancelled, or the same late end; never starts
    R: {CD, F, CA, TO, PR, NF, OOM, P},  # every ending, or back to pending (start not received)
    PR: {P},  # requeued (unless --no-requeue)
    NF: {P},  # requeued as its QOS allows
    CD: set(),
    F: set(),
    CA: set(),
    TO: set(),
    OOM: set(),
}
ALL_PAIRS = [(a, b) for a in JobState for b in JobState]


def test_the_whole_table_is_as_written() -> None:
    assert set(EXPECTED) == set(JobState)
    assert {state: set(to) for state, to in TRANSITIONS.items()} == EXPECTED


@pytest.mark.parametrize(
    ("from_state", "to_state"),
    [pair for pair in ALL_PAIRS if pair[1] in EXPECTED[pair[0]]],
    ids=lambda s: str(s),
)
def test_every_listed_change_is_allowed(from_state: JobState, to_state: JobState) -> None:
    check_transition(3, from_state, to_state)


@pytest.mark.parametrize(
    ("from_state", "to_state"),
    [pair for pair in ALL_PAIRS if pair[1] not in EXPECTED[pair[0]]],
    ids=lambda s: str(s),
)
def test_every_other_change_is_refused(from_state: JobState, to_state: JobState) -> None:
    with pytest.raises(IllegalTransition) as refused:
        check_transition(3, from_state, to_state)
    assert str(refused.value).startswith(f"job 3: cannot go from {from_state} to {to_state}")


def test_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(JobState)


def test_ended_states_go_nowhere_except_preempted_and_node_fail_back_to_the_queue() -> None:
    for state in JobState:
        if state in LIVE_STATES:
            continue
        requeued = (JobState.PREEMPTED, JobState.NODE_FAIL)
        expected = {JobState.PENDING} if state in requeued else set()
        assert set(TRANSITIONS[state]) == expected, state


def test_only_pending_jobs_start() -> None:
    assert [s for s in JobState if JobState.RUNNING in TRANSITIONS[s]] == [JobState.PENDING]


@pytest.mark.parametrize(
    ("from_state", "to_state"),
    [
        (JobState.PENDING, JobState.PREEMPTED),
        (JobState.HELD, JobState.NODE_FAIL),
        (JobState.HELD, JobState.RUNNING),
        (JobState.COMPLETED, JobState.PENDING),
        (JobState.RUNNING, JobState.HELD),
        (JobState.CANCELLED, JobState.RUNNING),
    ],
)
def test_illegal_transitions_raise(from_state: JobState, to_state: JobState) -> None:
    with pytest.raises(IllegalTransition, match=f"job 7: cannot go from {from_state}"):
        check_transition(7, from_state, to_state)


def test_a_start_the_agent_never_received_goes_back_to_pending() -> None:
    check_transition(1, JobState.RUNNING, JobState.PENDING)
    # back to the queue, never to held: a start that never reached its agent is not a hold
    with pytest.raises(IllegalTransition):
        check_transition(1, JobState.RUNNING, JobState.HELD)
    # pending is reached only from these: a release, an unreceived start, and the requeues
    back = {s for s in JobState if JobState.PENDING in TRANSITIONS[s]}
    assert back == {JobState.HELD, JobState.RUNNING, JobState.PREEMPTED, JobState.NODE_FAIL}


def test_running_ends_every_way() -> None:
    for end in (
        "completed",
        "failed",
        "cancelled",
        "timeout",
        "preempted",
        "node_fail",
        "out_of_memory",
    ):
        check_transition(1, JobState.RUNNING, JobState(end))
