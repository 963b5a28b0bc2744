"""Tables and JSON for the listings; pure functions of wire messages and the current time."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuq.cli.progress_text import progress_dict
from gpuq.domain.limits import CONTROL_RE
from gpuq.domain.node_constraints import compress_nodes
from gpuq.domain.states import SHORT_STATE as STATE_CODES
from gpuq.domain.units import format_duration, format_size
from gpuq.slurm.formats import Field, FormatError, parse_percent  # squeue's %codes, as the shim's

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
        return node_text(job)
    return str(job.reason)


def node_text(job: Any) -> str:
    """Where a job runs (ran): its node, or a multi-node job's nodes in SLURM's compressed
    form (`gpu[01-02]`, the first where its script runs); "" before it started."""
    return compress_nodes(job.nodes) if job.nodes else str(job.node)


def node_count(res: Any) -> int:
    """Nodes a job asks for (0 on the wire, from an older gpuq, is one)."""
    return int(res.nodes) or 1


def total_gpus(res: Any) -> int:
    """GPUs over all of a job's nodes (its Resources say them per node)."""
    return int(res.gpus) * node_count(res)


def is_spread(res: Any) -> bool:
    """A job of several nodes or several tasks (or that asked for tasks): `gpuq show` says
    its layout; a one-node, one-task job prints as it always did."""
    return node_count(res) > 1 or (res.tasks_per_node or 1) > 1 or bool(res.explicit_tasks)


def layout_lines(job: Any) -> list[tuple[str, str]]:
    """`gpuq show`'s lines on a multi-node (or multi-task) job: its nodes, how many, and what
    each node gives it; [] for a one-node, one-task job."""
    res = job.spec.resources
    if not is_spread(res) and not res.exclusive and not res.mem_all:
        return []
    nodes, tasks = node_count(res), int(res.tasks_per_node) or 1
    lines: list[tuple[str, str]] = []
    if nodes > 1:
        where = f"{node_text(job)}, " if job.nodes else ""
        first = f"; the script runs on {job.nodes[0]}" if job.nodes else ""
        lines.append(("Nodes", f"{where}{nodes} nodes{first}"))
    per_task = f" ({res.gpus_per_task} per task)" if res.gpus_per_task else ""
    kind = f"{res.gpu_type} " if res.gpu_type else ""
    gpus = f"{res.gpus} {kind}GPUs{per_task}" + (
        f", {total_gpus(res)} in all" if nodes > 1 and res.gpus else ""
    )
    mem = (
        "all of its memory"
        if res.mem_all
        else f"mem {size(res.mem)}"
        if res.HasField("mem")
        else "mem -"
    )
    each = [
        f"{tasks} task"
        + ("s" if tasks != 1 else "")
        + (f" ({tasks * nodes} in all)" if nodes > 1 else ""),
        gpus,
        f"{res.cpus // tasks} CPUs per task ({res.cpus} in all)",
        mem,
    ]
    if res.exclusive:
        each.append("the whole node (exclusive)")
    lines.append(("Per node" if nodes > 1 else "Layout", ", ".join(each)))
    return lines


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
        "gpus": total_gpus(job.spec.resources),  # over all its nodes
        "mig": job.spec.resources.mig or None,
        "gpu_type": job.spec.resources.gpu_type or None,
        "placement": placement_dict(job.spec.placement),
        "partitions": list(job.spec.placement.partitions),
        "cpus": job.spec.resources.cpus,
        "mem": job.spec.resources.mem if job.spec.resources.HasField("mem") else None,
        "time_limit": job.spec.resources.time_limit
        if job.spec.resources.HasField("time_limit")
        else None,
        "node": job.node or None,
        "nodes": list(job.nodes) or ([job.node] if job.node else []),
        "num_nodes": node_count(job.spec.resources),
        "tasks_per_node": job.spec.resources.tasks_per_node or 1,
        "gpus_per_node": job.spec.resources.gpus,
        "gpus_per_task": job.spec.resources.gpus_per_task or None,
        "cpus_per_task": job.spec.resources.cpus // (job.spec.resources.tasks_per_node or 1),
        "exclusive": job.spec.resources.exclusive,
        "mem_all": job.spec.resources.mem_all,
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
        "progress": progress_dict(job),  # a running job's, for its owner and admins
        "flags": list(job.flags),
    }


