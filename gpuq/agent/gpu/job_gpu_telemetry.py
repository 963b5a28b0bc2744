"""Per-job GPU telemetry: what a job's units did, sample by sample, summed up. Pure: no I/O.

The agent reads its units every sample interval (gpu.unit_reads), attributes each process to a job
by cgroup, and feeds one UnitReading per unit the job holds to that job's JobTelemetry:

- peak VRAM: the sum of the job's processes' bytes, per unit and over all its units at once;
- utilisation: mean and 95th percentile over the samples whose utilisation is known (a fixed
  histogram of 101 one-percent buckets, so memory does not grow with the run); an unknown
  sample (a MIG slice without GPM, an unreadable unit) is not counted, and a unit (or job)
  with no known sample has no figure at all: unknown is never reported as 0 %;
- energy: per whole GPU, the growth of the board's total-energy counter (millijoules) from the
  job's first sample to its last; a counter that goes down (a driver reload, a reset GPU, a
  wrap) starts a new baseline, keeping what was counted before. MIG slices have none (the
  counter is the whole board's). Known only once a unit has two readings of it;
- samples and the seconds they cover (first to last).

JobTelemetry.telemetry() is the pb.GpuTelemetry of a JobReport (ENDED) and of JobSample.so_far;
JobTelemetry.sample() the pb.JobSample of the latest interval, sent with the next heartbeat.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

BUCKETS = 101  # percent 0..100
PERCENTILE = 0.95


@dataclass(frozen=True, slots=True)
class UnitReading:
    """One unit a job holds, at one sample."""

    uuid: str
    memory: int  # bytes the job's processes hold on it
    util: int | None  # percent busy; None: unknown
    energy_mj: int | None  # the board's counter; None: a MIG slice, or NVML could not say


class _UtilStats:
    """Mean and a histogram of percent samples."""

    __slots__ = ("count", "histogram", "total")

    def __init__(self) -> None:
        self.histogram = [0] * BUCKETS
        self.count = 0
        self.total = 0

    def add(self, percent: int) -> None:
        percent = min(max(int(percent), 0), BUCKETS - 1)
        self.histogram[percent] += 1
        self.count += 1
        self.total += percent

    def merge(self, other: _UtilStats) -> None:
        for percent, count in enumerate(other.histogram):
            self.histogram[percent] += count
        self.count += other.count
        self.total += other.total

    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def p95(self) -> float | None:
        """The smallest percent at or below which 95 % of the samples lie (nearest rank)."""
        if not self.count:
            return None
        rank = max(1, -(-self.count * 95 // 100))  # ceil(0.95 * count), exact in integers
        seen = 0
        for percent, count in enumerate(self.histogram):
            seen += count
            if seen >= rank:
                return float(percent)
        return float(BUCKETS - 1)  # not reached


class _UnitStats:
    __slots__ = ("energy_mj", "last_counter", "peak_mem", "readings", "util")

    def __init__(self) -> None:
        self.peak_mem = 0
        self.util = _UtilStats()
        self.last_counter: int | None = None
        self.energy_mj = 0  # counted growth of the counter
        self.readings = 0  # counter readings

    def add(self, reading: UnitReading) -> None:
        self.peak_mem = max(self.peak_mem, reading.memory)
        if reading.util is not None:
            self.util.add(reading.util)
        counter = reading.energy_mj
        if counter is None:
            return
        self.readings += 1
        if self.last_counter is not None and counter >= self.last_counter:
            self.energy_mj += counter - self.last_counter
        # a first reading, or a counter that went down (reset or wrap): a new baseline
        self.last_counter = counter

    def energy_joules(self) -> float | None:
        return self.energy_mj / 1000.0 if self.readings >= 2 else None


class JobTelemetry:
    """Everything measured of one job's units since it started (or since this agent did)."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self.units: dict[str, _UnitStats] = {}  # in the order first seen (the job's order)
        self.samples = 0
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.peak_mem = 0
        self._latest: tuple[float, tuple[UnitReading, ...]] | None = None

    def add(self, at: float, readings: Sequence[UnitReading]) -> None:
        """One sample of the job's units at time `at` (seconds, e.g. time.time())."""
        for reading in readings:
            stats = self.units.get(reading.uuid)
            if stats is None:
                stats = self.units[reading.uuid] = _UnitStats()
            stats.add(reading)
        self.peak_mem = max(self.peak_mem, sum(r.memory for r in readings))
        self.samples += 1
        if self.first_at is None:
            self.first_at = at
        self.last_at = at if self.last_at is None else max(self.last_at, at)
        self._latest = (at, tuple(readings))

    def telemetry(self) -> pb.GpuTelemetry:
        """The run so far: aggregates per unit and over the job."""
        message = pb.GpuTelemetry(
            peak_gpu_mem=self.peak_mem,
            samples=self.samples,
            seconds=_covered(self.first_at, self.last_at),
        )
        pooled = _UtilStats()
        energy: float | None = None
        for uuid, stats in self.units.items():
            unit = message.units.add(uuid=uuid, peak_mem=stats.peak_mem)
            if (mean := stats.util.mean()) is not None:
                unit.util_mean = mean
            if (p95 := stats.util.p95()) is not None:
                unit.util_p95 = p95
            if (joules := stats.energy_joules()) is not None:
                unit.energy = joules
                energy = joules + (energy or 0.0)
            pooled.merge(stats.util)
        if (mean := pooled.mean()) is not None:
            message.util_mean = mean
        if (p95 := pooled.p95()) is not None:
            message.util_p95 = p95
        if energy is not None:
            message.energy = energy
        return message

    def sample(self, output_bytes: int = 0) -> apb.JobSample | None:
        """The latest sample, as a heartbeat carries it (None before the first)."""
        if self._latest is None:
            return None
        at, readings = self._latest
        message = apb.JobSample(
            job_id=self.job_id,
            at=at,
            gpu_mem=sum(r.memory for r in readings),
            output_bytes=max(output_bytes, 0),
        )
        for reading in readings:
            unit = message.units.add(uuid=reading.uuid, memory=reading.memory)
            if reading.util is not None:
                unit.util = float(reading.util)
        message.so_far.CopyFrom(self.telemetry())
        return message


def _covered(first: float | None, last: float | None) -> float:
    return last - first if first is not None and last is not None else 0.0
