"""From what a user typed (flags, `#GPUQ` and `#SBATCH` directives, a script file) to a JobSpec.

build_spec takes the options of the one table (gpuq.options.OPTIONS) by name, reads the
script's header (gpuq.directives), lets the command line override it, and turns each value
into its typed form. Every value is bounded here and again by the dataclasses
(gpuq.domain.model), which also check what arrives over gRPC: one InvalidInput naming the
option, and the directive line it came from, never another exception.
"""

from __future__ import annotations

import os
import warnings as _warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuq.directives import Header
from gpuq.domain.array_specs import ArraySpec
from gpuq.domain.dependencies import Dependency
from gpuq.domain.limits import MAX_SCRIPT_BYTES, brief, check_name
from gpuq.domain.model import JobSpec, Resources, WarningSignal
from gpuq.domain.node_constraints import (
    Placement,
    check_feature_expression,
    expand_nodes,
)
from gpuq.domain.notify import parse_mail_types
from gpuq.domain.parsing import collect_dependencies, parse_begin, submit_environment
from gpuq.domain.partitions import parse_partitions
from gpuq.domain.units import parse_time_limit
from gpuq.errors import InvalidInput
from gpuq.options import BY_FLAG, BY_NAME, GROUP_OF, SUBMIT_LONG_FLAGS
from gpuq.resource_layout import layout as _layout
from gpuq.resource_layout import size_option as _size
from gpuq.resource_layout import whole_number as _int


class SubmitWarning(UserWarning):
    """Something in a submission that gpuq does not use (e.g. `#SBATCH --account`); given to
    the `warnings` list of build_spec, or issued with warnings.warn when there is none."""


