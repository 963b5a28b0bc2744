"""Tables and JSON for the listings; pure functions of wire messages and the current time."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence
from typing import Any

from gpuq.domain.limits import CONTROL_RE
from gpuq.domain.states import SHORT_STATE as STATE_CODES
from gpuq.domain.units import format_duration, format_size

SHORT_STATE = {state.value: code for state, code in STATE_CODES.items()}
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match[0]
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """`text` safe for a terminal: every control character (C0 such as newline, tab and ESC;
    DEL; C1) and every Unicode character that reorders or breaks what follows (bidi
    overrides, embeddings and isolates, line and paragraph separators) shown as an escape
    (`\\n`, `\\x1b`, `\\u202e`). For every user- or agent-supplied string the CLI prints,
    whether or not stdout is a terminal."""
    line = text if isinstance(text, str) else str(text)
    if line.isprintable():  # the common case; never true with any of those characters
        return line
    return CONTROL_RE.sub(_escape, line)


def job_id_text(job: Any) -> str:
    """`42`, `40_3`, or `40_[3-99%8]` for an array's waiting tasks shown as one entry."""
    if job.array_tasks:
        limit = job.spec.array.max_running if job.spec.array.HasField("max_running") else 0
        return f"{job.array_job_id}_[{job.array_tasks}" + (f"%{limit}]" if limit else "]")
    if job.HasField("array_job_id"):
        return f"{job.array_job_id}_{job.array_task_id}"
    return str(job.id)


def elapsed(job: Any, now: float) -> str:
    if not job.HasField("start_time") or job.state in ("pending", "held"):
        return "-"
    end = job.end_time if job.HasField("end_time") else now
    return format_duration(end - job.start_time)


def when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return dt.datetime.fromtimestamp(timestamp).isoformat(sep=" ", timespec="seconds")


def job_reason(job: Any) -> str:
    if job.state == "pending":
        if job.HasField("pending") and job.pending.reasons:
            return "; ".join(job.pending.reasons)
        return "waiting for the next scheduling pass"
    if job.state == "running":
        if job.stop_reason:
            return f"stopping: {job.stop_reason}"
        return str(job.node)
    return str(job.reason)


def job_dict(job: Any) -> dict[str, Any]:
    """The JSON form of a job in listings (the full spec stays out; `gpuq show --json` has it)."""
    result = job.result if job.HasField("result") else None
    return {
        "id": job.id,
        "display_id": job_id_text(job),
        "name": job.spec.name,
        "user": job.user,
        "state": job.state,
        "qos": job.qos,
        "priority": job.priority,
        "gpus": job.spec.resources.gpus,
        "mig": job.spec.resources.mig or None,
        "cpus": job.spec.resources.cpus,
        "mem": job.spec.resources.mem if job.spec.resources.HasField("mem") else None,
        "time_limit": job.spec.resources.time_limit
        if job.spec.resources.HasField("time_limit")
        else None,
        "node": job.node or None,
        "gpu_uuids": list(job.gpus),
        "submit_time": job.submit_time,
        "start_time": job.start_time if job.HasField("start_time") else None,
        "end_time": job.end_time if job.HasField("end_time") else None,
        "exit_code": result.exit_code if result and result.HasField("exit_code") else None,
        "signal": result.signal if result and result.HasField("signal") else None,
        "reason": job.reason,
        "pending_reasons": list(job.pending.reasons) if job.HasField("pending") else [],
        "priority_factors": {f.name: f.value for f in job.pending.factors}
        if job.HasField("pending")
        else {},
        "estimated_start": job.pending.estimated_start
        if job.HasField("pending") and job.pending.HasField("estimated_start")
        else None,
        "requeue_count": job.requeue_count,
        "array_job_id": job.array_job_id if job.HasField("array_job_id") else None,
        "array_task_id": job.array_task_id if job.HasField("array_task_id") else None,
        "stdout": job.stdout_path,
        "stderr": job.stderr_path,
        "telemetry": telemetry_dict(job),
        "flags": list(job.flags),
    }


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Aligned columns; every cell through printable()."""
    cells = [[printable(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def dumps(value: object) -> str:
    """JSON as the listings print it: ensure_ascii escapes every control and non-ASCII
    character (\\u001b, \\u202e), so no raw escape reaches a terminal."""
    return json.dumps(value, indent=2, sort_keys=False, ensure_ascii=True)


def size(value: int | None) -> str:
    return "-" if value is None else format_size(value)


def priority(job: Any) -> str:
    return f"{job.pending.priority:.0f}" if job.HasField("pending") else "-"


def factors(job: Any) -> str:
    """`1000+12+1500-0`: the QOS, age, fair-share and nice parts of the priority."""
    if not job.HasField("pending") or not job.pending.factors:
        return "-"
    values = {f.name: f.value for f in job.pending.factors}
    text = "+".join(f"{values.get(n, 0.0):.0f}" for n in ("qos", "age", "fairshare"))
    return f"{text}-{-values.get('nice', 0.0):.0f}"


def estimated_start(job: Any) -> str:
    if not job.HasField("pending") or not job.pending.HasField("estimated_start"):
        return "-"
    return when(job.pending.estimated_start)


# ---- GPU telemetry (issue 12): unknown is said, never shown as 0 -------------------------------

JOULES_PER_KWH = 3.6e6


def telemetry_dict(job: Any) -> dict[str, Any] | None:
    """The job's measured figures as JSON (None: nothing measured); unknown figures are null."""
    if not job.HasField("telemetry"):
        return None
    t = job.telemetry

    def known(owner: Any, name: str) -> float | None:
        return float(getattr(owner, name)) if owner.HasField(name) else None

    return {
        "peak_gpu_mem": t.peak_gpu_mem,
        "util_mean": known(t, "util_mean"),
        "util_p95": known(t, "util_p95"),
        "energy_joules": known(t, "energy"),
        "samples": t.samples,
        "seconds": t.seconds,
        "units": [
            {
                "uuid": u.uuid,
                "peak_mem": u.peak_mem,
                "util_mean": known(u, "util_mean"),
                "util_p95": known(u, "util_p95"),
                "energy_joules": known(u, "energy"),
            }
            for u in t.units
        ],
    }


