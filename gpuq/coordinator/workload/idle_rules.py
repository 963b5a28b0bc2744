"""Idle and hung jobs, decided from the samples agents send (Heartbeat.jobs): pure, no I/O.

A running job is *idle* when every unit it holds reports a known utilisation below its QOS's
idle_threshold, sample after sample, for idle_window seconds ("unknown" utilisation never
counts as idle; a job without GPUs is never idle). It is *possibly hung* when it holds 2+
units that all keep one utilisation (within HUNG_UTIL_TOLERANCE percentage points) and one
memory figure, and its output files do not grow, for hung_window seconds (0: never), while
at least one unit is at or above the idle threshold (a job whose units all idle is idle).

Time comes from the samples themselves (their `at`, the agent's clock), so tests drive it with
plain data. `step` is the whole rule; `IdleWatch` keeps one Track per job for the coordinator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from gpuq.domain.policy import QosTier

HUNG_UTIL_TOLERANCE = 1.0  # percentage points a unit's utilisation may wander and stay "constant"

Kind = Literal["idle", "hung"]
Action = Literal["flag", "clear", "cancel"]


@dataclass(frozen=True, slots=True)
class UnitReading:
    uuid: str
    util: float | None  # percent busy; None: unknown (never idle)
    memory: int = 0  # bytes the job's processes hold on it


@dataclass(frozen=True, slots=True)
class Sample:
    """What one job's units did in one sampling interval."""

    job_id: int
    at: float
    units: tuple[UnitReading, ...]
    output_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Decision:
    job_id: int
    kind: Kind
    action: Action  # flag: newly flagged; clear: it recovered; cancel: the QOS cancels it
    text: str  # the flag's line (clear: the flag it drops; cancel: the cancel reason)


@dataclass(frozen=True, slots=True)
class Track:
    """One job's start as seen so far."""

    start: int  # the start (attempt) the samples are about; another start begins afresh
    last_at: float = float("-inf")
    idle_since: float | None = None  # first sample of the current all-idle run
    # the readings the current steady run began with (units' utils and memories, output)
    steady: tuple[tuple[tuple[str, float, int], ...], int] | None = None
    steady_since: float | None = None
    flags: dict[str, str] = field(default_factory=dict)  # kind -> its line
    cancelled: bool = False


def clock_text(at: float) -> str:
    """A sample's time as the flags show it (local time, HH:MM)."""
    return time.strftime("%H:%M", time.localtime(at))


def span_text(seconds: float) -> str:
    """A window as a person says it: 45 s, 30 min, 2 h, 1 h 30 min."""
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 120 and minutes % 60:
        return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def _percent(value: float) -> str:
    return f"{value:.0f}%" if value == int(value) else f"{value:g}%"


def idle_line(tier: QosTier, since: float, when: Callable[[float], str] = clock_text) -> str:
    return (
        f"idle since {when(since)}: its GPUs below {_percent(tier.idle_threshold)} for "
        f"{span_text(tier.idle_window)}"
    )


def cancel_reason(tier: QosTier) -> str:
    return (
        f"cancelled: idle: its GPUs below {_percent(tier.idle_threshold)} for "
        f"{span_text(tier.idle_window)} (qos {tier.name})"
    )


def hung_line(sample: Sample, tier: QosTier, since: float, when: Callable[[float], str]) -> str:
    utils = [u.util for u in sample.units if u.util is not None]
    low, high = min(utils), max(utils)
    at = _percent(round(low)) if round(low) == round(high) else f"{low:.0f}-{high:.0f}%"
    return (
        f"possibly hung (NCCL?) since {when(since)}: {len(sample.units)} GPUs at {at} with "
        f"unchanged memory and no output for {span_text(tier.hung_window)}"
    )


def _is_idle(sample: Sample, tier: QosTier) -> bool:
    return bool(sample.units) and all(
        u.util is not None and u.util < tier.idle_threshold for u in sample.units
    )


