"""SLURM's output forms, pure: squeue's and sinfo's `%[.][width]code` formats, squeue's
`-O Name[:[.]width]` and sacct's `-o Name[%width]` field lists, how a field is padded and cut,
and SLURM's words for job states. Tools parse these outputs, so they follow SLURM, not gpuq's
own listings (which align columns to their widest value: SLURM pads only a field given a
width, and prints the others as they are)."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# gpuq's job states in SLURM's words: a held job is PENDING there (its reason says held)
LONG_STATE = {
    "pending": "PENDING",
    "held": "PENDING",
    "running": "RUNNING",
    "completed": "COMPLETED",
    "failed": "FAILED",
    "cancelled": "CANCELLED",
    "timeout": "TIMEOUT",
    "preempted": "PREEMPTED",
    "node_fail": "NODE_FAIL",
    "out_of_memory": "OUT_OF_MEMORY",
}
SHORT_STATE = {
    "pending": "PD",
    "held": "PD",
    "running": "R",
    "completed": "CD",
    "failed": "F",
    "cancelled": "CA",
    "timeout": "TO",
    "preempted": "PR",
    "node_fail": "NF",
    "out_of_memory": "OOM",
}
# SLURM's state names and codes that -t/--states and -s/--state take -> gpuq's states
STATE_WORDS: dict[str, tuple[str, ...]] = {
    "PENDING": ("pending", "held"),
    "PD": ("pending", "held"),
    "RUNNING": ("running",),
    "R": ("running",),
    "COMPLETED": ("completed",),
    "CD": ("completed",),
    "FAILED": ("failed",),
    "F": ("failed",),
    "CANCELLED": ("cancelled",),
    "CA": ("cancelled",),
    "TIMEOUT": ("timeout",),
    "TO": ("timeout",),
    "PREEMPTED": ("preempted",),
    "PR": ("preempted",),
    "NODE_FAIL": ("node_fail",),
    "NF": ("node_fail",),
    "OUT_OF_MEMORY": ("out_of_memory",),
    "OOM": ("out_of_memory",),
    # states gpuq never has: asking for them finds nothing, as it would on a quiet cluster
    **dict.fromkeys(("COMPLETING", "CG", "CONFIGURING", "CF", "SUSPENDED", "S"), ()),
    **dict.fromkeys(("REQUEUED", "RQ", "RESIZING", "RS", "BOOT_FAIL", "BF"), ()),
    **dict.fromkeys(("DEADLINE", "DL", "REVOKED", "RV", "SPECIAL_EXIT", "SE"), ()),
    **dict.fromkeys(("STOPPED", "ST", "SIGNALING", "SI", "STAGE_OUT", "SO"), ()),
    **dict.fromkeys(("RESV_DEL_HOLD", "RD", "REQUEUE_FED", "RF", "REQUEUE_HOLD", "RH"), ()),
}
ALL_STATES = tuple(LONG_STATE)


class FormatError(ValueError):
    """A format or field list SLURM's command would refuse too (its text is the one line)."""


def parse_states(texts: Sequence[str]) -> frozenset[str]:
    """`-t R,PD` / `--states=running,pending` / `all` -> gpuq's state names."""
    found: set[str] = set()
    for text in texts:
        for word in text.split(","):
            key = word.strip().upper()
            if key == "ALL":
                found.update(ALL_STATES)
            elif key in STATE_WORDS:
                found.update(STATE_WORDS[key])
            elif key:
                raise FormatError(f"Invalid job state specified: {word.strip()}")
    return frozenset(found)


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a format: its key (a %code, or a field name), its width (None: printed
    as it is) and whether it is right-justified. `suffix` is text after it (squeue -O)."""

    key: str
    width: int | None = None
    right: bool = False
    suffix: str = ""


_PERCENT = re.compile(r"%([.-]?)([0-9]*)([A-Za-z%])")
MAX_WIDTH = 1000  # a field's width at most: `%.99999999999i` would pad to 100 GB


def _width(digits: str) -> int | None:
    """A field's width as written ("" : none); FormatError past MAX_WIDTH."""
    if not digits:
        return None
    if len(digits) > 4 or int(digits) > MAX_WIDTH:
        raise FormatError(f"Invalid field width {digits}: at most {MAX_WIDTH}")
    return int(digits)


