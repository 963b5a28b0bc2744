"""From what a user typed (flags, `#GPUQ` and `#SBATCH` directives, a script file) to a JobSpec.

One table, OPTIONS, names every submit option; the CLI builds its flags from it and the
directive parser reads script headers with it, so `--gpus 2` means the same in both places.
Like sbatch: directives come from the comment block at the top of the script, and a flag on the
command line overrides the same directive. `#SBATCH` lines are read too, for the options gpuq
shares with sbatch; `#GPUQ` lines win over them, and every `#SBATCH` option gpuq does not use
is a warning, never silence and never an error.

Every value is bounded here and again by the dataclasses (gpuq.domain.model), which also check
what arrives over gRPC: one InvalidInput naming the option, never another exception.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
import warnings as _warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuq.domain.model import (
    MAX_DEPENDENCIES,
    MAX_ENV_BYTES,
    MAX_SCRIPT_BYTES,
    ArraySpec,
    Dependency,
    JobSpec,
    Resources,
    WarningSignal,
    check_name,
)
from gpuq.domain.units import parse_duration, parse_size
from gpuq.errors import InvalidInput

DIRECTIVE = "#GPUQ"
SBATCH = "#SBATCH"
BEGIN_MAX_AHEAD = 366 * 86400  # --begin further ahead than this is surely a typo


class SubmitWarning(UserWarning):
    """Something in a submission that gpuq does not use (e.g. `#SBATCH --partition`); given to
    the `warnings` list of build_spec, or issued with warnings.warn when there is none."""


@dataclass(frozen=True, slots=True)
class Option:
    name: str  # the keyword of build_spec
    flags: tuple[str, ...]
    help: str
    metavar: str = ""
    multiple: bool = False
    is_flag: bool = False


OPTIONS: tuple[Option, ...] = (
    Option("gpus", ("--gpus", "-G"), "whole GPUs for the job", "N"),
    Option("gpu_mem", ("--gpu-mem",), "least memory each GPU must have, e.g. 40G", "SIZE"),
    Option("cpus", ("--cpus", "-c"), "CPU cores (sets OMP_NUM_THREADS)", "N"),
    Option("mem", ("--mem",), "host memory for the whole job, e.g. 40G (bare number: MB)", "SIZE"),
    Option("time", ("--time", "-t"), "time limit: MM, HH:MM:SS, D-HH[:MM[:SS]]", "TIME"),
    Option("name", ("--name", "-J"), "job name (default: the script's file name)", "NAME"),
    Option(
        "output", ("--output", "-o"), "stdout file; %j %A %a %x %u %N (default gpuq-%j.out)", "PATH"
    ),
    Option("error", ("--error", "-e"), "stderr file (default: into the output file)", "PATH"),
    Option("qos", ("--qos", "-q"), "QOS tier, e.g. high, normal, low", "QOS"),
    Option(
        "after",
        ("--after", "-d"),
        "start after JOB[:ok|any|notok], or afterok:JOB[:JOB...] (repeatable)",
        "DEP",
        multiple=True,
    ),
    Option("array", ("--array", "-a"), "array tasks, e.g. 0-99%8", "SPEC"),
    Option(
        "env", ("--env",), "set K=V in the job's environment (repeatable)", "K=V", multiple=True
    ),
    Option(
        "export",
        ("--export",),
        "ALL (default): carry your environment into the job; NONE: only --env",
        "ALL|NONE",
    ),
    Option("hold", ("--hold", "-H"), "submit held (gpuq release starts it)", is_flag=True),
    Option("nice", ("--nice",), "lower the job's priority by N", "N"),
    Option("begin", ("--begin", "-b"), "not before: 16:00, now+1h, 2026-12-01T09:00", "TIME"),
    Option("signal", ("--signal",), "warning signal SIG[@SECONDS] before a stop", "SIG@S"),
    Option("no_requeue", ("--no-requeue",), "do not requeue after a preemption", is_flag=True),
    Option("singleton", ("--singleton",), "one running job per user and name", is_flag=True),
    Option("chdir", ("--chdir", "-D"), "working folder (default: the current one)", "DIR"),
)
_BY_FLAG = {flag: option for option in OPTIONS for flag in option.flags}
_BY_NAME = {option.name: option for option in OPTIONS}
# the long flags of `gpuq submit`: after the script they are the script's arguments (warned)
SUBMIT_LONG_FLAGS = frozenset(
    {flag for option in OPTIONS for flag in option.flags if flag.startswith("--")}
    | {"--wrap", "--wait", "--parsable"}
)
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def build_spec(
    script: str | None = None,
    args: Sequence[str] = (),
    *,
    wrap: str | None = None,
    environ: Mapping[str, str] | None = None,
    now: float | None = None,
    warnings: list[str] | None = None,
    **options: Any,
) -> JobSpec:
    """A validated JobSpec; raises InvalidInput naming the option for anything wrong.

    `options` are OPTIONS by name (strings as typed, or typed values). The submitter's
    environment is carried into the job (sbatch's --export=ALL), `env` entries on top, and
    the submitter's umask is recorded. What gpuq does not use (an `#SBATCH --partition`, a GPU
    type) is appended to `warnings`, one line each; without a list each is issued as a
    SubmitWarning.
    """
    notes: list[str] = [] if warnings is None else warnings
    first = len(notes)
    spec = _build(script, args, wrap, environ, now, notes, options)
    if warnings is None:
        for note in notes[first:]:
            _warnings.warn(note, SubmitWarning, stacklevel=2)
    return spec


def _build(
    script: str | None,
    args: Sequence[str],
    wrap: str | None,
    environ: Mapping[str, str] | None,
    now: float | None,
    notes: list[str],
    options: dict[str, Any],
) -> JobSpec:
    unknown = set(options) - set(_BY_NAME)
    if unknown:
        raise InvalidInput("option", sorted(unknown)[0], "unknown submit option")
    if (script is None) == (wrap is None):
        raise InvalidInput(
            "script", _brief(str(script or wrap or "")), "give a script or --wrap, not both"
        )
    if wrap is not None:
        if not isinstance(wrap, str):
            raise InvalidInput("--wrap", str(wrap)[:60], "must be a command (text)")
        text, source = f"#!/bin/sh\n{wrap}\n", "--wrap"
        default_name = "wrap"
    else:
        assert script is not None
        text = read_script(script)
        source, default_name = _script_path(script), Path(script).name
    header = _Header(text, notes)
    merged = merge(merge(header.sbatch, header.gpuq), options)
    origins = {**header.sbatch_origins, **header.gpuq_origins}
    for name, value in options.items():
        if value is not None and value is not False and value != ():
            origins.pop(name, None)
    try:
        return _spec(text, source, default_name, args, merged, environ, now, notes)
    except InvalidInput as exc:
        # a bad value from a directive: say which line it came from
        option = _BY_FLAG.get((exc.field.split() or [""])[0])
        origin = origins.get(option.name) if option is not None else None
        if origin is None:
            raise
        raise InvalidInput(f"{exc.field} ({origin})", exc.value, exc.problem) from None


def _spec(
    text: str,
    source: str,
    default_name: str,
    args: Sequence[str],
    merged: dict[str, Any],
    environ: Mapping[str, str] | None,
    now: float | None,
    notes: list[str],
) -> JobSpec:
    dependencies, singleton = _dependencies(merged.get("after", ()))
    carry_all, exported = _export(merged.get("export"))
    env = _environment(
        dict(os.environ if environ is None else environ) if carry_all else {},
        [*exported, *merged.get("env", ())],
    )
    return JobSpec(
        name=check_name(_text(merged, "name") or _safe_name(default_name)),
        script=text,
        workdir=_workdir(_text(merged, "chdir")),
        args=tuple(args),
        env=env,
        resources=Resources(
            gpus=_int(merged, "gpus", "--gpus", 0),
            gpu_mem=_size(merged, "gpu_mem", "--gpu-mem"),
            cpus=_int(merged, "cpus", "--cpus", 1),
            mem=_size(merged, "mem", "--mem"),
            time_limit=_duration(merged, "time", "--time"),
        ),
        qos=_text(merged, "qos"),
        nice=_int(merged, "nice", "--nice", 0),
        output=_text(merged, "output"),
        error=_text(merged, "error"),
        array=_array(merged.get("array")),
        dependencies=dependencies,
        hold=bool(merged.get("hold")),
        begin_time=_begin(merged.get("begin"), now),
        signal=_signal(merged.get("signal"), notes),
        requeue=not merged.get("no_requeue"),
        singleton=bool(merged.get("singleton")) or singleton,
        source=source,
        umask=current_umask(),
    )


def read_script(path: str) -> str:
    """The script's text: UTF-8, at most 4 MiB, Unix line ends (sbatch refuses CRLF too)."""
    try:
        with Path(path).open("rb") as file:
            data = file.read(MAX_SCRIPT_BYTES + 1)  # never more, whatever the file is
    except FileNotFoundError:
        raise InvalidInput("script", _brief(path), "no such file") from None
    except IsADirectoryError:
        raise InvalidInput("script", _brief(path), "is a folder, not a script") from None
    except PermissionError:
        raise InvalidInput("script", _brief(path), "cannot read it: permission denied") from None
    except OSError as exc:
        raise InvalidInput("script", _brief(path), f"cannot read it: {exc.strerror}") from None
    except ValueError:  # a NUL in the path
        raise InvalidInput("script", _brief(path.replace("\0", "\\0")), "not a file name") from None
    if len(data) > MAX_SCRIPT_BYTES:
        raise InvalidInput("script", _brief(path), "is larger than 4 MiB; is it really a script?")
    if b"\r\n" in data:
        raise InvalidInput("script", _brief(path), "has DOS line ends (CRLF); run dos2unix on it")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise InvalidInput("script", _brief(path), "is not text (a binary? use --wrap)") from None


