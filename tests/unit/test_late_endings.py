"""decide_late_endings, the pure rule for a given-up start's end reported late: the requeue is
withdrawn only for a start that ran to an end by itself, reported by the node that ran its
script, of the start the job is waiting after; everything else is noted with its figures."""

from __future__ import annotations

import pytest

from gpuq.coordinator.changes.transitions import Ending, EndingFacts, LateEnd, decide_late_endings
from gpuq.domain.model import JobResult, JobTelemetry
from gpuq.domain.states import JobState

NOW = 2_000_000.0
AT = NOW - 30


def late(
    state: JobState = JobState.COMPLETED,
    attempt: int = 1,
    leads: bool = True,
    telemetry: JobTelemetry | None = None,
) -> LateEnd:
    result = JobResult(exit_code=0 if state is JobState.COMPLETED else 3, reason="")
    ending = Ending(7, state, state.value, result, AT, attempt, telemetry)
    return LateEnd(ending, "b", leads)


def facts(state: JobState, starts: int = 1) -> EndingFacts:
    return EndingFacts({7: state}, {7: starts}, {})


@pytest.mark.parametrize("waiting", [JobState.PENDING, JobState.HELD])
@pytest.mark.parametrize(
    "ended",
    [JobState.COMPLETED, JobState.FAILED, JobState.TIMEOUT, JobState.OUT_OF_MEMORY],
)
def test_a_waiting_jobs_start_that_ran_to_an_end_withdraws_the_requeue(
    waiting: JobState, ended: JobState
) -> None:
    telemetry = JobTelemetry(peak_gpu_mem=3 << 30, util_mean=88.0, samples=4, seconds=20)
    effects = decide_late_endings([late(ended, telemetry=telemetry)], facts(waiting), NOW)
    [move] = effects.moves
    assert (move.job_id, move.before, move.after, move.at) == (7, waiting, ended, AT)
    assert move.result is not None and move.result.exit_code in (0, 3)
    assert move.reason.endswith("(start 1 on node b, reported late: its requeue is withdrawn)")
    assert [(t.job_id, t.attempt) for t in effects.telemetry] == [(7, 1)]
    assert not effects.notes


@pytest.mark.parametrize(
    ("end", "now_in", "starts"),
    [
        (late(JobState.NODE_FAIL), JobState.PENDING, 1),  # fenced: the requeue stands
        (late(JobState.CANCELLED), JobState.PENDING, 1),  # stopped by the coordinator's word
        (late(JobState.PREEMPTED), JobState.HELD, 1),
        (late(leads=False), JobState.PENDING, 1),  # a follower node's part of the job
        (late(), JobState.RUNNING, 2),  # it started again meanwhile
        (late(), JobState.PENDING, 2),  # ... and is waiting after that later start
        (late(), JobState.COMPLETED, 2),  # ... or has ended since
    ],
)
def test_any_other_late_end_is_noted_in_the_jobs_history(
    end: LateEnd, now_in: JobState, starts: int
) -> None:
    effects = decide_late_endings([end], facts(now_in, starts), NOW)
    assert not effects.moves
    [note] = effects.notes
    assert (note.job_id, note.at, note.state) == (7, NOW, now_in)
    assert note.text.startswith(f"start 1 on node b ended {end.ending.state.value} at ")
    assert note.text.endswith(", reported late by its node")


def test_a_note_carries_the_starts_figures() -> None:
    telemetry = JobTelemetry(peak_gpu_mem=3 << 30, util_mean=41.6, samples=9, seconds=45)
    effects = decide_late_endings([late(telemetry=telemetry)], facts(JobState.RUNNING, 2), NOW)
    [note] = effects.notes
    assert "(exit 0; peak GPU memory 3G; mean GPU utilisation 42 %)" in note.text, note.text


def test_a_job_the_store_no_longer_has_changes_nothing() -> None:
    effects = decide_late_endings([late()], EndingFacts({}, {}, {}), NOW)
    assert not effects
