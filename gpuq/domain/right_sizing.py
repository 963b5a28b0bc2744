"""Right-sizing (issue 26, as SLURM's seff and a careful admin would judge): what a job asked
for against what it used, what a user's jobs of one name would have fitted in, who held GPUs
that sat idle, and how long a user's jobs of one name usually run (the estimated start of a
job without --time).

Pure rules over plain data: the coordinator gathers the rows (the store's past runs, the node
inventory's MIG profiles and shared GPUs) and the CLI prints what these decide. Every
suggestion comes with its evidence, and only where it differs materially from what was asked:
a suggestion that saves little is noise.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from gpuq.domain.model import UnitTelemetry, UsageRow
from gpuq.domain.states import JobState
from gpuq.domain.units import format_duration

GIB = 2**30
MEM_HEADROOM = 1.2  # a suggested --gpu-mem: the peak and a fifth more, rounded up to a GiB
TIME_HEADROOM = 1.25  # a suggested --time: the run time (p95) and a quarter more, rounded up
# a smaller --gpu-mem only when it is at most three quarters of what was asked
MEM_MATERIAL = 0.75
# a job that asked for no --gpu-mem: a MIG slice or a share only when it used at most half
# its card's memory
CARD_MATERIAL = 0.5
TIME_MATERIAL = 0.5  # a shorter --time only when it is at most half of the limit
SHARE_MAX = 50  # an MPS share is suggested for jobs that need at most half a GPU's compute
MIG_SLICES = 7  # compute slices of a whole MIG-capable GPU (A100, H100, H200)
IDLE_UTIL = 10.0  # percent: GPUs held at a GPU-hour-weighted mean below this sat idle...
IDLE_MIN_GPU_SECONDS = 3600.0  # ...over at least one measured GPU-hour
# a run's utilisation, and its memory against the card (no --gpu-mem asked), are judged only
# over at least a minute: a job of a few seconds spends most of them starting
MIN_JUDGED_SECONDS = 60.0
UNUSED_UTIL = 1.0  # percent: a GPU of a job that held no memory and was this busy was unused
# the estimated start of a job without --time: the p90 of its user's last 20 completed runs of
# the same name, over the last 30 days
MEASURED_RUNS = 20
MEASURED_QUANTILE = 0.9
MEASURED_DAYS = 30
ADVICE_DAYS = 30  # gpuq report --advice without --since: the last 30 days
ADVICE_JOBS_PER_USER = 1000  # ... and at most a user's 1000 latest ended jobs

_MIG_SLICES_RE = re.compile(r"(?:[0-9]+c\.)?([0-9]+)g\.")


@dataclass(frozen=True, slots=True)
class PastRun:
    """One run of a job (ended, or running: figures so far) as right-sizing reads it."""

    user: str
    name: str
    state: JobState
    gpus: int  # units per node
    nodes: int
    asked_gpu_mem: int | None  # --gpu-mem (per GPU)
    mig: str | None
    gpu_share: int | None
    time_limit: float | None  # effective: --time, or the QOS default
    elapsed: float  # seconds it ran (so far)
    peak_unit_mem: int | None  # bytes the busiest one of its GPUs held; None: not measured
    card_mem: int | None  # memory of the smallest unit it ran on; None: unknown
    util_mean: float | None = None  # percent
    util_p95: float | None = None
    units: tuple[UnitTelemetry, ...] = ()
    asked_mem: int | None = None  # --mem (per node)
    mem_peak: int | None = None  # host memory, its busiest node; None: not reported


@dataclass(frozen=True, slots=True)
class Offer:
    """What the cluster's nodes offer besides whole GPUs: MIG profiles with their memory
    (bytes), and whether any GPU is shared (MPS shares, --gpu-share)."""

    mig: tuple[tuple[str, int], ...] = ()
    shares: bool = False


@dataclass(frozen=True, slots=True)
class SizingAdvice:
    """One group of a user's jobs (same name): the evidence and what would have fitted."""

    user: str
    name: str
    jobs: int
    measured: int  # jobs whose GPU memory was measured
    asked_gpu_mem: int | None  # the latest job's --gpu-mem
    peak_gpu_mem: int | None  # the most one GPU of any of them held
    peak_gpu_mem_p95: int | None
    card_mem: int | None
    util_p95: float | None  # the p95 over jobs of each job's utilisation p95
    asked_time: float | None  # the latest job's effective limit
    completed: int
    run_p95: float | None  # seconds, over completed runs
    timeouts: int
    gpu_mem: int | None = None  # suggested
    mig: str | None = None
    gpu_share: int | None = None
    time: int | None = None  # suggested seconds

    @property
    def suggestions(self) -> list[str]:
        """The options to use, as typed: `--gpu-mem 12G`, `--mig 1g.18gb`, `--time 00:45:00`."""
        found = []
        if self.gpu_share is not None and self.gpu_mem is not None:
            found.append(f"--gpu-share {self.gpu_share} --gpu-mem {gib_text(self.gpu_mem)}")
        elif self.gpu_mem is not None:
            found.append(f"--gpu-mem {gib_text(self.gpu_mem)}")
        if self.mig is not None:
            found.append(f"--mig {self.mig}")
        if self.time is not None:
            found.append(f"--time {format_duration(self.time)}")
        return found