def _script_path(script: str) -> str:
    try:
        return str(Path(script).absolute())
    except OSError:  # the current folder is gone
        return script


# ---- directives -----------------------------------------------------------------------------


def _header_lines(script: str) -> list[tuple[int, str]]:
    """The comment block at the top (after `#!`): up to the first command, as sbatch reads."""
    lines: list[tuple[int, str]] = []
    for number, line in enumerate(script.splitlines()[1:], start=2):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        lines.append((number, stripped))
    return lines


def _is_directive(line: str, prefix: str) -> bool:
    return line.startswith(prefix) and (len(line) == len(prefix) or line[len(prefix)].isspace())


class _Header:
    """Options from a script's header: `#SBATCH` ones (those gpuq shares with sbatch), and
    `#GPUQ` ones; with the line each single-valued one came from."""

    def __init__(self, script: str, notes: list[str]) -> None:
        self.sbatch: dict[str, Any] = {}
        self.sbatch_origins: dict[str, str] = {}
        self.gpuq: dict[str, Any] = {}
        self.gpuq_origins: dict[str, str] = {}
        for number, line in _header_lines(script):
            if _is_directive(line, SBATCH):
                for name, value in _sbatch_line(line, number, notes):
                    _put(self.sbatch, self.sbatch_origins, name, value, f"{SBATCH} line {number}")
            elif line.startswith(DIRECTIVE):
                for name, value in _gpuq_line(line, number):
                    _put(self.gpuq, self.gpuq_origins, name, value, f"{DIRECTIVE} line {number}")


