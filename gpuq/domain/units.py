"""Sizes and durations as SLURM users write them.

Sizes: K/M/G/T/P are powers of 1024 (SLURM's meaning), with or without a trailing B or iB;
a bare number is megabytes, as with `sbatch --mem`. Durations: SLURM's forms `MM`, `MM:SS`,
`HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`. Both raise InvalidInput naming the field.
"""

from __future__ import annotations

import re
from decimal import Decimal, localcontext

from gpuq.domain.limits import MAX_TIME_LIMIT
from gpuq.errors import InvalidInput

_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*([kmgtp]?)(i?b)?\s*", re.IGNORECASE)
_POWERS = {"": 2, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}  # bare number = MiB
_SIZE_SUFFIXES = ("K", "M", "G", "T", "P")
MAX_SIZE = 2**60  # 1024P: beyond any machine; larger numbers are typos
_MAX_TEXT = 64  # a size or a duration longer than this is not one


def parse_size(text: str, field: str = "size") -> int:
    """Bytes in `text` (e.g. `40G`, `512M`, `1.5T`, `40GiB`, `2048` = 2048 MiB), at most
    1024P. Only plain decimals: no signs, exponents, `nan` or `inf`."""
    match = _SIZE_RE.fullmatch(text) if isinstance(text, str) and len(text) <= _MAX_TEXT else None
    if match is None:
        raise InvalidInput(field, _brief(text), "expected a size such as 512M, 40G or 1.5T")
    number, unit, suffix = match.groups()
    if suffix and not unit and suffix.lower() == "b":
        # a plain "B" means bytes
        power = 0
    elif suffix and not unit:
        raise InvalidInput(field, text, "expected a size such as 512M, 40G or 1.5T")
    else:
        power = _POWERS[unit.lower()]
    with localcontext() as exact:
        exact.prec = 2 * _MAX_TEXT  # every digit the regex lets through, times 1024**5, exactly
        value = Decimal(number) * (1024**power)
    if value <= 0:
        raise InvalidInput(field, text, "must be greater than zero")
    if value > MAX_SIZE:
        raise InvalidInput(field, text, "is more than 1024P")
    if value != value.to_integral_value():
        raise InvalidInput(field, text, "is not a whole number of bytes")
    return int(value)


def format_size(size: int) -> str:
    """The shortest exact-ish form: 42949672960 -> '40G', 1649267441664 -> '1.5T'."""
    value = float(size)
    for suffix in ("", *_SIZE_SUFFIXES):
        if value < 1024 or suffix == _SIZE_SUFFIXES[-1]:
            text = f"{value:.1f}".rstrip("0").rstrip(".")
            return f"{text}{suffix or 'B'}"
        value /= 1024
    raise AssertionError("unreachable")


_DAYS_RE = re.compile(r"([0-9]{1,12})-([0-9]{1,12})(?::([0-9]{1,12}))?(?::([0-9]{1,12}))?")
_CLOCK_RE = re.compile(r"([0-9]{1,12})(?::([0-9]{1,12}))?(?::([0-9]{1,12}))?")


def parse_duration(text: str, field: str = "time") -> int:
    """Seconds in a SLURM time limit: `90` (minutes), `90:00`, `2:00:00`, `1-00:00:00`, `1-12`.

    ASCII digits only, at most 12 in a field (so never a giant number); the caller bounds the
    total (a JobSpec takes at most 366 days)."""
    raw = text.strip() if isinstance(text, str) and len(text) <= _MAX_TEXT else ""
    if match := _DAYS_RE.fullmatch(raw):
        days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
        _check_below(
            field, text, [(hours, 24, "hours"), (minutes, 60, "minutes"), (seconds, 60, "seconds")]
        )
        total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    elif match := _CLOCK_RE.fullmatch(raw):
        parts = [int(g) for g in match.groups() if g is not None]
        if len(parts) == 1:
            total = parts[0] * 60
        elif len(parts) == 2:
            _check_below(field, text, [(parts[1], 60, "seconds")])
            total = parts[0] * 60 + parts[1]
        else:
            _check_below(field, text, [(parts[1], 60, "minutes"), (parts[2], 60, "seconds")])
            total = (parts[0] * 60 + parts[1]) * 60 + parts[2]
    else:
        raise InvalidInput(
            field, _brief(text), "expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
        )
    if total <= 0:
        raise InvalidInput(field, text, "must be longer than zero")
    return total


def parse_time_limit(text: str, field: str = "--time") -> int:
    """Seconds in a time limit as sbatch reads it: a duration (parse_duration's forms; `0:05`
    is minutes:seconds) rounded up to whole minutes, since SLURM's limits are whole minutes
    (`0:05` and `1` are 60, `1:30` is 120). Over 366 days is refused here, naming the text
    as written (the JobSpec's own check could show only the seconds it became)."""
    seconds = -(-parse_duration(text, field) // 60) * 60
    if seconds > MAX_TIME_LIMIT:
        raise InvalidInput(field, _brief(text), "must be from 1 second to 366 days")
    return seconds


def _check_below(field: str, text: str, limits: list[tuple[int, int, str]]) -> None:
    for value, limit, name in limits:
        if value >= limit:
            raise InvalidInput(field, text, f"{name} must be below {limit}")


def _brief(text: object) -> object:
    """`text` as an error may show it (one short line)."""
    return (
        f"{text[:60]}... ({len(text)} characters)"
        if isinstance(text, str) and len(text) > 80
        else text
    )


def format_duration(seconds: float) -> str:
    """SLURM's display form: `1-02:03:04`, or `02:03:04` under a day."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock
