"""The one transition table."""

from __future__ import annotations

import pytest

from gpuq.domain.states import LIVE_STATES, TRANSITIONS, JobState, check_transition
from gpuq.errors import IllegalTransition


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
        (JobState.PENDING, JobState.COMPLETED),
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
    assert JobState.PENDING not in TRANSITIONS[JobState.HELD] - {JobState.PENDING}


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
