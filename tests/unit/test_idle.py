"""Idle and hung jobs from their samples (gpuq/coordinator/workload/idle_rules.py): plain data,
time from the samples."""

from __future__ import annotations

from collections.abc import Sequence

from helpers import make_spec

from gpuq.coordinator.workload.idle_rules import (
    Decision,
    IdleWatch,
    Sample,
    UnitReading,
    span_text,
    step,
)
from gpuq.domain.policy import QosTier
from gpuq.domain.states import JobState
from gpuq.store.api import Store
from gpuq.store.records import JobStart, NewJob, StateChange

TIER = QosTier("normal", idle_threshold=5.0, idle_window=1800, hung_window=1800)
CANCEL = QosTier("batch", idle_threshold=5.0, idle_window=600, idle_action="cancel", hung_window=0)
GIB = 1 << 30


def hhmm(at: float) -> str:
    return f"t{at:g}"


def sample(
    at: float, utils: Sequence[float | None], memory: int = GIB, output: int = 0, job: int = 7
) -> Sample:
    units = tuple(UnitReading(f"GPU-{i}", u, memory) for i, u in enumerate(utils))
    return Sample(job, at, units, output)


def feed(
    watch: IdleWatch,
    samples: Sequence[Sample],
    tier: QosTier = TIER,
    start: int = 1,
) -> list[Decision]:
    return [d for s in samples for d in watch.observe(s, start, tier)]


def every(step_s: int, until: int, utils: Sequence[float | None], job: int = 7) -> list[Sample]:
    return [sample(float(t), utils, job=job) for t in range(0, until + 1, step_s)]


def test_all_units_below_the_threshold_for_the_window_is_idle() -> None:
    watch = IdleWatch(hhmm)
    assert feed(watch, every(60, 1740, [0.0, 4.9])) == []  # 29 minutes: not yet
    assert watch.flags(7) == ()
    [flag] = feed(watch, [sample(1800, [0.0, 4.9])])
    assert (flag.kind, flag.action) == ("idle", "flag")
    assert flag.text == "idle since t0: its GPUs below 5% for 30 min"
    assert watch.flags(7) == (flag.text,)
    assert feed(watch, [sample(1860, [0.0, 0.0])]) == []  # flagged once


def test_exactly_the_threshold_is_not_idle() -> None:
    watch = IdleWatch(hhmm)
    assert feed(watch, every(60, 3600, [5.0])) == []
    assert feed(IdleWatch(hhmm), every(60, 3600, [4.99])) != []


def test_unknown_utilisation_is_never_idle() -> None:
    watch = IdleWatch(hhmm)
    assert feed(watch, every(60, 3600, [0.0, None])) == []
    assert feed(watch, every(60, 3600, [None])) == []
    assert watch.flags(7) == ()


def test_a_job_without_gpus_is_never_idle() -> None:
    watch = IdleWatch(hhmm)
    assert feed(watch, every(60, 7200, [])) == []
    assert watch.flags(7) == ()


def test_an_unknown_sample_restarts_the_window() -> None:
    watch = IdleWatch(hhmm)
    feed(watch, every(60, 1200, [0.0]))
    feed(watch, [sample(1260, [None])])
    assert feed(watch, [sample(t, [0.0]) for t in range(1320, 3060, 60)]) == []
    assert [d.action for d in feed(watch, [sample(3120, [0.0])])] == ["flag"]
    assert watch.flags(7) == ("idle since t1320: its GPUs below 5% for 30 min",)


def test_recovery_clears_the_flag_and_resets_the_window() -> None:
    watch = IdleWatch(hhmm)
    feed(watch, every(60, 1800, [1.0, 1.0]))
    assert len(watch.flags(7)) == 1
    [clear] = feed(watch, [sample(1860, [1.0, 50.0])])
    assert (clear.kind, clear.action) == ("idle", "clear")
    assert clear.text.startswith("idle since t0")
    assert watch.flags(7) == ()
    # idle again: a whole new window before it is flagged again
    assert feed(watch, [sample(t, [0.0, 0.0]) for t in range(1920, 3720, 60)]) == []
    [again] = feed(watch, [sample(3720, [0.0, 0.0])])
    assert again.text.startswith("idle since t1920")


def test_a_new_start_of_the_job_begins_afresh() -> None:
    watch = IdleWatch(hhmm)
    feed(watch, every(60, 1800, [0.0]), start=1)
    assert watch.flags(7) and watch.flags(7, start=1)
    assert watch.flags(7, start=2) == ()
    # the requeued job's second start: its first samples flag nothing, the old flag is gone
    assert feed(watch, [sample(4000, [0.0]), sample(4060, [0.0])], start=2) == []
    assert watch.flags(7) == ()
    assert [d.action for d in feed(watch, [sample(5800, [0.0])], start=2)] == ["flag"]


def test_old_or_repeated_samples_are_ignored() -> None:
    watch = IdleWatch(hhmm)
    feed(watch, [sample(100, [0.0]), sample(1900, [0.0])])
    assert watch.flags(7)
    assert feed(watch, [sample(1900, [90.0]), sample(50, [90.0])]) == []
    assert watch.flags(7)