def _put(found: dict[str, Any], origins: dict[str, str], name: str, value: Any, at: str) -> None:
    if _BY_NAME[name].multiple:
        # checked here, where the line is known: the values of all lines add up later
        try:
            if name == "after":
                parse_dependencies(str(value))
            elif name == "env":
                _environment({}, [value])
        except InvalidInput as exc:
            if not at:
                raise
            raise InvalidInput(f"{exc.field} ({at})", exc.value, exc.problem) from None
        found.setdefault(name, []).append(value)
    else:
        found[name] = value
        origins[name] = at


def _gpuq_line(line: str, number: int) -> list[tuple[str, Any]]:
    where = f"{DIRECTIVE} (line {number})"
    try:
        tokens = shlex.split(line[len(DIRECTIVE) :])
    except ValueError as exc:
        raise InvalidInput(where, _brief(line), str(exc)) from None
    return parse_tokens(tokens, where)


def parse_directives(script: str) -> dict[str, Any]:
    """Options from `#GPUQ ...` lines in the header (up to the first command)."""
    found: dict[str, Any] = {}
    for number, line in _header_lines(script):
        if line.startswith(DIRECTIVE):
            for name, value in _gpuq_line(line, number):
                _put(found, {}, name, value, "")
    return found


def parse_tokens(tokens: list[str], where: str) -> list[tuple[str, Any]]:
    """gpuq's own options in a `#GPUQ` line: `--gpus 2`, `--gpus=2`, `-G 2` or `-G2`."""
    pairs: list[tuple[str, Any]] = []
    index = 0
    while index < len(tokens):
        flag, has_value, value = tokens[index].partition("=")
        option = _BY_FLAG.get(flag)
        if option is None and not flag.startswith("--") and _BY_FLAG.get(flag[:2]):
            option, has_value, value = _BY_FLAG[flag[:2]], "=", tokens[index][2:]
            if option.is_flag:
                option = None
        if option is None:
            raise InvalidInput(where, _brief(tokens[index]), "unknown option")
        if option.is_flag:
            if has_value:
                raise InvalidInput(where, _brief(tokens[index]), "takes no value")
            pairs.append((option.name, True))
        elif has_value:
            pairs.append((option.name, value))
        elif index + 1 < len(tokens):
            index += 1
            pairs.append((option.name, tokens[index]))
        else:
            raise InvalidInput(where, _brief(flag), "needs a value")
        index += 1
    return pairs