def parse_percent(
    text: str, known: Mapping[str, object], *, stray_percent: bool = True
) -> list[str | Field]:
    """squeue's or sinfo's `-o "%.18i %9P %j"` as literal text and fields (`known`: the
    codes). `.` right-justifies; a width pads and cuts to it. `stray_percent` False: a `%`
    that starts no field (`"50%"`) is refused rather than printed (`gpuq queue --format`)."""
    parts: list[str | Field] = []
    at = 0
    for match in _PERCENT.finditer(text):
        if match.start() > at:
            parts.append(text[at : match.start()])
        at = match.end()
        align, digits, code = match.groups()
        if code == "%":
            parts.append("%")
        elif code not in known:
            raise FormatError(f"Invalid format specification: %{code} is not supported by gpuq")
        else:
            parts.append(Field(code, _width(digits), align == "."))
    if at < len(text):
        if not stray_percent and "%" in text[at:]:
            raise FormatError(f"a % without a field code in {text[at:]!r}")
        parts.append(text[at:])
    return parts


_NAME_WIDTH = re.compile(r"(?P<name>[A-Za-z_-]+)(?P<rest>.*)")


def parse_names(
    text: str,
    known: Mapping[str, object],
    *,
    width_mark: str,
    default_width: Mapping[str, int] | int | None,
) -> list[Field]:
    """A comma list of field names, any case, each with an optional width: squeue's
    `-O JobID:.10,State` (`width_mark` ":", `.` right-justifies, text after the width is a
    suffix) or sacct's `-o JobID%20,State` (`%`). Keys come back as `known` spells them."""
    by_lower = {name.lower(): name for name in known}
    fields: list[Field] = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        match = _NAME_WIDTH.fullmatch(item)
        name = by_lower.get(match["name"].lower()) if match else None
        if match is None or name is None:
            raise FormatError(f"Invalid field requested: {item.partition(width_mark)[0]}")
        rest = match["rest"]
        width = _default(default_width, name)
        right = width_mark == "%"  # sacct right-justifies its columns
        suffix = ""
        if rest:
            if not rest.startswith(width_mark):
                raise FormatError(f"Invalid field requested: {item}")
            spec = re.fullmatch(r"(\.?)(-?[0-9]*)(.*)", rest[1:])
            assert spec is not None  # the pattern matches any text
            dot, digits, suffix = spec.groups()
            right = right or bool(dot)
            if digits.startswith("-"):  # sacct: a negative width left-justifies
                right, digits = False, digits[1:]
            width = _width(digits) if digits else width
            if width_mark == "%" and suffix:
                raise FormatError(f"Invalid field requested: {item}")
        fields.append(Field(name, width, right, suffix))
    if not fields:
        raise FormatError("no fields requested")
    return fields


def _default(widths: Mapping[str, int] | int | None, name: str) -> int | None:
    if widths is None or isinstance(widths, int):
        return widths
    return widths.get(name, 10)


def cell(text: str, field: Field, *, cut_mark: str = "") -> str:
    """One value as SLURM prints it in a field: as it is without a width, else cut to the
    width (sacct marks a cut with `+`) and padded, left or (`.`) right."""
    if field.width is None:
        return text + field.suffix
    if len(text) > field.width:
        text = text[: field.width - len(cut_mark)] + cut_mark if field.width else ""
    padded = text.rjust(field.width) if field.right else text.ljust(field.width)
    return padded + field.suffix


def percent_line(parts: Sequence[str | Field], values: Mapping[str, str]) -> str:
    """A line of a %-format: each field's value (`values` by code), literal text as given."""
    return "".join(p if isinstance(p, str) else cell(values[p.key], p) for p in parts)


def slurm_time(timestamp: float | None, missing: str = "Unknown") -> str:
    """A time as SLURM prints one: local, `2026-12-02T09:30:00`."""
    if timestamp is None:
        return missing
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(timestamp))


def slurm_duration(seconds: float | None, *, compact: bool = False) -> str:
    """sacct's Elapsed and Timelimit (`00:05:03`, `1-02:03:04`), or `compact`, squeue's
    TIME (`0:00`, `5:03`, `1:02:03`, `1-02:03:04`)."""
    total = max(0, int(seconds or 0))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    mins, secs = divmod(rest, 60)
    if days or not compact:
        clock = f"{hours:02d}:{mins:02d}:{secs:02d}"
    else:
        clock = f"{hours}:{mins:02d}:{secs:02d}" if hours else f"{mins}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def exit_code_text(exit_code: int | None, signal: int | None) -> str:
    """sacct's ExitCode: `code:signal` (`0:0`, `3:0`, `0:9`)."""
    return f"{exit_code or 0}:{signal or 0}"
