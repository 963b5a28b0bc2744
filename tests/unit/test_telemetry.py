"""Per-job GPU telemetry from plain readings: peaks, mean and p95, energy deltas across counter
resets, and "unknown" kept apart from 0."""

from __future__ import annotations

import pytest

from gpuq.agent.gpu.job_gpu_telemetry import JobTelemetry, UnitReading

GIB = 1024**3


def reading(
    uuid: str, memory: int = 0, util: int | None = None, energy: int | None = None
) -> UnitReading:
    return UnitReading(uuid, memory, util, energy)


def test_peaks_per_unit_and_over_all_units_at_once() -> None:
    job = JobTelemetry(7)
    job.add(100.0, [reading("a", 10 * GIB), reading("b", 2 * GIB)])
    job.add(105.0, [reading("a", 4 * GIB), reading("b", 9 * GIB)])
    job.add(110.0, [reading("a", 0), reading("b", 0)])
    summary = job.telemetry()
    assert summary.peak_gpu_mem == 13 * GIB  # 4 + 9 at once; not 10 + 9, never held together
    assert [(u.uuid, u.peak_mem) for u in summary.units] == [("a", 10 * GIB), ("b", 9 * GIB)]
    assert summary.samples == 3
    assert summary.seconds == 10.0


def test_mean_and_p95_over_known_samples() -> None:
    job = JobTelemetry(1)
    for at, percent in enumerate([0] * 10 + [100] * 9 + [50]):  # 20 samples
        job.add(float(at), [reading("a", util=percent)])
    summary = job.telemetry()
    assert summary.util_mean == pytest.approx((9 * 100 + 50) / 20)
    assert summary.util_p95 == 100.0  # the 19th of 20 sorted samples
    assert summary.units[0].util_mean == summary.util_mean
    job = JobTelemetry(2)
    for at, percent in enumerate(range(1, 101)):
        job.add(float(at), [reading("a", util=percent)])
    assert job.telemetry().util_p95 == 95.0


def test_unknown_utilisation_is_absent_not_zero() -> None:
    job = JobTelemetry(3)
    job.add(0.0, [reading("mig", GIB)])
    job.add(1.0, [reading("mig", GIB)])
    summary = job.telemetry()
    assert not summary.HasField("util_mean")
    assert not summary.HasField("util_p95")
    assert not summary.units[0].HasField("util_mean")
    assert not summary.HasField("energy")  # a MIG slice has no counter
    sample = job.sample()
    assert sample is not None and not sample.units[0].HasField("util")


def test_unknown_samples_are_not_counted() -> None:
    job = JobTelemetry(4)
    job.add(0.0, [reading("a", util=80)])
    job.add(1.0, [reading("a", util=None)])  # unreadable for a moment
    job.add(2.0, [reading("a", util=40)])
    summary = job.telemetry()
    assert summary.util_mean == 60.0
    assert summary.samples == 3


def test_energy_is_the_counters_growth_and_survives_a_reset() -> None:
    job = JobTelemetry(5)
    job.add(0.0, [reading("a", energy=1_000_000), reading("b", energy=50_000)])
    assert not job.telemetry().HasField("energy")  # one reading: nothing measured yet
    job.add(1.0, [reading("a", energy=1_400_000), reading("b", energy=60_000)])
    job.add(2.0, [reading("a", energy=200), reading("b", energy=None)])  # a reset; b unreadable
    job.add(3.0, [reading("a", energy=300_200), reading("b", energy=70_000)])
    summary = job.telemetry()
    units = {u.uuid: u for u in summary.units}
    assert units["a"].energy == pytest.approx(400 + 300)  # joules: 400 J, then 300 J after
    assert units["b"].energy == pytest.approx(20)
    assert summary.energy == pytest.approx(720)


def test_the_latest_sample_carries_the_run_so_far() -> None:
    job = JobTelemetry(9)
    assert job.sample() is None
    job.add(10.0, [reading("a", 3 * GIB, 20, 0), reading("b", GIB, None, None)])
    job.add(15.0, [reading("a", 5 * GIB, 70, 5_000), reading("b", 2 * GIB, 30, None)])
    sample = job.sample(output_bytes=1234)
    assert sample is not None
    assert (sample.job_id, sample.at, sample.gpu_mem, sample.output_bytes) == (
        9,
        15.0,
        7 * GIB,
        1234,
    )
    assert [(u.uuid, u.memory, u.util) for u in sample.units] == [
        ("a", 5 * GIB, 70.0),
        ("b", 2 * GIB, 30.0),
    ]
    assert sample.so_far == job.telemetry()
    assert sample.so_far.energy == pytest.approx(5.0)
    assert sample.so_far.util_mean == pytest.approx(40.0)  # 20, 70, 30 (b's first unknown)


def test_out_of_range_percents_are_clamped() -> None:
    job = JobTelemetry(10)
    job.add(0.0, [reading("a", util=250)])
    job.add(1.0, [reading("a", util=-5)])
    summary = job.telemetry()
    assert summary.util_p95 == 100.0
    assert summary.util_mean == 50.0