# sbatch's spelling of the options gpuq shares with it -> the gpuq option
_SBATCH_OPTIONS = {
    "--gpus": "gpus",
    "-G": "gpus",
    "--gpus-per-node": "gpus",  # a gpuq job runs on one node
    "--gres": "gpus",
    "--cpus-per-task": "cpus",
    "-c": "cpus",
    "--mem": "mem",
    "--time": "time",
    "-t": "time",
    "--job-name": "name",
    "-J": "name",
    "--output": "output",
    "-o": "output",
    "--error": "error",
    "-e": "error",
    "--qos": "qos",
    "-q": "qos",
    "--array": "array",
    "-a": "array",
    "--dependency": "after",
    "-d": "after",
    "--hold": "hold",
    "-H": "hold",
    "--begin": "begin",
    "-b": "begin",
    "--signal": "signal",
    "--no-requeue": "no_requeue",
    "--chdir": "chdir",
    "-D": "chdir",
    "--nice": "nice",
    "--export": "export",
}
# take no value (so an unknown one among them does not swallow the next word)
_SBATCH_NO_VALUE = frozenset(
    {
        *("--hold", "-H", "--no-requeue", "--requeue", "--contiguous", "--exclusive"),
        *("--overcommit", "-O", "--oversubscribe", "-s", "--parsable", "--quiet", "-Q"),
        *("--test-only", "--verbose", "-v", "--wait", "-W", "--ignore-pbs", "--no-kill", "-k"),
        *("--spread-job", "--use-min-nodes", "--usage", "--help", "-h", "--version", "-V"),
        *("--get-user-env", "--reboot"),
    }
)
# one node, one task: what every gpuq job is, so saying so needs no warning
_SBATCH_ONE = frozenset({"--nodes", "-N", "--ntasks", "-n", "--ntasks-per-node"})
_SBATCH_DEFAULTS = frozenset({"--requeue"})  # what gpuq does anyway


def _sbatch_line(line: str, number: int, notes: list[str]) -> list[tuple[str, Any]]:
    """The gpuq options in one `#SBATCH` line; a warning in `notes` for each other one."""
    at = f"(line {number})"
    try:
        tokens = shlex.split(line[len(SBATCH) :], comments=True)
    except ValueError as exc:
        notes.append(f"{SBATCH} line {number} is not used by gpuq: {exc}")
        return []
    pairs: list[tuple[str, Any]] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if token.startswith("--"):
            flag, eq, value = token.partition("=")
            has_value = bool(eq)
        elif token.startswith("-") and len(token) > 1:
            flag, value = token[:2], token[2:].removeprefix("=")
            has_value = bool(value)
        else:
            notes.append(f"{SBATCH} {_brief(token)} {at} is not an option; not used by gpuq")
            continue
        name = _SBATCH_OPTIONS.get(flag)
        shown = token
        if not has_value and flag not in _SBATCH_NO_VALUE:
            if flag == "--nice":  # sbatch's --nice has an optional value, 100 when absent
                nice_given = index < len(tokens) and re.fullmatch(r"[+-]?[0-9]+", tokens[index])
                value = tokens[index] if nice_given else "100"
                index += 1 if nice_given else 0
                shown = f"{token} {value}" if nice_given else token
            elif index < len(tokens) and (name is not None or not tokens[index].startswith("-")):
                value = tokens[index]
                index += 1
                shown = f"{token} {value}"
            elif name is not None:
                raise InvalidInput(f"{SBATCH} {at}", _brief(flag), "needs a value")
        shown = _brief(shown)
        if name is None:
            if flag not in _SBATCH_DEFAULTS and not (flag in _SBATCH_ONE and value.strip() == "1"):
                notes.append(f"{SBATCH} {shown} {at} is not used by gpuq")
            continue
        if _BY_NAME[name].is_flag:
            if has_value:
                raise InvalidInput(f"{SBATCH} {at}", _brief(token), "takes no value")
            pairs.append((name, True))
            continue
        translated = _sbatch_value(flag, value, shown, at, notes)
        if translated is not None:
            pairs.append((name, translated))
    return pairs