def _same(sample: Sample, steady: tuple[tuple[tuple[str, float, int], ...], int] | None) -> bool:
    if steady is None:
        return False
    units, output = steady
    if output != sample.output_bytes or len(units) != len(sample.units):
        return False
    return all(
        u.uuid == uuid and u.memory == memory and abs((u.util or 0.0) - util) <= HUNG_UTIL_TOLERANCE
        for u, (uuid, util, memory) in zip(sample.units, units, strict=True)
    )


def _hung_candidate(sample: Sample, tier: QosTier) -> bool:
    """A sample that could be part of a hang: 2+ units, every utilisation known, and not all
    of them idle (that is the idle rule's)."""
    return (
        tier.hung_window > 0
        and len(sample.units) >= 2
        and all(u.util is not None for u in sample.units)
        and not _is_idle(sample, tier)
    )


def step(
    track: Track | None,
    sample: Sample,
    start: int,
    tier: QosTier,
    when: Callable[[float], str] = clock_text,
) -> tuple[Track, list[Decision]]:
    """The job's track after one more sample, and what changed. A sample of another start
    than the track's begins a new track (the old start's flags go with it); a sample not
    later than the last one is ignored."""
    if track is None or track.start != start:
        track = Track(start=start)
    if sample.at <= track.last_at:
        return track, []
    units = tuple(sorted(sample.units, key=lambda u: u.uuid))
    sample = replace(sample, units=units)
    decisions: list[Decision] = []
    flags = dict(track.flags)
    job = sample.job_id

    # idle
    idle_since = track.idle_since
    cancelled = track.cancelled
    if _is_idle(sample, tier):
        idle_since = sample.at if idle_since is None else idle_since
        if "idle" not in flags and sample.at - idle_since >= tier.idle_window:
            flags["idle"] = idle_line(tier, idle_since, when)
            decisions.append(Decision(job, "idle", "flag", flags["idle"]))
            if tier.idle_action == "cancel" and not cancelled:
                cancelled = True
                decisions.append(Decision(job, "idle", "cancel", cancel_reason(tier)))
    else:
        idle_since = None
        if "idle" in flags:
            decisions.append(Decision(job, "idle", "clear", flags.pop("idle")))

    # hung
    steady, steady_since = track.steady, track.steady_since
    if _hung_candidate(sample, tier):
        if not _same(sample, steady):
            steady = (
                tuple((u.uuid, u.util or 0.0, u.memory) for u in units),
                sample.output_bytes,
            )
            steady_since = sample.at
            if "hung" in flags:
                decisions.append(Decision(job, "hung", "clear", flags.pop("hung")))
        assert steady_since is not None
        if "hung" not in flags and sample.at - steady_since >= tier.hung_window:
            flags["hung"] = hung_line(sample, tier, steady_since, when)
            decisions.append(Decision(job, "hung", "flag", flags["hung"]))
    else:
        steady, steady_since = None, None
        if "hung" in flags:
            decisions.append(Decision(job, "hung", "clear", flags.pop("hung")))

    after = Track(
        start=start,
        last_at=sample.at,
        idle_since=idle_since,
        steady=steady,
        steady_since=steady_since,
        flags=flags,
        cancelled=cancelled,
    )
    return after, decisions


class IdleWatch:
    """The coordinator's tracks, per running job (in memory: a restarted coordinator starts
    its windows afresh)."""

    def __init__(self, when: Callable[[float], str] = clock_text) -> None:
        self.when = when
        self.tracks: dict[int, Track] = {}

    def observe(self, sample: Sample, start: int, tier: QosTier) -> list[Decision]:
        track, decisions = step(self.tracks.get(sample.job_id), sample, start, tier, self.when)
        self.tracks[sample.job_id] = track
        return decisions

    def flags(self, job_id: int, start: int | None = None) -> tuple[str, ...]:
        """The job's flags now (of that start, when given), idle before hung."""
        track = self.tracks.get(job_id)
        if track is None or (start is not None and track.start != start):
            return ()
        return tuple(track.flags[k] for k in ("idle", "hung") if k in track.flags)

    def forget(self, job_id: int) -> None:
        self.tracks.pop(job_id, None)

    def prune(self, running: Callable[[int], bool]) -> None:
        """Drop the tracks of jobs no longer running."""
        for job_id in [i for i in self.tracks if not running(i)]:
            del self.tracks[job_id]
