"""A multi-node job's figures from each node's (gpuq/domain/node_telemetry.py)."""

from __future__ import annotations

from gpuq.domain.model import JobTelemetry, UnitTelemetry
from gpuq.domain.node_telemetry import combined


def part(peak: int, util: float | None, energy: float | None, units: int) -> JobTelemetry:
    return JobTelemetry(
        peak_gpu_mem=peak,
        util_mean=util,
        util_p95=util,
        energy=energy,
        samples=3,
        seconds=9.0,
        units=tuple(UnitTelemetry(f"GPU-{peak}-{i}") for i in range(units)),
    )


def test_one_node_is_itself_and_none_is_nothing() -> None:
    alone = part(1, 50.0, 2.0, 2)
    assert combined([alone]) is alone and combined([]) is None


def test_memory_and_energy_add_up_and_utilisation_is_weighted_by_units() -> None:
    job = combined([part(4, 90.0, 10.0, 3), part(2, 30.0, 5.0, 1)])
    assert job is not None
    assert (job.peak_gpu_mem, job.energy, len(job.units)) == (6, 15.0, 4)
    assert job.util_mean == 75.0  # (90*3 + 30*1) / 4


def test_a_figure_one_node_lacks_is_unknown_for_the_job() -> None:
    job = combined([part(4, None, 10.0, 2), part(2, 30.0, None, 2)])
    assert job is not None and job.util_mean is None and job.energy is None