def gib(value: float) -> str:
    """Bytes as GiB, without the unit: `31`, `1.5`, `0.2`."""
    n = value / 2**30
    return f"{n:.0f}" if n >= 10 else f"{n:.1f}"


def energy_text(joules: float) -> str:
    """`1.9 kWh`, `45 Wh`."""
    kwh = joules / JOULES_PER_KWH
    if kwh >= 10:
        return f"{kwh:.0f} kWh"
    if kwh >= 0.1:
        return f"{kwh:.1f} kWh"
    if kwh >= 0.01 or kwh == 0:
        return f"{kwh * 1000:.0f} Wh"
    return f"{kwh * 1000:.2f} Wh"  # a short job: 0.20 Wh, not "0 Wh"


def percent(value: float) -> str:
    return f"{value:.0f} %"


def efficiency_line(job: Any, capacity: int | None = None) -> str | None:
    """One line, as `seff` sums a job up: "used 31 of 80 GiB peak on 2 GPUs, mean SM busy
    12 %, 1.9 kWh". `capacity`: the memory of the job's GPUs together (None: unknown). None
    for a job that never started; unknown parts say so."""
    if not job.HasField("start_time") or job.state in ("pending", "held"):
        return None
    count = len(job.gpus) or job.spec.resources.gpus
    if not count:
        return None
    on = (
        f"1 MIG slice ({job.spec.resources.mig})"
        if job.spec.resources.mig
        else (f"{count} GPU" + ("s" if count != 1 else ""))
    )
    if not job.HasField("telemetry"):
        return f"unknown on {on} (nothing measured)"
    t = job.telemetry
    of = f"{gib(capacity)} GiB" if capacity else "unknown GiB"
    used = f"used {gib(t.peak_gpu_mem)} of {of} peak on {on}"
    busy = f"mean SM busy {percent(t.util_mean) if t.HasField('util_mean') else 'unknown'}"
    energy = energy_text(t.energy) if t.HasField("energy") else "energy unknown"
    return f"{used}, {busy}, {energy}"


def telemetry_cells(job: Any) -> tuple[str, str, str]:
    """Peak VRAM, mean utilisation and energy for a table: `31G`, `12%`, `1.9`; "-" where
    nothing was measured, "?" where that figure is unknown."""
    if not job.HasField("telemetry"):
        return "-", "-", "-"
    t = job.telemetry
    util = f"{t.util_mean:.0f}%" if t.HasField("util_mean") else "?"
    kwh = f"{t.energy / JOULES_PER_KWH:.1f}" if t.HasField("energy") else "?"
    return format_size(t.peak_gpu_mem), util, kwh


def flags_text(job: Any) -> str:
    """The coordinator's flags on a running job (idle, possibly hung), one line."""
    return "; ".join(printable(f) for f in job.flags)


def report_dict(row: Any) -> dict[str, Any]:
    """One user's row of `gpuq report --json`."""
    return {
        "user": row.user,
        "jobs": row.jobs,
        "gpu_hours": row.gpu_seconds / 3600,
        "energy_kwh": row.energy / JOULES_PER_KWH if row.HasField("energy") else None,
        "mean_util": row.util_mean if row.HasField("util_mean") else None,
        "measured_gpu_hours": row.util_gpu_seconds / 3600,
    }