def placement_dict(placement: Any) -> dict[str, Any] | None:
    """A job's --nodelist, --exclude, --constraint and partitions (None: anywhere)."""
    given = (placement.nodelist, placement.exclude, placement.constraint, placement.partitions)
    if not any(given):
        return None
    return {
        "nodelist": list(placement.nodelist),
        "exclude": list(placement.exclude),
        "constraint": placement.constraint or None,
        "partitions": list(placement.partitions),
    }


def partition_text(job: Any) -> str:
    """A job's partitions as squeue's PARTITION shows them: `debug`, `debug,gpu`, `-`."""
    return ",".join(job.spec.placement.partitions) or "-"


def placement_text(placement: Any) -> str:
    """ "partition gpu; nodelist n1,n2; exclude n3; constraint nvlink&ib", or "anywhere"."""
    parts = []
    if placement.partitions:
        parts.append("partition " + ",".join(placement.partitions))
    if placement.nodelist:
        parts.append("nodelist " + ",".join(placement.nodelist))
    if placement.exclude:
        parts.append("exclude " + ",".join(placement.exclude))
    if placement.constraint:
        parts.append("constraint " + placement.constraint)
    return "; ".join(parts) or "anywhere"


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
    count = len(job.gpus) or total_gpus(job.spec.resources)
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


# ---- colour, column layout and --format (issue 13): pure, decided by the caller ----------------

STATE_COLOUR = {  # SGR codes: pending yellow, running green, endings that went wrong red
    "pending": "33",
    "held": "36",
    "running": "32",
    "completed": "",
    "failed": "31",
    "timeout": "31",
    "out_of_memory": "31",
    "node_fail": "31",
    "cancelled": "35",
    "preempted": "35",
}
COLOUR_MODES = ("auto", "always", "never")


def wants_colour(mode: str, stream: Any, environ: Any) -> bool:
    """Colour for states: never with NO_COLOR set to anything but "" (no-color.org) unless
    asked with --color=always, never when `stream` is not a terminal (piped, redirected) or
    TERM=dumb. Decided when a command runs, from the stream it writes to (a forked helper
    may hold the user's terminal on fds it did not have when it started)."""
    if mode == "always":
        return True
    if mode == "never" or environ.get("NO_COLOR", ""):
        return False
    if environ.get("TERM") == "dumb":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def paint(text: str, state: str, colour: bool) -> str:
    """`text` (already padded, so colour never moves a column) in its state's colour."""
    code = STATE_COLOUR.get(state, "") if colour else ""
    return f"\x1b[{code}m{text}\x1b[0m" if code else text


def output_width(stream: Any, environ: Any) -> int | None:
    """The width to fit: COLUMNS when set, else the terminal's; None (nothing cut) when
    the output goes to a file or a pipe, where a script reads whole values."""
    given = environ.get("COLUMNS", "")
    if given.isdigit() and 20 <= int(given) <= 10_000:
        return int(given)
    try:
        if stream.isatty():
            import os

            return max(20, os.get_terminal_size(stream.fileno()).columns)
    except (AttributeError, ValueError, OSError):
        pass
    return None


def clip(text: str, width: int, ellipsis: str = "…") -> str:
    """`text` cut to `width` characters, the last one an ellipsis when anything was cut."""
    if len(text) <= width:
        return text
    return text[: max(0, width - len(ellipsis))] + ellipsis[:width]


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a listing: `shrink` the narrowest it may be cut to (None: never cut),
    `drop` its rank among columns left out when even cut ones do not fit (0: never; the
    highest goes first), `state` its cells coloured by the row's state."""

    header: str
    right: bool = False
    shrink: int | None = None
    drop: int = 0
    state: bool = False


SOFT_FLOOR = 16  # a cut column keeps this much while other columns can still be left out
LAST_COLUMN_FLOOR = 24  # the last column (a reason) likewise; cut further only when no fit


