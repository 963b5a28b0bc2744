"""From what a user typed (flags, `#GPUQ` directives, a script file) to a JobSpec.

One table, OPTIONS, names every submit option; the CLI builds its flags from it and the
directive parser reads script headers with it, so `--gpus 2` means the same in both places.
Like sbatch: directives come from the comment block at the top of the script, and a flag on the
command line overrides the same directive.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuq.domain.model import (
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
MAX_SCRIPT_BYTES = 4 << 20


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
        "start after JOB[:ok|any|notok] (repeatable)",
        "DEP",
        multiple=True,
    ),
    Option("array", ("--array", "-a"), "array tasks, e.g. 0-99%8", "SPEC"),
    Option(
        "env", ("--env",), "set K=V in the job's environment (repeatable)", "K=V", multiple=True
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


def build_spec(
    script: str | None = None,
    args: Sequence[str] = (),
    *,
    wrap: str | None = None,
    environ: Mapping[str, str] | None = None,
    now: float | None = None,
    **options: Any,
) -> JobSpec:
    """A validated JobSpec; raises InvalidInput naming the option for anything wrong.

    `options` are OPTIONS by name (strings as typed, or typed values). The submitter's
    environment is carried into the job (sbatch's --export=ALL), `env` entries on top.
    """
    unknown = set(options) - {o.name for o in OPTIONS}
    if unknown:
        raise InvalidInput("option", sorted(unknown)[0], "unknown submit option")
    if (script is None) == (wrap is None):
        raise InvalidInput("script", script or wrap or "", "give a script or --wrap, not both")
    if wrap is not None:
        text, source = f"#!/bin/sh\n{wrap}\n", "--wrap"
        default_name = "wrap"
    else:
        assert script is not None
        text, source = read_script(script), str(Path(script).absolute())
        default_name = Path(script).name
    merged = merge(parse_directives(text), options)
    environ = dict(os.environ if environ is None else environ)
    workdir = str(Path(merged.get("chdir") or os.getcwd()).absolute())
    return JobSpec(
        name=check_name(str(merged.get("name") or _safe_name(default_name))),
        script=text,
        workdir=workdir,
        args=tuple(args),
        env=_environment(environ, merged.get("env", ())),
        resources=Resources(
            gpus=_int(merged, "gpus", "--gpus", 0),
            gpu_mem=_size(merged, "gpu_mem", "--gpu-mem"),
            cpus=_int(merged, "cpus", "--cpus", 1),
            mem=_size(merged, "mem", "--mem"),
            time_limit=_duration(merged, "time", "--time"),
        ),
        qos=merged.get("qos") or None,
        nice=_int(merged, "nice", "--nice", 0),
        output=merged.get("output") or None,
        error=merged.get("error") or None,
        array=_parse(merged, "array", ArraySpec.parse),
        dependencies=tuple(Dependency.parse(str(d)) for d in merged.get("after", ())),
        hold=bool(merged.get("hold")),
        begin_time=_parse(merged, "begin", lambda v: parse_begin(v, now)),
        signal=_parse(merged, "signal", WarningSignal.parse),
        requeue=not merged.get("no_requeue"),
        singleton=bool(merged.get("singleton")),
        source=source,
    )


def read_script(path: str) -> str:
    file = Path(path)
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise InvalidInput("script", path, "no such file") from None
    except IsADirectoryError:
        raise InvalidInput("script", path, "is a folder, not a script") from None
    except PermissionError:
        raise InvalidInput("script", path, "cannot read it: permission denied") from None
    except OSError as exc:
        raise InvalidInput("script", path, f"cannot read it: {exc.strerror}") from None
    if len(data) > MAX_SCRIPT_BYTES:
        raise InvalidInput("script", path, "is larger than 4 MiB; is it really a script?")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise InvalidInput("script", path, "is not text (a binary? use --wrap)") from None


def parse_directives(script: str) -> dict[str, Any]:
    """Options from `#GPUQ ...` lines in the header (up to the first command)."""
    found: dict[str, Any] = {}
    for number, line in enumerate(script.splitlines()[1:], start=2):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if not stripped.startswith(DIRECTIVE):
            continue
        try:
            tokens = shlex.split(stripped[len(DIRECTIVE) :])
        except ValueError as exc:
            raise InvalidInput(f"{DIRECTIVE} (line {number})", stripped, str(exc)) from None
        for name, value in parse_tokens(tokens, f"{DIRECTIVE} (line {number})"):
            option = next(o for o in OPTIONS if o.name == name)
            if option.multiple:
                found.setdefault(name, []).append(value)
            else:
                found[name] = value
    return found


def parse_tokens(tokens: list[str], where: str) -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = []
    index = 0
    while index < len(tokens):
        flag, has_value, value = tokens[index].partition("=")
        option = _BY_FLAG.get(flag)
        if option is None:
            raise InvalidInput(where, tokens[index], "unknown option")
        if option.is_flag:
            if has_value:
                raise InvalidInput(where, tokens[index], "takes no value")
            pairs.append((option.name, True))
        elif has_value:
            pairs.append((option.name, value))
        elif index + 1 < len(tokens):
            index += 1
            pairs.append((option.name, tokens[index]))
        else:
            raise InvalidInput(where, flag, "needs a value")
        index += 1
    return pairs


def merge(directives: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """Command-line options override directives; repeatable ones add up."""
    merged = dict(directives)
    for name, value in options.items():
        if value is None or value is False or value == ():
            continue
        option = next(o for o in OPTIONS if o.name == name)
        if option.multiple:
            extra = [value] if isinstance(value, str) else list(value)
            merged[name] = list(merged.get(name, [])) + extra
        else:
            merged[name] = value
    return merged


def parse_begin(text: str, now: float | None = None) -> float:
    """`now+90` (seconds), `now+30m`/`+2h`/`+1d`, `16:00[:00]` (next such time), ISO date-time."""
    raw = str(text).strip()
    current = dt.datetime.now() if now is None else dt.datetime.fromtimestamp(now)
    if match := re.fullmatch(r"now\+(\d+)([smhd]?)", raw, re.IGNORECASE):
        unit = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2).lower()]
        return current.timestamp() + int(match.group(1)) * unit
    if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", raw):
        try:
            hour, minute, *second = (int(part) for part in raw.split(":"))
            clock = dt.time(hour, minute, second[0] if second else 0)
        except ValueError:
            raise InvalidInput("--begin", text, "not a time of day") from None
        moment = dt.datetime.combine(current.date(), clock)
        if moment <= current:
            moment += dt.timedelta(days=1)
        return moment.timestamp()
    try:
        return dt.datetime.fromisoformat(raw).timestamp()
    except ValueError:
        raise InvalidInput(
            "--begin", text, "expected now+N[smhd], HH:MM or 2026-12-01T09:00"
        ) from None


def _environment(environ: dict[str, str], assignments: Sequence[str]) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if "=" not in k and "\0" not in k + v and k}
    for item in assignments:
        key, sep, value = str(item).partition("=")
        if not sep or not key:
            raise InvalidInput("--env", item, "expected K=V")
        env[key] = value
    return env


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+@=:,-]", "_", name)[:128] or "job"


def _int(values: dict[str, Any], key: str, flag: str, default: int) -> int:
    value = values.get(key)
    if value is None or value == "":
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    if not re.fullmatch(r"[+-]?\d+", text):
        raise InvalidInput(flag, value, "expected a whole number")
    return int(text)


def _size(values: dict[str, Any], key: str, flag: str) -> int | None:
    value = values.get(key)
    if value is None or value == "":
        return None
    return value if isinstance(value, int) else parse_size(str(value), flag)


def _duration(values: dict[str, Any], key: str, flag: str) -> int | None:
    value = values.get(key)
    if value is None or value == "":
        return None
    return value if isinstance(value, int) else parse_duration(str(value), flag)


def _parse(values: dict[str, Any], key: str, parser: Any) -> Any:
    value = values.get(key)
    if value is None or value == "":
        return None
    return parser(value) if isinstance(value, str) else value
