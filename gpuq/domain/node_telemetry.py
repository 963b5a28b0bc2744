"""A multi-node job's GPU telemetry: each node's agent measures that node's units; the job's
figures are their sum. Pure: the coordinator combines what each node sent (heartbeats so far,
the end report of the node that ended first) into the one JobTelemetry kept with the job.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuq.domain.model import JobTelemetry


def combined(parts: Sequence[JobTelemetry]) -> JobTelemetry | None:
    """The job's figures from each node's: memory and energy add up (the nodes' peaks taken
    as simultaneous: an upper bound), utilisation is averaged over the units, weighted by
    how many each node has; a figure one node lacks is unknown for the job."""
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    units = tuple(u for part in parts for u in part.units)
    weights = [max(1, len(part.units)) for part in parts]
    return JobTelemetry(
        peak_gpu_mem=sum(p.peak_gpu_mem for p in parts),
        util_mean=_weighted([p.util_mean for p in parts], weights),
        util_p95=_weighted([p.util_p95 for p in parts], weights),
        energy=None if any(p.energy is None for p in parts) else sum(p.energy or 0 for p in parts),
        samples=min(p.samples for p in parts),
        seconds=max(p.seconds for p in parts),
        units=units,
    )


def _weighted(values: Sequence[float | None], weights: Sequence[int]) -> float | None:
    if any(v is None for v in values):
        return None
    total = sum(weights)
    return sum((v or 0.0) * w for v, w in zip(values, weights, strict=True)) / total