def fit_widths(columns: Sequence[Column], natural: Sequence[int], width: int | None) -> list[int]:
    """Each column's width (0: left out) so that a line fits `width` with two spaces
    between columns. First the cut columns (`shrink`, and always the last one) are cut
    to a soft floor, the rightmost first; while that does not fit, columns with `drop`
    leave (highest first); then cut columns go down to their hard floor (`shrink`; the
    last column's header). A table that cannot fit is as narrow as it can be."""
    widths = list(natural)
    if width is None or not widths:
        return widths
    last = len(columns) - 1

    def hard(i: int) -> int | None:
        if i == last and columns[i].shrink is None:
            return len(columns[i].header)
        return columns[i].shrink

    def soft(i: int) -> int | None:
        least = hard(i)
        if least is None:
            return None
        return max(least, LAST_COLUMN_FLOOR if i == last else SOFT_FLOOR)

    def total(ws: Sequence[int]) -> int:
        shown = [w for w in ws if w]
        return sum(shown) + 2 * (len(shown) - 1)

    def cut(ws: list[int], floor: Callable[[int], int | None]) -> list[int]:
        for i in reversed(range(len(ws))):
            over, least = total(ws) - width, floor(i)
            if over <= 0:
                break
            if least is not None and ws[i] > least:
                ws[i] = max(least, ws[i] - over)
        return ws

    droppable = sorted((c.drop, i) for i, c in enumerate(columns) if c.drop)
    while total(cut(list(widths), soft)) > width and droppable:
        widths[droppable.pop()[1]] = 0
    return cut(cut(widths, soft), hard)


