"""Reading a script's header: its `#GPUQ` and `#SBATCH` lines, as submit options by name.

Like sbatch: directives come from the comment block at the top of the script (up to the first
command), and a flag on the command line overrides the same directive (gpuq.submission merges
them). `#SBATCH` lines are read too, for the options gpuq shares with sbatch (with sbatch's meaning:
`--gres=gpu:8` and `--mem` are per node); `#GPUQ` lines win
over them, and every `#SBATCH` option gpuq does not use is a warning, never silence and never
an error. `#GPUQ` lines take gpuq's own flags, from the one table in gpuq.options.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from gpuq.domain.limits import brief
from gpuq.domain.parsing import parse_dependencies, submit_environment
from gpuq.errors import InvalidInput
from gpuq.options import BY_FLAG, BY_NAME

DIRECTIVE = "#GPUQ"
SBATCH = "#SBATCH"


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


class Header:
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
    if BY_NAME[name].multiple:
        # checked here, where the line is known: the values of all lines add up later
        try:
            if name == "after":
                parse_dependencies(str(value))
            elif name == "env":
                submit_environment({}, [value])
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
        raise InvalidInput(where, brief(line), str(exc)) from None
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
        option = BY_FLAG.get(flag)
        if option is None and not flag.startswith("--") and BY_FLAG.get(flag[:2]):
            option, has_value, value = BY_FLAG[flag[:2]], "=", tokens[index][2:]
            if option.is_flag:
                option = None
        if option is None:
            raise InvalidInput(where, brief(tokens[index]), "unknown option")
        if option.is_flag:
            if has_value:
                raise InvalidInput(where, brief(tokens[index]), "takes no value")
            pairs.append((option.name, True))
        elif has_value:
            pairs.append((option.name, value))
        elif index + 1 < len(tokens):
            index += 1
            pairs.append((option.name, tokens[index]))
        else:
            raise InvalidInput(where, brief(flag), "needs a value")
        index += 1
    return pairs


# sbatch's spelling of the options gpuq shares with it -> the gpuq option
_SBATCH_OPTIONS = {
    "--gpus": "gpus",
    "-G": "gpus",
    "--gpus-per-node": "gpus_per_node",
    "--gres": "gpus_per_node",  # sbatch's --gres is per node
    "--gpus-per-task": "gpus_per_task",
    "--nodes": "nodes",
    "-N": "nodes",
    "--ntasks": "ntasks",
    "-n": "ntasks",
    "--ntasks-per-node": "ntasks_per_node",
    "--cpus-per-task": "cpus",
    "-c": "cpus",
    "--mem": "mem",  # per node; 0: all of each node's memory
    "--mem-per-gpu": "mem_per_gpu",
    "--mem-per-cpu": "mem_per_cpu",
    "--exclusive": "exclusive",
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
    "--nodelist": "nodelist",
    "-w": "nodelist",
    "--exclude": "exclude",
    "-x": "exclude",
    "--constraint": "constraint",
    "-C": "constraint",
    "--partition": "partition",  # [partitions.NAME], else a node feature (domain.partitions)
    "-p": "partition",
    "--mail-type": "mail_type",
    "--mail-user": "mail_user",
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
# sbatch's --exclusive=user|mcs|topo: nodes shared only with the user's own jobs (or ...);
# gpuq takes each as --exclusive, the stricter whole nodes
_EXCLUSIVE_KINDS = frozenset({"user", "mcs", "topo"})
_SBATCH_DEFAULTS = frozenset({"--requeue"})  # what gpuq does anyway
# sbatch's own command line (gpuq.slurm.job_commands) takes these flags, read as these lines are
SBATCH_OPTIONS = _SBATCH_OPTIONS


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
            notes.append(f"{SBATCH} {brief(token)} {at} is not an option; not used by gpuq")
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
                raise InvalidInput(f"{SBATCH} {at}", brief(flag), "needs a value")
        shown = brief(shown)
        if name is None:
            if flag not in _SBATCH_DEFAULTS:
                notes.append(f"{SBATCH} {shown} {at} is not used by gpuq")
            continue
        if flag == "--exclusive" and has_value:
            if value.strip().lower() not in _EXCLUSIVE_KINDS:
                notes.append(f"{SBATCH} {shown} {at} is not used by gpuq: expected user or mcs")
                continue
            notes.append(
                f"{SBATCH} {shown} {at}: gpuq takes it as --exclusive (whole nodes, shared "
                "with no other job)"
            )
            pairs.append((name, True))
            continue
        if BY_NAME[name].is_flag:
            if has_value:
                raise InvalidInput(f"{SBATCH} {at}", brief(token), "takes no value")
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
            gpus = _typed_count(rest or "1", gres=True)
        return gpus
    if flag in ("--gpus", "-G", "--gpus-per-node", "--gpus-per-task"):
        return _typed_count(value, gres=False)
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


def _typed_count(value: str, *, gres: bool) -> str:
    """sbatch's `N` or `TYPE:N` GPUs, as gpuq's --gpus takes them (gpuq.submission checks
    them). In a --gres a bare type (`gpu:a100`) means one GPU of it."""
    if gres and re.fullmatch(r"[A-Za-z][\w.-]*", value.strip()):
        return f"{value.strip()}:1"
    return value
