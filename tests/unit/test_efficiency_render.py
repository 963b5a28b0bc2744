"""`gpuq show`'s efficiency line, history's cells and report rows, from plain wire messages:
unknown figures say "unknown" (or "?"), never 0."""

from __future__ import annotations

import pytest

from gpuq.cli import render
from gpuq.cli.job_verbs import telemetry_lines
from gpuq.cli.listings import parse_since
from gpuq.errors import InvalidInput
from gpuq.v1 import queue_pb2
from gpuq.v1 import types_pb2 as pb

GIB = 1 << 30


def job(telemetry: pb.GpuTelemetry | None = None, gpus: int = 2, **fields: object) -> pb.Job:
    message = pb.Job(
        id=7,
        state="completed",
        start_time=100.0,
        end_time=3700.0,
        gpus=[f"GPU-{i}" for i in range(gpus)],
        spec=pb.JobSpec(name="train", resources=pb.Resources(gpus=gpus)),
        **fields,  # type: ignore[arg-type]
    )
    if telemetry is not None:
        message.telemetry.CopyFrom(telemetry)
    return message


def test_the_efficiency_line_says_every_figure() -> None:
    t = pb.GpuTelemetry(peak_gpu_mem=31 * GIB, util_mean=12.4, energy=1.9 * 3.6e6)
    assert render.efficiency_line(job(t), 160 * GIB) == (
        "used 31 of 160 GiB peak on 2 GPUs, mean SM busy 12 %, 1.9 kWh"
    )


def test_unknown_parts_say_unknown_never_zero() -> None:
    t = pb.GpuTelemetry(peak_gpu_mem=GIB // 2)
    line = render.efficiency_line(job(t, gpus=1), None)
    assert line == "used 0.5 of unknown GiB peak on 1 GPU, mean SM busy unknown, energy unknown"
    assert render.efficiency_line(job(None), None) == "unknown on 2 GPUs (nothing measured)"
    assert render.telemetry_cells(job(t)) == ("512M", "?", "?")
    assert render.telemetry_cells(job(None)) == ("-", "-", "-")


def test_no_line_for_a_job_that_never_ran_or_holds_no_gpu() -> None:
    assert render.efficiency_line(pb.Job(state="pending"), None) is None
    assert render.efficiency_line(job(None, gpus=0), None) is None


def test_small_energy_is_in_wh_and_zero_util_is_a_figure() -> None:
    t = pb.GpuTelemetry(peak_gpu_mem=GIB, util_mean=0.0, energy=0.0)
    assert render.efficiency_line(job(t, gpus=1), 80 * GIB) == (
        "used 1.0 of 80 GiB peak on 1 GPU, mean SM busy 0 %, 0 Wh"
    )


def test_show_lists_units_flags_and_the_line_escaped() -> None:
    t = pb.GpuTelemetry(
        peak_gpu_mem=2 * GIB,
        util_mean=50.0,
        samples=3,
        seconds=60.0,
        units=[pb.UnitTelemetry(uuid="GPU-0", peak_mem=GIB, util_mean=50.0)],
    )
    lines = dict(telemetry_lines(job(t, flags=["idle since 12:03\x1b[2J"]), 160 * GIB))
    assert lines["Flags"] == "idle since 12:03\\x1b[2J"
    assert lines["GPU telemetry"].startswith("peak VRAM 2G, util p95 unknown, 3 samples")
    assert lines["unit"] == "GPU-0: peak 1G, mean util 50 %, energy unknown"
    assert lines["Efficiency"].endswith("mean SM busy 50 %, energy unknown")


def test_job_json_has_telemetry_with_nulls_for_unknown() -> None:
    data = render.job_dict(job(pb.GpuTelemetry(peak_gpu_mem=5, energy=7.0)))
    assert data["telemetry"]["util_mean"] is None
    assert data["telemetry"]["energy_joules"] == 7.0
    assert render.job_dict(job(None))["telemetry"] is None


def test_report_rows() -> None:
    row = queue_pb2.ReportRow(user="a", jobs=2, gpu_seconds=7200.0, util_gpu_seconds=3600.0)
    assert render.report_dict(row) == {
        "user": "a",
        "jobs": 2,
        "gpu_hours": 2.0,
        "energy_kwh": None,
        "mean_util": None,
        "measured_gpu_hours": 1.0,
    }


def test_since_forms() -> None:
    assert parse_since("7d", 1_000_000.0) == 1_000_000.0 - 7 * 86400
    assert parse_since("30m", 10_000.0) == 10_000.0 - 1800
    assert parse_since("2026-11-01T00:00:00+00:00", 0.0) == 1_793_491_200.0
    with pytest.raises(InvalidInput):
        parse_since("last tuesday", 0.0)