def build_spec(
    script: str | None = None,
    args: Sequence[str] = (),
    *,
    wrap: str | None = None,
    environ: Mapping[str, str] | None = None,
    now: float | None = None,
    warnings: list[str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    spelled: Mapping[str, str] | None = None,
    **options: Any,
) -> JobSpec:
    """A validated JobSpec; raises InvalidInput naming the option for anything wrong.

    `options` are OPTIONS by name (strings as typed, or typed values). The submitter's
    environment is carried into the job (sbatch's --export=ALL), `env` entries on top, and
    the submitter's umask is recorded. `defaults` (options by name, e.g. the user's
    `[client] mail_type`) apply where neither a directive nor `options` sets one. What gpuq
    does not use (an `#SBATCH --account`, a `--gres` other than gpu) is appended to
    `warnings`, one line each; without a list each is issued as a SubmitWarning. `spelled`:
    how the command line wrote an option (`{"partition": "-p"}`), for the errors to say so.
    """
    notes: list[str] = [] if warnings is None else warnings
    first = len(notes)
    spec = _build(script, args, wrap, environ, now, notes, options, defaults or {}, spelled)
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
    defaults: Mapping[str, Any],
    spelled: Mapping[str, str] | None,
) -> JobSpec:
    unknown = (set(options) | set(defaults)) - set(BY_NAME)
    if unknown:
        raise InvalidInput("option", sorted(unknown)[0], "unknown submit option")
    if (script is None) == (wrap is None):
        raise InvalidInput(
            "script", brief(str(script or wrap or "")), "give a script or --wrap, not both"
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
    header = Header(text, notes)
    merged = merge(merge(merge(dict(defaults), header.sbatch), header.gpuq), options)
    origins = {**header.sbatch_origins, **header.gpuq_origins}
    written = {**header.written}
    for name, value in options.items():
        if value is not None and value is not False and value != ():
            origins.pop(name, None)
            written.pop(name, None)
    written.update(spelled or {})
    try:
        return _spec(text, source, default_name, args, merged, environ, now, notes)
    except InvalidInput as exc:
        raise _as_written(exc, origins, written) from None


def _as_written(
    exc: InvalidInput, origins: Mapping[str, str], written: Mapping[str, str]
) -> InvalidInput:
    """The error naming the option as the user wrote it (`--gres`, `-p`, not the gpuq option
    it became), and for a value from a directive, the line it came from."""
    word, _, rest = exc.field.partition(" ")
    option = BY_FLAG.get(word)
    if option is None:
        return exc
    field = " ".join(filter(None, (written.get(option.name, word), rest)))
    origin = origins.get(option.name)
    if origin is not None:
        field = f"{field} ({origin})"
    if field == exc.field:
        return exc
    return InvalidInput(field, exc.value, exc.problem)


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
    dependencies, singleton = collect_dependencies(merged.get("after", ()))
    carry_all, exported = _export(merged.get("export"))
    env = submit_environment(
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
            gpu_mem=_size(merged, "gpu_mem", "--gpu-mem"),
            time_limit=_duration(merged, "time", "--time"),
            mig=_text(merged, "mig"),
            gpu_share=_share(merged),
            **_layout(merged, notes),
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
        placement=_placement(merged),
        mail_types=_mail_types(merged.get("mail_type")),
        mail_user=_text(merged, "mail_user"),
        notify_url=_text(merged, "notify"),
    )


def read_script(path: str) -> str:
    """The script's text: UTF-8, at most 4 MiB, Unix line ends (sbatch refuses CRLF too)."""
    try:
        with Path(path).open("rb") as file:
            data = file.read(MAX_SCRIPT_BYTES + 1)  # never more, whatever the file is
    except FileNotFoundError:
        raise InvalidInput("script", brief(path), "no such file") from None
    except IsADirectoryError:
        raise InvalidInput("script", brief(path), "is a folder, not a script") from None
    except PermissionError:
        raise InvalidInput("script", brief(path), "cannot read it: permission denied") from None
    except OSError as exc:
        raise InvalidInput("script", brief(path), f"cannot read it: {exc.strerror}") from None
    except ValueError:  # a NUL in the path
        raise InvalidInput("script", brief(path.replace("\0", "\\0")), "not a file name") from None
    if len(data) > MAX_SCRIPT_BYTES:
        raise InvalidInput("script", brief(path), "is larger than 4 MiB; is it really a script?")
    if b"\r\n" in data:
        raise InvalidInput("script", brief(path), "has DOS line ends (CRLF); run dos2unix on it")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise InvalidInput("script", brief(path), "is not text (a binary? use --wrap)") from None


def _script_path(script: str) -> str:
    try:
        return str(Path(script).absolute())
    except OSError:  # the current folder is gone
        return script


def merge(directives: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """Later options override earlier ones (the command line directives, `#GPUQ` lines
    `#SBATCH` ones); repeatable ones add up. Of a group of options that say one thing in
    different units (gpuq.options.GROUPS: --gpus and --gpus-per-node), the later layer's
    choice replaces the earlier one's."""
    merged = dict(directives)
    given = {name for name, value in options.items() if not _unset(value)}
    for name in given:
        for other in GROUP_OF.get(name, ()):
            if other not in given:
                merged.pop(other, None)
    for name, value in options.items():
        if _unset(value):
            continue
        option = BY_NAME[name]
        if option.multiple:
            extra = [value] if isinstance(value, str | int | Dependency) else list(value)
            merged[name] = list(merged.get(name, [])) + extra
        else:
            merged[name] = value
    return merged


def _unset(value: Any) -> bool:
    return value is None or value is False or value == ()


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
            brief(str(value)),
            "expected ALL or NONE (then ,K=V items); gpuq carries all or none",
        )
    for item in items:
        if "=" not in item:
            raise InvalidInput(
                "--export",
                brief(str(value)),
                f"{item[:40]!r} is not K=V; gpuq carries ALL or NONE",
            )
    return choice == "ALL", items


def _workdir(chdir: str | None) -> str:
    try:
        return str(Path(chdir or os.getcwd()).absolute())
    except OSError:
        raise InvalidInput(
            "--chdir", chdir or ".", "the current folder no longer exists; give --chdir DIR"
        ) from None


def _safe_name(name: str) -> str:
    """The script's file name as the default job name, as sbatch takes it; what a name may
    not hold (a control character) becomes `_`."""
    return "".join(c if c.isprintable() else "_" for c in name)[:128] or "job"


def _text(values: dict[str, Any], key: str) -> str | None:
    value = values.get(key)
    if value is None or value == "":
        return None
    return str(value)


def _placement(values: dict[str, Any]) -> Placement:
    """--nodelist, --exclude, --constraint and --partition (any of its names; the
    coordinator checks them against its `[partitions.NAME]`, or, where it has none, reads
    them as node features). Node ranges (n[1-4]) are expanded here."""
    nodelist = _text(values, "nodelist")
    exclude = _text(values, "exclude")
    constraint = _text(values, "constraint")
    if constraint is not None:
        constraint = check_feature_expression(constraint.strip())
    partition = _text(values, "partition")
    return Placement(
        nodelist=expand_nodes(nodelist, "--nodelist") if nodelist else (),
        exclude=expand_nodes(exclude, "--exclude") if exclude else (),
        constraint=constraint,
        partitions=parse_partitions(partition) if partition is not None else (),
    )


def _share(values: dict[str, Any]) -> int | None:
    """--gpu-share PCT: a percentage ("50" or "50%"); None when not asked for."""
    value = values.get("gpu_share")
    if value is None or value == "":
        return None
    if isinstance(value, str):
        value = value.strip().removesuffix("%")
    return _int({"gpu_share": value}, "gpu_share", "--gpu-share", 0)


def _duration(values: dict[str, Any], key: str, flag: str) -> int | None:
    """--time: text as sbatch reads it (whole minutes, seconds rounded up); an int is seconds
    exactly (the Python API's, e.g. a test's 2-second limit)."""
    value = values.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return parse_time_limit(str(value), flag)


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


def _mail_types(value: Any) -> tuple[str, ...]:
    """--mail-type END,FAIL (or a list of names) in MAIL_TYPES' order; () when not asked for."""
    if value is None or value == "":
        return ()
    if isinstance(value, list | tuple):
        value = ",".join(str(v) for v in value)
    return parse_mail_types(str(value))


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