def test_cancel_policy_flags_then_cancels_once() -> None:
    watch = IdleWatch(hhmm)
    decisions = feed(watch, every(60, 1200, [0.0, 2.0]), CANCEL)
    assert [(d.kind, d.action) for d in decisions] == [("idle", "flag"), ("idle", "cancel")]
    assert decisions[0].text == "idle since t0: its GPUs below 5% for 10 min"
    assert decisions[1].text == "cancelled: idle: its GPUs below 5% for 10 min (qos batch)"
    # it recovers and idles again (the cancel is on its way): flagged again, not cancelled again
    feed(watch, [sample(1300, [80.0, 0.0])], CANCEL)
    again = feed(watch, [sample(t, [0.0, 0.0]) for t in range(1360, 2000, 60)], CANCEL)
    assert [d.action for d in again] == ["flag"]


def test_steady_busy_multi_gpu_job_without_output_is_possibly_hung() -> None:
    watch = IdleWatch(hhmm)
    steady = [sample(t, [100.0, 99.5, 100.0, 99.2], output=500) for t in range(0, 1800, 60)]
    assert feed(watch, steady) == []
    [hung] = feed(watch, [sample(1800, [99.4, 100.0, 99.6, 100.0], output=500)])
    assert (hung.kind, hung.action) == ("hung", "flag")
    assert hung.text == (
        "possibly hung (NCCL?) since t0: 4 GPUs at 99-100% with unchanged memory and no "
        "output for 30 min"
    )
    assert watch.flags(7) == (hung.text,)
    # output grows: it is alive
    [clear] = feed(watch, [sample(1860, [100.0] * 4, output=900)])
    assert (clear.kind, clear.action) == ("hung", "clear")
    assert watch.flags(7) == ()


def test_changing_memory_or_utilisation_is_not_hung() -> None:
    watch = IdleWatch(hhmm)
    moving = [sample(t, [100.0, 100.0], memory=GIB + t) for t in range(0, 3600, 60)]
    assert feed(watch, moving) == []
    watch = IdleWatch(hhmm)
    wandering = [sample(t, [100.0, 97.0 if t % 120 else 100.0]) for t in range(0, 3600, 60)]
    assert feed(watch, wandering) == []


def test_hung_needs_two_known_gpus_and_a_window() -> None:
    watch = IdleWatch(hhmm)
    assert feed(watch, every(60, 3600, [100.0])) == []  # one GPU
    assert feed(watch, every(60, 3600, [100.0, None])) == []  # unknown
    never = QosTier("x", hung_window=0)
    assert feed(IdleWatch(hhmm), every(60, 7200, [100.0, 100.0]), never) == []


def test_all_idle_is_idle_not_hung() -> None:
    watch = IdleWatch(hhmm)
    decisions = feed(watch, every(60, 1800, [0.0, 0.0]))
    assert [d.kind for d in decisions] == ["idle"]


def test_step_is_pure() -> None:
    first, _ = step(None, sample(0, [0.0]), 1, TIER, hhmm)
    second, decisions = step(first, sample(1800, [0.0]), 1, TIER, hhmm)
    assert first.flags == {} and second.flags and decisions
    again, same = step(first, sample(1800, [0.0]), 1, TIER, hhmm)
    assert again == second and same == decisions


def test_prune_forgets_jobs_that_no_longer_run() -> None:
    watch = IdleWatch(hhmm)
    feed(watch, every(60, 1800, [0.0], job=7) + every(60, 1800, [0.0], job=8))
    watch.prune(lambda job_id: job_id == 8)
    assert watch.flags(7) == () and watch.flags(8)


def test_spans_read_as_people_say_them() -> None:
    assert [span_text(s) for s in (2, 90, 600, 1800, 3600, 5400, 7200)] == [
        "2 s",
        "90 s",
        "10 min",
        "30 min",
        "1 h",
        "1 h 30 min",
        "2 h",
    ]


def test_the_store_notes_an_event_on_a_job_in_that_state_only(store: Store) -> None:
    """StoreTx.add_event: running -> running with the flag's line, nothing once it ended."""
    with store.transaction() as tx:
        [[job_id]] = tx.add_jobs([NewJob(make_spec("j", gpus=1), "alice", "normal", 0)], 100.0)
        assert not tx.add_event(job_id, 150.0, JobState.RUNNING, "idle since t0")
        tx.start_jobs([JobStart(job_id, "n1", ("GPU-1",))], now=200.0)
    with store.transaction() as tx:
        assert tx.add_event(job_id, 300.0, JobState.RUNNING, "idle since t0")
        tx.transition([StateChange(job_id, JobState.CANCELLED, "cancelled: idle")], 400.0)
        assert not tx.add_event(job_id, 500.0, JobState.RUNNING, "late")
    events = [(e.at, e.from_state, e.to_state, e.reason) for e in store.events(job_id)]
    assert events[-2:] == [
        (300.0, JobState.RUNNING, JobState.RUNNING, "idle since t0"),
        (400.0, JobState.RUNNING, JobState.CANCELLED, "cancelled: idle"),
    ]
    assert store.get_job(job_id).state is JobState.CANCELLED