def _sbatch_value(flag: str, value: str, shown: str, at: str, notes: list[str]) -> str | None:
    """sbatch's value as gpuq takes it; None (and a warning) when gpuq cannot use it."""
    if flag == "--gres":
        gpus: str | None = None
        for item in value.split(","):
            kind, _, rest = item.partition(":")
            if kind.strip().lower() != "gpu":
                notes.append(f"{SBATCH} {shown} {at}: {item} is not used by gpuq")
                continue
            gpus = _typed_count(rest or "1", shown, at, notes, gres=True)
        return gpus
    if flag in ("--gpus", "-G", "--gpus-per-node"):
        return _typed_count(value, shown, at, notes, gres=False)
    if flag == "--mem" and re.fullmatch(r"0+[KMGT]?", value.strip(), re.IGNORECASE):
        notes.append(f"{SBATCH} {shown} {at} (all of a node's memory) is not used by gpuq")
        return None
    if flag in ("--time", "-t") and value.strip().lower() in ("unlimited", "infinite"):
        notes.append(f"{SBATCH} {shown} {at} is not used by gpuq: the QOS default applies")
        return None
    if flag == "--export":
        head, *items = value.split(",")
        if head.strip().upper() not in ("ALL", "NONE") or any("=" not in i for i in items):
            notes.append(
                f"{SBATCH} {shown} {at} is not used by gpuq: only ALL or NONE (then K=V "
                "items) are; your whole environment is carried"
            )
            return None
    return value


def _typed_count(value: str, shown: str, at: str, notes: list[str], *, gres: bool) -> str:
    """sbatch's `N` or `TYPE:N` GPUs: the count; a GPU type is not used by gpuq. In a --gres
    a bare type (`gpu:a100`) means one GPU of it."""
    kind, colon, count = value.rpartition(":")
    if colon and kind:
        notes.append(
            f"{SBATCH} {shown} {at}: the GPU type {kind} is not used by gpuq (any GPU; "
            "--gpu-mem asks for a size)"
        )
    elif gres and re.fullmatch(r"[A-Za-z][\w.-]*", value.strip()):
        notes.append(f"{SBATCH} {shown} {at}: the GPU type {value} is not used by gpuq")
        return "1"
    return count


def merge(directives: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """Later options override earlier ones (the command line directives, `#GPUQ` lines
    `#SBATCH` ones); repeatable ones add up."""
    merged = dict(directives)
    for name, value in options.items():
        if value is None or value is False or value == ():
            continue
        option = _BY_NAME[name]
        if option.multiple:
            extra = [value] if isinstance(value, str | int | Dependency) else list(value)
            merged[name] = list(merged.get(name, [])) + extra
        else:
            merged[name] = value
    return merged


def options_after_script(args: Sequence[str]) -> list[str]:
    """The `gpuq submit` flags among a script's arguments (`--gpus`, `--gpus=2`), up to a
    `--`: they go to the script, as with sbatch, which is worth a warning. Short flags are
    not counted: `-c config.yaml` is common for a script's own options."""
    found: list[str] = []
    for arg in args:
        if arg == "--":
            break
        flag = arg.partition("=")[0]
        if flag in SUBMIT_LONG_FLAGS:
            found.append(flag)
    return found


# ---- values ---------------------------------------------------------------------------------

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
        raise InvalidInput("--after", _brief(raw), f"more than {MAX_DEPENDENCIES} dependencies")
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
                    "--after", _brief(raw), f"more than {MAX_DEPENDENCIES} dependencies"
                )
    except InvalidInput as exc:
        raise InvalidInput("--after", _brief(raw), exc.problem) from None
    return tuple(found), singleton