def layout(
    columns: Sequence[Column],
    rows: Sequence[Sequence[object]],
    width: int | None,
    *,
    states: Sequence[str] = (),
    colour: bool = False,
    header: bool = True,
    ellipsis: str = "…",
) -> list[str]:
    """The table's lines fitted to `width` (see fit_widths): every cell through printable(),
    long cells cut with an ellipsis, padded, then coloured (alignment never moves)."""
    cells = [[printable(c) for c in row] for row in rows]
    natural = [max([len(c.header)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    widths = fit_widths(columns, natural, width)
    shown = [i for i, w in enumerate(widths) if w]
    last = shown[-1] if shown else -1

    def line(values: Sequence[str], state: str | None) -> str:
        parts = []
        for i in shown:
            col, w = columns[i], widths[i]
            text = clip(values[i], w, ellipsis)
            padded = text.rjust(w) if col.right else text if i == last else text.ljust(w)
            parts.append(paint(padded, state, colour) if col.state and state else padded)
        return "  ".join(parts).rstrip()

    lines = [line([c.header for c in columns], None)] if header else []
    for n, row in enumerate(cells):
        lines.append(line(row, states[n] if n < len(states) else None))
    return lines


# squeue's --format: %[.|-][width]code; `.` right-justifies, `-` (or nothing) left-justifies
FORMAT_CODES = {
    "i": ("JOBID", "the job id (40_3, or 40_[3-99%8] for an array's waiting tasks)"),
    "A": ("JOBID", "the job's own number"),
    "F": ("ARRAY_JOB_ID", "the array's id"),
    "K": ("ARRAY_TASK_ID", "the array task's index"),
    "j": ("NAME", "the job name"),
    "u": ("USER", "the user"),
    "t": ("ST", "the state, short (PD, R, CD...)"),
    "T": ("STATE", "the state, long (PENDING, RUNNING...)"),
    "M": ("TIME", "time used"),
    "l": ("TIME_LIMIT", "the time limit"),
    "D": ("NODES", "how many nodes (1)"),
    "N": ("NODELIST", "the node"),
    "b": ("TRES_PER_NODE", "GPUs asked for: gpu:2, gpu:a100:2, mig:3g.40gb"),
    "r": ("REASON", "why it waits, or how it ended"),
    "R": ("NODELIST(REASON)", "the node when running, else the reason"),
    "V": ("SUBMIT_TIME", "when submitted"),
    "S": ("START_TIME", "when started (or the estimated start)"),
    "e": ("END_TIME", "when ended"),
    "Q": ("PRIORITY", "the priority"),
    "q": ("QOS", "the QOS"),
    "P": ("PARTITION", "the partition(s)"),
    "C": ("CPUS", "CPUs"),
    "m": ("MIN_MEMORY", "host memory"),
}


def parse_format(text: str) -> list[str | Field]:
    """A --format string as literal text and fields: `%.10i %-20j %t` (squeue's codes,
    FORMAT_CODES; `%%` is a percent sign), read as the squeue shim reads its -o
    (gpuq.slurm.formats). ValueError names an unknown code or a width past 1000."""
    try:
        return parse_percent(text, FORMAT_CODES, stray_percent=False)
    except FormatError as exc:
        raise ValueError(f"{exc}; known: " + " ".join(FORMAT_CODES)) from None


def _stamp(message: Any, field: str) -> str:
    """A time as squeue shows it (2026-11-30T19:33:00), "-" when not set."""
    try:
        given = message.HasField(field)
    except ValueError:  # a field without presence (submit_time): 0 is unset
        given = bool(getattr(message, field))
    return when(getattr(message, field) if given else None).replace(" ", "T")


def gres(job: Any) -> str:
    """What the job asked of GPUs, as squeue's %b: `gpu:2`, `gpu:a100:2`, `mig:3g.40gb`."""
    res = job.spec.resources
    if res.mig:
        return f"mig:{res.mig}"
    if not res.gpus:
        return "-"
    return f"gpu:{res.gpu_type}:{res.gpus}" if res.gpu_type else f"gpu:{res.gpus}"


def field_value(job: Any, code: str, now: float) -> str:
    """The text of one --format field for `job` (not yet escaped: layout escapes)."""
    res = job.spec.resources
    pending = job.state in ("pending", "held")
    values: dict[str, Callable[[], object]] = {
        "i": lambda: job_id_text(job),
        "A": lambda: str(job.id),
        "F": lambda: str(job.array_job_id) if job.HasField("array_job_id") else "-",
        "K": lambda: str(job.array_task_id) if job.HasField("array_task_id") else "-",
        "j": lambda: job.spec.name,
        "u": lambda: job.user,
        "t": lambda: SHORT_STATE.get(job.state, job.state),
        "T": lambda: job.state.upper(),
        "M": lambda: "0:00" if elapsed(job, now) == "-" else elapsed(job, now),
        "l": lambda: format_duration(res.time_limit) if res.HasField("time_limit") else "UNLIMITED",
        "D": lambda: str(node_count(res)),
        "N": lambda: "" if pending else node_text(job),
        "b": lambda: gres(job),
        "r": lambda: job_reason(job) if pending else (job.reason or "None"),
        "R": lambda: f"({job_reason(job)})" if pending else job_reason(job),
        "V": lambda: _stamp(job, "submit_time"),
        "S": lambda: (
            _stamp(job.pending, "estimated_start")
            if pending and job.HasField("pending")
            else _stamp(job, "start_time")
        ),
        "e": lambda: _stamp(job, "end_time"),
        "Q": lambda: priority(job) if job.HasField("pending") else str(job.priority),
        "q": lambda: job.qos,
        "P": lambda: partition_text(job),
        "C": lambda: str(res.cpus * node_count(res)),
        "m": lambda: size(res.mem if res.HasField("mem") else None),
    }
    return str(values[code]())


def format_lines(
    parts: Sequence[str | Field],
    jobs: Sequence[Any],
    now: float,
    *,
    colour: bool = False,
    header: bool = True,
) -> list[str]:
    """Jobs as a --format asks: a field with a width is cut or padded to it (as squeue);
    one without takes its column's longest value; the state fields are coloured after
    padding. Literal text is printed as given (escaped)."""
    fields = [p for p in parts if isinstance(p, Field)]
    values = [[printable(field_value(j, f.key, now)) for f in fields] for j in jobs]
    heads = [FORMAT_CODES[f.key][0] for f in fields]
    widths = [
        f.width
        if f.width is not None
        else max([len(heads[k]) if header else 0] + [len(row[k]) for row in values])
        for k, f in enumerate(fields)
    ]
    last_field = len(parts) - 1 if parts and isinstance(parts[-1], Field) else -1

    def line(cells: Sequence[str], state: str | None) -> str:
        out, k = [], 0
        for n, part in enumerate(parts):
            if isinstance(part, str):
                out.append(printable(part))
                continue
            text, w = cells[k][: widths[k]] if widths[k] else cells[k], widths[k]
            padded = (
                text.rjust(w)
                if part.right
                else text
                if n == last_field and part.width is None
                else text.ljust(w)
            )
            out.append(paint(padded, state, colour) if state and part.key in "tT" else padded)
            k += 1
        return "".join(out)

    lines = [line(heads, None)] if header else []
    lines += [line(row, j.state) for row, j in zip(values, jobs, strict=True)]
    return lines
