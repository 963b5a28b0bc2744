"""A running job's progress and throughput as the CLI shows them (README "Progress and
throughput"): the PROGRESS column of `gpuq queue --long`, the Progress, Throughput and ETA
lines of `gpuq show`, and `progress` in their `--json`. Pure functions of the wire's
Job.progress (only its owner and admins get it) and the time."""

from __future__ import annotations

import time
from typing import Any

from gpuq.domain.units import format_duration


def progress_dict(job: Any) -> dict[str, Any] | None:
    """`progress` in --json (None: nothing known, or not the caller's to see)."""
    if not job.HasField("progress"):
        return None
    p = job.progress

    def known(name: str) -> float | None:
        return float(getattr(p, name)) if p.HasField(name) else None

    return {
        "done": p.done,
        "total": known("total"),
        "fraction": known("fraction"),
        "unit": p.unit,
        "label": p.label or None,
        "rate": known("rate"),
        "eta": known("eta"),
        "source": p.source,
        "read_at": p.read_at,
        "collapse": p.collapse or None,
    }


def count_text(value: float) -> str:
    """`120`, `1.5`, `12.3k`: a count as a bar shows it."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e4, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.0f}" if value == int(value) else f"{value:.3g}"


def rate_text(rate: float, unit: str) -> str:
    """`3.2it/s`, `0.05it/s`, `1.2k samples/s`."""
    shown = f"{rate:.2g}" if rate < 10 else count_text(round(rate))
    unit = unit or "units"
    return f"{shown}{unit}/s" if len(unit) <= 4 else f"{shown} {unit}/s"


def progress_cell(job: Any) -> str:
    """`12% 3.2it/s ETA 00:04:33` (the parts known), `-` when nothing is."""
    if not job.HasField("progress"):
        return "-"
    p = job.progress
    parts = []
    if p.HasField("fraction"):
        parts.append(f"{p.fraction * 100:.0f}%")
    else:
        parts.append(f"{count_text(p.done)} {p.unit}".strip())
    if p.HasField("rate"):
        parts.append(rate_text(p.rate, p.unit))
    if p.HasField("eta"):
        parts.append(f"ETA {format_duration(p.eta)}")
    return " ".join(parts)


def progress_lines(job: Any) -> list[tuple[str, str]]:
    """`gpuq show`'s lines: Progress (done, of what, from which format, read when),
    Throughput and ETA (with the clock time it points at)."""
    if not job.HasField("progress"):
        return []
    p = job.progress
    done = count_text(p.done)
    words = [f"{done}/{count_text(p.total)}" if p.HasField("total") else done]
    if p.unit:
        words.append(p.unit)
    text = " ".join(words)
    if p.HasField("fraction"):
        text += f", {p.fraction * 100:.1f}%"
    if p.label:
        text += f", {p.label}"
    read = time.strftime("%H:%M:%S", time.localtime(p.read_at)) if p.read_at else "?"
    lines = [("Progress", f"{text} ({p.source}, read {read})")]
    if p.HasField("rate"):  # a collapse is in the job's flags, shown above
        lines.append(("Throughput", rate_text(p.rate, p.unit)))
    if p.HasField("eta"):
        at = time.strftime("%H:%M", time.localtime(p.read_at + p.eta)) if p.read_at else ""
        lines.append(("ETA", format_duration(p.eta) + (f" (about {at})" if at else "")))
    return lines
