"""Submit-option text that needs more than a unit: `--begin` times, `--after` lists, `--env`.

Pure, and in the core so that the command line's flags (gpuq.submission) and a script's
directives (gpuq.directives) read them the same way, with the same InvalidInput; the one
Dependency they name is parsed by gpuq.domain.dependencies.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import Any

from gpuq.domain.dependencies import Dependency
from gpuq.domain.limits import BEGIN_MAX_AHEAD, MAX_DEPENDENCIES, MAX_ENV_BYTES, brief
from gpuq.errors import InvalidInput

_BEGIN_UNITS = {
    **dict.fromkeys(("", "s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
    **dict.fromkeys(("w", "week", "weeks"), 7 * 86400),
}
_NAMED_TIMES = {"midnight": 0, "elevenses": 11, "noon": 12, "fika": 15, "teatime": 16}
_BEGIN_FORMS = (
    "expected now, now+N[s|m|h|d|w], today, tomorrow, HH:MM[:SS], 2026-12-01 or "
    "2026-12-01T09:00[+02:00]"
)


def parse_begin(text: str, now: float | None = None) -> float:
    """SLURM's --begin forms: `now`, `now+90` (seconds), `now+30m`, `now+2hours`, `now+1w`;
    `today`, `tomorrow` (midnight); `16:00[:00]`, `4:00pm`, `noon`, `teatime` (the next such
    time); an ISO date or date-time, with or without a UTC offset. At most a year (366 days)
    ahead: further is surely a typo, and the queue should not carry it."""
    raw = text.strip() if isinstance(text, str) and len(text) <= 64 else None
    if not raw:
        if isinstance(text, str) and re.match(r"\s*now\s*\+\s*[0-9]{13}", text, re.IGNORECASE):
            raise InvalidInput("--begin", f"{text[:40]}... ({len(text)} characters)", _too_far())
        raise InvalidInput("--begin", str(text)[:60], _BEGIN_FORMS)
    lower = raw.lower()
    current = dt.datetime.now() if now is None else dt.datetime.fromtimestamp(now)
    base = current.timestamp()
    moment: float
    if match := re.fullmatch(r"now(?:\s*\+\s*([0-9]+)\s*([a-z]*))?", lower):
        unit = _BEGIN_UNITS.get(match[2] or "")
        if unit is None:
            raise InvalidInput("--begin", text, f"unknown unit {match[2]!r}: use s, m, h, d or w")
        amount = match[1] or "0"
        digits = amount.lstrip("0")
        if len(digits) > 12 or int(amount) * unit > BEGIN_MAX_AHEAD:
            raise InvalidInput("--begin", text, _too_far())
        moment = base + int(amount) * unit
    elif lower in ("today", "tomorrow"):
        day = current.date() + dt.timedelta(days=1 if lower == "tomorrow" else 0)
        moment = dt.datetime.combine(day, dt.time()).timestamp()
    elif lower in _NAMED_TIMES or re.fullmatch(
        r"[0-9]{1,2}:[0-9]{2}(:[0-9]{2})?\s*([ap]m)?", lower
    ):
        moment = _next_clock(lower, text, current)
    else:
        try:
            parsed = dt.datetime.fromisoformat(raw)
            moment = parsed.timestamp()
        except (ValueError, OverflowError, OSError):
            raise InvalidInput("--begin", text, _BEGIN_FORMS) from None
    if moment < 0:
        raise InvalidInput("--begin", text, "is before 1970")
    if moment > base + BEGIN_MAX_AHEAD:
        raise InvalidInput("--begin", text, _too_far())
    return moment


def _too_far() -> str:
    return "is more than a year (366 days) ahead; a typo?"


def _next_clock(lower: str, text: str, current: dt.datetime) -> float:
    if lower in _NAMED_TIMES:
        clock = dt.time(_NAMED_TIMES[lower])
    else:
        digits, meridiem = lower[:-2].strip() if lower.endswith("m") else lower, lower[-2:]
        hour, minute, *second = (int(part) for part in digits.split(":"))
        if lower.endswith("m"):
            if not 1 <= hour <= 12:
                raise InvalidInput("--begin", text, "with am/pm the hour goes from 1 to 12")
            hour = hour % 12 + (12 if meridiem == "pm" else 0)
        try:
            clock = dt.time(hour, minute, second[0] if second else 0)
        except ValueError:
            raise InvalidInput("--begin", text, "not a time of day") from None
    moment = dt.datetime.combine(current.date(), clock)
    if moment <= current:
        moment += dt.timedelta(days=1)
    return moment.timestamp()


def parse_dependencies(text: str) -> tuple[tuple[Dependency, ...], bool]:
    """gpuq's `JOB[:ok|any|notok]` (JOB is `40` or `40_3`) or SLURM's list
    `afterok:12:13,afterany:14_2,singleton`: the dependencies, and whether `singleton` was
    among them. Start-based `after:`, `aftercorr` and `?` (any of) are refused, saying what
    is supported."""
    raw = text.strip() if isinstance(text, str) else str(text)
    if len(raw) > 65536:
        raise InvalidInput("--after", brief(raw), f"more than {MAX_DEPENDENCIES} dependencies")
    found: dict[Dependency, None] = {}
    singleton = False
    try:
        for item in raw.split(","):
            word, colon, rest = item.strip().partition(":")
            kind = word.lower()
            if kind == "singleton" and not colon:
                singleton = True
            elif kind in ("afterok", "afterany", "afternotok") and colon:
                for job in rest.split(":"):
                    found[Dependency.parse(f"{kind}:{job}")] = None
            else:
                found[Dependency.parse(item)] = None
            if len(found) > MAX_DEPENDENCIES:
                raise InvalidInput(
                    "--after", brief(raw), f"more than {MAX_DEPENDENCIES} dependencies"
                )
    except InvalidInput as exc:
        raise InvalidInput("--after", brief(raw), exc.problem) from None
    return tuple(found), singleton


def collect_dependencies(values: Sequence[Any]) -> tuple[tuple[Dependency, ...], bool]:
    """The merged `--after` values (text as typed, or Dependency), as one list without
    repeats, and whether `singleton` was among them."""
    found: dict[Dependency, None] = {}
    singleton = False
    for value in values:
        if isinstance(value, Dependency):
            found[value] = None
            continue
        dependencies, alone = parse_dependencies(str(value))
        found.update(dict.fromkeys(dependencies))
        singleton = singleton or alone
    return tuple(found), singleton


_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def submit_environment(carried: dict[str, str], assignments: Sequence[Any]) -> dict[str, str]:
    """The job's environment: the submitter's (names without `=` or NUL, text that can travel:
    the others are dropped, as they cannot be passed on), then `--env K=V` on top."""
    env = {k: v for k, v in carried.items() if _carryable(k, v)}
    for item in assignments:
        key, sep, value = str(item).partition("=")
        if not sep or not key:
            raise InvalidInput("--env", brief(str(item)), "expected K=V")
        if not _ENV_NAME_RE.fullmatch(key):
            raise InvalidInput(
                "--env",
                brief(str(item)),
                "the name must be letters, digits and _, not starting with a digit",
            )
        if "\0" in value:
            raise InvalidInput("--env", brief(key), "the value contains a NUL byte")
        env[key] = value
    size = sum(len(k) + len(v) + 2 for k, v in env.items())
    if size > MAX_ENV_BYTES:
        raise InvalidInput(
            "--env",
            f"{len(env)} variables, {size} bytes",
            "the job's environment (yours, carried over, and --env) is larger than 1 MiB; "
            "unset large variables, or use --export NONE",
        )
    return env


def _carryable(key: str, value: str) -> bool:
    if not key or "=" in key or "\0" in key or "\0" in value:
        return False
    if key.isascii() and value.isascii():
        return True
    try:
        key.encode()
        value.encode()
    except UnicodeEncodeError:  # bytes that are not UTF-8 (os.environ's surrogates)
        return False
    return True
