"""The store's GPU telemetry (issue 12): aggregates kept with a job's start, the downsampled
series and its cap, and the per-user report summed in SQL. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from helpers import make_spec

from gpuq.domain.model import JobResult, JobTelemetry, SeriesPoint, UnitTelemetry
from gpuq.domain.states import JobState
from gpuq.store.api import Store
from gpuq.store.records import JobQuery, JobStart, NewJob, StateChange

GIB = 2**30

MEASURED = JobTelemetry(
    peak_gpu_mem=31 * GIB,
    util_mean=12.5,
    util_p95=40.0,
    energy=6.84e6,
    samples=120,
    seconds=600.0,
    units=(
        UnitTelemetry("GPU-1", 16 * GIB, 10.0, 30.0, 3.4e6),
        UnitTelemetry("GPU-2", 15 * GIB, None, None, None),
    ),
)


def add(store: Store, user: str = "alice", gpus: int = 2, now: float = 100.0) -> int:
    new = NewJob(make_spec("t", gpus=gpus), user=user, qos="normal", priority=0)
    with store.transaction() as tx:
        [[job_id]] = tx.add_jobs([new], now)
    return job_id


def run(
    store: Store,
    job_id: int,
    start: float,
    end: float,
    units: tuple[str, ...],
    telemetry: JobTelemetry | None,
) -> None:
    with store.transaction() as tx:
        tx.start_jobs([JobStart(job_id, "n1", units)], now=start)
    with store.transaction() as tx:
        done = StateChange(job_id, JobState.COMPLETED, "exit code 0", JobResult(0, None, ""))
        tx.transition([done], now=end)
        if telemetry is not None:
            tx.set_telemetry(job_id, tx.start_counts([job_id])[job_id], telemetry)


def test_telemetry_is_kept_with_the_job_and_read_back_whole(store: Store) -> None:
    job_id = add(store)
    assert store.get_job(job_id).telemetry is None
    run(store, job_id, 200.0, 800.0, ("GPU-1", "GPU-2"), MEASURED)
    assert store.get_job(job_id).telemetry == MEASURED
    [listed] = store.list_jobs(JobQuery(job_ids=(job_id,)))
    assert listed.telemetry == MEASURED


def test_telemetry_is_replaced_and_only_the_current_starts_is_shown(store: Store) -> None:
    job_id = add(store)
    with store.transaction() as tx:
        tx.start_jobs([JobStart(job_id, "n1", ("GPU-1", "GPU-2"))], now=200.0)
        tx.set_telemetry(job_id, 1, JobTelemetry(peak_gpu_mem=1, samples=1))
    with store.transaction() as tx:
        tx.set_telemetry(job_id, 1, MEASURED)
    assert store.get_job(job_id).telemetry == MEASURED
    with store.transaction() as tx:  # preempted and requeued, then started again
        tx.transition([StateChange(job_id, JobState.PREEMPTED, "preempted")], now=300.0)
        tx.transition([StateChange(job_id, JobState.PENDING, "requeued")], now=300.0)
    with store.transaction() as tx:
        tx.start_jobs([JobStart(job_id, "n1", ("GPU-3", "GPU-4"))], now=400.0)
    assert store.get_job(job_id).telemetry is None  # the first start's is not this one's


def test_many_jobs_telemetry_is_kept_in_one_call_new_and_replaced_alike(store: Store) -> None:
    """The ends one group commit records keep their telemetry together."""
    kept, fresh = add(store), add(store)
    with store.transaction() as tx:
        tx.start_jobs([JobStart(i, "n1", (f"GPU-{i}",)) for i in (kept, fresh)], now=200.0)
        tx.set_telemetry(kept, 1, JobTelemetry(peak_gpu_mem=1, samples=1))
    other = JobTelemetry(peak_gpu_mem=7, samples=3, seconds=9.0)
    with store.transaction() as tx:
        tx.set_telemetries([(kept, 1, MEASURED), (fresh, 1, other)])
    assert store.get_job(kept).telemetry == MEASURED
    assert store.get_job(fresh).telemetry == other


def test_series_keeps_points_and_thins_older_ones_past_the_cap(store: Store) -> None:
    job_id = add(store)
    other = add(store)
    with store.transaction() as tx:
        tx.add_series([SeriesPoint(job_id, float(t), t * GIB, 50.0) for t in range(8)], cap=10)
        tx.add_series([SeriesPoint(other, 1.0, 5, None)], cap=10)
    assert [p.at for p in store.series(job_id)] == [float(t) for t in range(8)]
    assert store.series(other) == [SeriesPoint(other, 1.0, 5, None)]
    with store.transaction() as tx:
        tx.add_series([SeriesPoint(job_id, float(t), 0, None) for t in range(8, 12)], cap=10)
    kept = [p.at for p in store.series(job_id)]
    # 12 points > 10: every second one of the older half (0-5) goes; the newer half stays
    assert kept == [0.0, 2.0, 4.0, *[float(t) for t in range(6, 12)]]
    assert len(store.series(other)) == 1


def test_report_sums_gpu_hours_energy_and_weighted_util_per_user(store: Store) -> None:
    a1, a2, a3 = add(store), add(store, gpus=1), add(store, gpus=1)
    b1 = add(store, user="bob", gpus=4)
    pending = add(store)  # never ran: not counted
    run(store, a1, 1000.0, 4600.0, ("GPU-1", "GPU-2"), MEASURED)  # 2 GPU-hours
    low = JobTelemetry(peak_gpu_mem=GIB, util_mean=50.0, energy=3.6e6)
    run(store, a2, 1000.0, 4600.0, ("GPU-3",), low)  # 1 GPU-hour
    run(store, a3, 5000.0, 8600.0, ("GPU-4",), None)  # 1 GPU-hour, nothing measured
    run(store, b1, 1000.0, 2800.0, ("GPU-5", "GPU-6", "GPU-7", "GPU-8"), None)
    with store.transaction() as tx:
        tx.transition([StateChange(pending, JobState.CANCELLED, "cancelled")], now=9000.0)

    alice, bob = store.usage_report()
    assert (alice.user, alice.jobs, bob.user, bob.jobs) == ("alice", 3, "bob", 1)
    assert alice.gpu_seconds == pytest.approx(4 * 3600)
    assert alice.energy == pytest.approx(6.84e6 + 3.6e6)
    # weighted by GPU-hours, over the 3 measured GPU-hours only
    assert alice.util_mean == pytest.approx((12.5 * 2 + 50.0 * 1) / 3)
    assert alice.util_gpu_seconds == pytest.approx(3 * 3600)
    assert bob.gpu_seconds == pytest.approx(2 * 3600)
    assert (bob.energy, bob.util_mean, bob.util_gpu_seconds) == (None, None, 0.0)

    [only] = store.usage_report(user="bob")
    assert only.user == "bob"
    [recent] = store.usage_report(since=5000.0)
    assert (recent.user, recent.jobs, recent.gpu_seconds) == ("alice", 1, 3600.0)
    assert store.usage_report(user="carol") == []