@dataclass(frozen=True, slots=True)
class IdleHolder:
    """A user whose GPUs sat idle most of the time they held them."""

    user: str
    gpu_seconds: float  # measured GPU-seconds
    util_mean: float  # percent, weighted by GPU-seconds


# ---- figures -------------------------------------------------------------------------------


def quantile(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank quantile (q in 0..1): a value that occurred, never an interpolation."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def mem_with_headroom(peak: int) -> int:
    """The peak and a fifth more, rounded up to a whole GiB (1 GiB at least)."""
    return max(1, math.ceil(peak * MEM_HEADROOM / GIB)) * GIB


def time_with_headroom(seconds: float) -> int:
    """The run time and a quarter more, rounded up to 5 minutes (15 minutes past 2 hours)."""
    wanted = seconds * TIME_HEADROOM
    step = 300 if wanted <= 7200 else 900
    return max(step, math.ceil(wanted / step) * step)


def gib_text(size: int) -> str:
    """A size as --gpu-mem takes it: `12G` (whole GiB), or `1.5G`."""
    value = size / GIB
    return f"{value:.0f}G" if value == int(value) else f"{value:.1f}G"


def gib(size: float) -> str:
    """Bytes as GiB for a sentence: `40`, `10.2`, `0.5`."""
    text = f"{size / GIB:.1f}"
    return text.removesuffix(".0")


def mig_slices(profile: str) -> int | None:
    """Compute slices of a MIG profile: 3 for `3g.71gb` and `1c.3g.71gb`."""
    match = _MIG_SLICES_RE.match(profile)
    return int(match[1]) if match else None


def compute_needed(run: PastRun) -> float | None:
    """The share of a whole GPU's compute the run used at its p95 (0..1); None: unknown."""
    if run.util_p95 is None:
        return None
    share = run.util_p95 / 100
    if run.mig is not None:
        slices = mig_slices(run.mig)
        return None if slices is None else share * slices / MIG_SLICES
    return share


def smallest_mig(offer: Offer, need_mem: int, compute: float | None) -> tuple[str, int] | None:
    """The smallest MIG profile the cluster offers with `need_mem` bytes and enough compute
    slices for `compute` (a share of a whole GPU; unknown: no MIG suggestion)."""
    if compute is None:
        return None
    fitting = [
        (memory, slices, name)
        for name, memory in offer.mig
        if memory >= need_mem
        and (slices := mig_slices(name)) is not None
        and slices / MIG_SLICES >= compute
    ]
    if not fitting:
        return None
    memory, _, name = min(fitting)
    return name, memory


def share_percent(compute: float | None) -> int | None:
    """An MPS share (percent of a GPU's compute) for `compute` used at p95: a quarter more,
    rounded up to 10 %; None when unknown or over SHARE_MAX."""
    if compute is None:
        return None
    percent = max(10, math.ceil(compute * 100 * TIME_HEADROOM / 10) * 10)
    return percent if percent <= SHARE_MAX else None


def single_gpu(run: PastRun) -> bool:
    return run.gpus == 1 and run.nodes == 1


# ---- gpuq report --advice ------------------------------------------------------------------


def advise(runs: Sequence[PastRun], offer: Offer) -> list[SizingAdvice]:
    """Per (user, name) group of ended runs (newest first, as the store gives them), what
    would have fitted; only groups with a suggestion that differs materially from what was
    asked, by user then name."""
    groups: dict[tuple[str, str], list[PastRun]] = {}
    for run in runs:
        if not run.state.is_live:
            groups.setdefault((run.user, run.name), []).append(run)
    found = [advice for group in groups.values() if (advice := advise_group(group, offer))]
    return sorted(found, key=lambda a: (a.user, a.name))


def advise_group(runs: Sequence[PastRun], offer: Offer) -> SizingAdvice | None:
    """A group's evidence and suggestions (None: nothing worth suggesting). `runs`: newest
    first; what the latest asked is what a suggestion is measured against."""
    latest = runs[0]
    peaks = [r.peak_unit_mem for r in runs if r.peak_unit_mem is not None]
    cards = [r.card_mem for r in runs if r.card_mem]
    utils = [r.util_p95 for r in runs if r.util_p95 is not None]
    done = [r.elapsed for r in runs if r.state is JobState.COMPLETED]
    timeouts = sum(r.state is JobState.TIMEOUT for r in runs)
    advice = SizingAdvice(
        user=latest.user,
        name=latest.name,
        jobs=len(runs),
        measured=len(peaks),
        asked_gpu_mem=latest.asked_gpu_mem,
        peak_gpu_mem=max(peaks) if peaks else None,
        peak_gpu_mem_p95=_int(quantile(peaks, 0.95)),
        card_mem=min(cards) if cards else None,
        util_p95=quantile(utils, 0.95),
        asked_time=latest.time_limit,
        completed=len(done),
        run_p95=quantile(done, 0.95),
        timeouts=timeouts,
    )
    gpu_mem, mig, share = _memory_advice(advice, runs, offer)
    time = _time_advice(advice)
    if gpu_mem is None and mig is None and share is None and time is None:
        return None
    return replace(advice, gpu_mem=gpu_mem, mig=mig, gpu_share=share, time=time)


def _memory_advice(
    advice: SizingAdvice, runs: Sequence[PastRun], offer: Offer
) -> tuple[int | None, str | None, int | None]:
    """(--gpu-mem, --mig, --gpu-share) that would have held every run's peak; all runs must
    have been measured (one unmeasured run may have been the biggest)."""
    peak = advice.peak_gpu_mem
    if peak is None or advice.measured < advice.jobs:
        return None, None, None
    need = mem_with_headroom(peak)
    asked = advice.asked_gpu_mem
    latest = runs[0]
    held = (asked if latest.gpu_share is not None else None) or advice.card_mem
    gpu_mem = need if asked is not None and need <= asked * MEM_MATERIAL else None
    small = held is not None and need <= held * CARD_MATERIAL
    mig = share = None
    if all(single_gpu(r) for r in runs) and (small or gpu_mem is not None):
        computes = [compute_needed(r) for r in runs]
        compute = None if None in computes else max(c for c in computes if c is not None)
        slice_ = smallest_mig(offer, need, compute)
        if slice_ is not None and (held is None or slice_[1] < held) and slice_[0] != latest.mig:
            mig = slice_[0]
        if offer.shares and latest.mig is None:
            share = share_percent(compute)
            if latest.gpu_share is not None and share is not None and share >= latest.gpu_share:
                share = None
            if share is not None and gpu_mem is None:
                gpu_mem = need  # a share's --gpu-mem is its VRAM limit
    return gpu_mem, mig, share


def _time_advice(advice: SizingAdvice) -> int | None:
    """A shorter --time from measured runs, when no run reached its limit and the limit is
    over twice what they needed."""
    if advice.run_p95 is None or advice.timeouts or advice.asked_time is None:
        return None
    wanted = time_with_headroom(advice.run_p95)
    return wanted if wanted <= advice.asked_time * TIME_MATERIAL else None


def idle_holders(rows: Iterable[UsageRow]) -> list[IdleHolder]:
    """Users whose GPUs sat idle most of the time they held them: a GPU-hour-weighted mean
    utilisation under IDLE_UTIL over at least IDLE_MIN_GPU_SECONDS measured; most held first."""
    found = [
        IdleHolder(r.user, r.util_gpu_seconds, r.util_mean)
        for r in rows
        if r.util_mean is not None
        and r.util_gpu_seconds >= IDLE_MIN_GPU_SECONDS
        and r.util_mean < IDLE_UTIL
    ]
    return sorted(found, key=lambda h: (-h.gpu_seconds, h.user))


# ---- gpuq eff ----------------------------------------------------------------------------------


def verdicts(run: PastRun, offer: Offer) -> list[str]:
    """One line per badly sized resource of one job (ended, or running: so far), e.g.
    "GPU memory: peak 10.2 GiB of 40 GiB asked (25%): --gpu-mem 13G would fit"."""
    lines = []
    so_far = " so far" if run.state.is_live else ""
    if run.state is JobState.COMPLETED and run.time_limit:
        wanted = time_with_headroom(run.elapsed)
        if wanted <= run.time_limit * TIME_MATERIAL:
            lines.append(
                f"Time: ran {format_duration(run.elapsed)} of {format_duration(run.time_limit)}"
                f" ({_percent(run.elapsed, run.time_limit)}): --time {format_duration(wanted)}"
                " would fit"
            )
    elif run.state is JobState.TIMEOUT:
        lines.append(
            f"Time: reached its limit of {format_duration(run.time_limit or run.elapsed)}:"
            " ask for more --time, or save checkpoints and resume"
        )
    judged = run.elapsed >= MIN_JUDGED_SECONDS
    lines += _memory_verdict(run, offer, so_far, judged)
    if run.asked_mem and run.mem_peak is not None:
        need = mem_with_headroom(run.mem_peak)
        if need <= run.asked_mem * MEM_MATERIAL:
            lines.append(
                f"Host memory: peak {gib(run.mem_peak)} GiB of {gib(run.asked_mem)} GiB asked"
                f" ({_percent(run.mem_peak, run.asked_mem)}): --mem {gib_text(need)} would fit"
            )
    if judged and run.util_mean is not None and run.util_mean < IDLE_UTIL and run.gpus:
        p95 = f", p95 {run.util_p95:.0f}%" if run.util_p95 is not None else ""
        lines.append(
            f"GPU utilisation: mean {run.util_mean:.0f}%{p95}{so_far}: its GPUs sat mostly"
            " idle (is the work on the GPU, or waiting for data?)"
        )
    unused = [
        u
        for u in run.units
        if u.util_mean is not None and u.util_mean < UNUSED_UTIL and u.peak_mem == 0
    ]
    total = run.gpus * run.nodes
    if unused and len(run.units) == total and total > 1 and len(unused) < total:
        lines.append(
            f"GPUs: {len(unused)} of {total} never used{so_far}: "
            f"--gpus {(total - len(unused)) // run.nodes or 1} would do"
        )
    return lines


def _memory_verdict(run: PastRun, offer: Offer, so_far: str, judged: bool) -> list[str]:
    peak = run.peak_unit_mem
    if peak is None:
        return []
    need = mem_with_headroom(peak)
    asked = run.asked_gpu_mem
    if asked is not None and need <= asked * MEM_MATERIAL:
        share = f" ({_percent(peak, asked)})"
        return [
            f"GPU memory: peak {gib(peak)} GiB of {gib(asked)} GiB asked{share}{so_far}: "
            f"--gpu-mem {gib_text(need)} would fit"
        ]
    card = run.card_mem
    if judged and asked is None and card and need <= card * CARD_MATERIAL:
        where = "a GPU with less memory"
        slice_ = smallest_mig(offer, need, compute_needed(run)) if single_gpu(run) else None
        if slice_ is not None and slice_[1] < card and slice_[0] != run.mig:
            where = f"a MIG slice (--mig {slice_[0]})"
        elif offer.shares and single_gpu(run) and (p := share_percent(compute_needed(run))):
            where = f"an MPS share (--gpu-share {p} --gpu-mem {gib_text(need)})"
        return [
            f"GPU memory: peak {gib(peak)} GiB of its {gib(card)} GiB GPU"
            f" ({_percent(peak, card)}){so_far}: {where} would do"
        ]
    return []


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "?"


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


# ---- the estimated start of a job without --time ---------------------------------------------


def measured_run(elapsed: Sequence[float], bound: float | None) -> float | None:
    """How long a user's job of one name is expected to run, from its last completed runs
    (newest first, at most MEASURED_RUNS): their p90, never over `bound` (the limit that
    is enforced); None without runs."""
    value = quantile(elapsed[:MEASURED_RUNS], MEASURED_QUANTILE)
    if value is None:
        return None
    return max(1.0, min(value, bound) if bound else value)


def run_time_table(rows: Iterable[tuple[str, str, float]]) -> dict[tuple[str, str], float]:
    """(user, name, seconds) of completed runs, newest first, as (user, name) -> the p90 of
    its latest MEASURED_RUNS (what measured_run bounds by each job's limit)."""
    table: dict[tuple[str, str], list[float]] = {}
    for user, name, seconds in rows:
        runs = table.setdefault((user, name), [])
        if len(runs) < MEASURED_RUNS:
            runs.append(seconds)
    return {key: value for key, runs in table.items() if (value := measured_run(runs, None))}