def _dependencies(values: Sequence[Any]) -> tuple[tuple[Dependency, ...], bool]:
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


def current_umask() -> int:
    """This process's umask, read without changing it (os.umask sets it, for every thread)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8) & 0o777
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask & 0o777


def _export(value: Any) -> tuple[bool, list[str]]:
    """sbatch's --export: `ALL` (the default) or `NONE`, then K=V items: (carry all, items)."""
    if value is None or value == "":
        return True, []
    head, *items = str(value).split(",")
    choice = head.strip().upper()
    if choice not in ("ALL", "NONE"):
        raise InvalidInput(
            "--export",
            _brief(str(value)),
            "expected ALL or NONE (then ,K=V items); gpuq carries all or none",
        )
    for item in items:
        if "=" not in item:
            raise InvalidInput(
                "--export",
                _brief(str(value)),
                f"{item[:40]!r} is not K=V; gpuq carries ALL or NONE",
            )
    return choice == "ALL", items


def _environment(carried: dict[str, str], assignments: Sequence[Any]) -> dict[str, str]:
    """The job's environment: the submitter's (names without `=` or NUL, text that can travel:
    the others are dropped, as they cannot be passed on), then `--env K=V` on top."""
    env = {k: v for k, v in carried.items() if _carryable(k, v)}
    for item in assignments:
        key, sep, value = str(item).partition("=")
        if not sep or not key:
            raise InvalidInput("--env", _brief(str(item)), "expected K=V")
        if not _ENV_NAME_RE.fullmatch(key):
            raise InvalidInput(
                "--env",
                _brief(str(item)),
                "the name must be letters, digits and _, not starting with a digit",
            )
        if "\0" in value:
            raise InvalidInput("--env", _brief(key), "the value contains a NUL byte")
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


def _workdir(chdir: str | None) -> str:
    try:
        return str(Path(chdir or os.getcwd()).absolute())
    except OSError:
        raise InvalidInput(
            "--chdir", chdir or ".", "the current folder no longer exists; give --chdir DIR"
        ) from None


def _brief(text: str) -> str:
    """`text` as an error may show it (one short line)."""
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+@=:,-]", "_", name)[:128] or "job"


def _text(values: dict[str, Any], key: str) -> str | None:
    value = values.get(key)
    if value is None or value == "":
        return None
    return str(value)


def _int(values: dict[str, Any], key: str, flag: str, default: int) -> int:
    value = values.get(key)
    if value is None or value == "":
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise InvalidInput(flag, str(value)[:60], "expected a whole number")
    if len(text.lstrip("+-").lstrip("0")) > 18:
        raise InvalidInput(flag, text[:60], "is far out of range")
    return int(text)


def _size(values: dict[str, Any], key: str, flag: str) -> int | None:
    value = values.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return parse_size(str(value), flag)


def _duration(values: dict[str, Any], key: str, flag: str) -> int | None:
    value = values.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return parse_duration(str(value), flag)


def _array(value: Any) -> ArraySpec | None:
    if value is None or value == "":
        return None
    if isinstance(value, ArraySpec):
        return value
    return ArraySpec.parse(str(value))


def _begin(value: Any, now: float | None) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value  # a timestamp already; JobSpec bounds it
    return parse_begin(str(value), now)


def _signal(value: Any, notes: list[str]) -> WarningSignal | None:
    if value is None or value == "":
        return None
    if isinstance(value, WarningSignal):
        return value
    text = str(value).strip()
    prefix, colon, rest = text.partition(":")
    if colon and prefix.upper() in ("B", "R"):
        # sbatch's B: (the batch shell only) and R: (reservation end): gpuq signals every
        # process of the job, before its time limit or a preemption
        notes.append(
            f"--signal {text}: the {prefix}: prefix is not used by gpuq; every process of the "
            "job gets the signal"
        )
        text = rest
    return WarningSignal.parse(text)
