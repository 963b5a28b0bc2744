"""Reading a script's header: its `#GPUQ` and `#SBATCH` lines, as submit options by name.

Like sbatch: directives come from the comment block at the top of the script (up to the first
command), and a flag on the command line overrides the same directive (gpuq.submission merges
them). `#SBATCH` lines are read too, for the options gpuq shares with sbatch (with sbatch's meaning:
`--gres=gpu:8` and `--mem` are per node); `#GPUQ` lines win
over them. `#SBATCH` lines are read as sbatch reads them, with sbatch's own option table
(gpuq.sbatch_table): a long option may be any unambiguous prefix (`--err`), an option sbatch
does not know (`--workdir`) or an ambiguous prefix (`--ti`) is an error, as is a pair of
options sbatch refuses together (`--gres=gpu:2` with `--gpus-per-node`); an option sbatch
takes that gpuq does not use is a warning, never silence. `#GPUQ` lines take gpuq's own flags,
from the one table in gpuq.options, with the same prefix rule.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from gpuq.domain.limits import brief
from gpuq.domain.parsing import parse_dependencies, submit_environment
from gpuq.errors import InvalidInput
from gpuq.options import BY_FLAG, BY_NAME, ambiguous, long_matches
from gpuq.sbatch_table import (
    LONG,
    MEANINGS,
    NONE,
    OPTIONAL,
    QUIET,
    REMOVED,
    SAME,
    SHORT,
    USED,
    WAIT,
)

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
    `#GPUQ` ones; with the line each single-valued one came from, the flag each was written
    as (so an error names `--gres` or `-G`, not the gpuq option it became), and whether an
    `#SBATCH --wait` (`-W`) asks `gpuq submit` to wait."""

    def __init__(self, script: str, notes: list[str]) -> None:
        self.sbatch: dict[str, Any] = {}
        self.sbatch_origins: dict[str, str] = {}
        self.gpuq: dict[str, Any] = {}
        self.gpuq_origins: dict[str, str] = {}
        self.sbatch_written: dict[str, str] = {}  # option name -> its flag as written
        self.gpuq_written: dict[str, str] = {}
        self.wait = False
        given: dict[str, tuple[str, str]] = {}  # sbatch option -> (as written, where)
        for number, line in _header_lines(script):
            at = f"{SBATCH} line {number}"
            if _is_directive(line, SBATCH):
                for item in _sbatch_line(line, number, notes):
                    given.pop(item.long, None)  # in the order last given
                    given[item.long] = (item.flag, at)
                    if item.name == UNUSED:
                        continue
                    if item.name == WAIT:
                        self.wait = True
                        continue
                    _put(self.sbatch, self.sbatch_origins, item.name, item.value, at, item.flag)
                    self.sbatch_written[item.name] = item.flag
            elif line.startswith(DIRECTIVE):
                for flag, name, value in _gpuq_line(line, number):
                    where = f"{DIRECTIVE} line {number}"
                    _put(self.gpuq, self.gpuq_origins, name, value, where, flag)
                    self.gpuq_written[name] = flag
        _refuse_pairs(given)

    @property
    def written(self) -> dict[str, str]:
        """Each option's flag as the header wrote it (a `#GPUQ` line's wins, as its value)."""
        return {**self.sbatch_written, **self.gpuq_written}


# pairs of options sbatch refuses together (slurm_opt.c: "... are mutually exclusive"),
# those gpuq does not use included: a script sbatch refuses is refused here too
_EXCLUSIVE_PAIRS = (
    ("gres", "gpus-per-node"),
    ("mem", "mem-per-cpu"),
    ("mem", "mem-per-gpu"),
    ("mem-per-cpu", "mem-per-gpu"),
    ("exclusive", "oversubscribe"),
    ("core-spec", "thread-spec"),
    ("ntasks-per-gpu", "gpus-per-task"),
    ("ntasks-per-gpu", "gpus-per-socket"),
    ("ntasks-per-gpu", "ntasks-per-node"),
    ("ntasks-per-gpu", "tres-per-task"),
)


def _refuse_pairs(given: dict[str, tuple[str, str]]) -> None:
    """An InvalidInput for the first pair sbatch refuses, naming the later option of it."""
    order = list(given)
    for pair in _EXCLUSIVE_PAIRS:
        if all(long in given for long in pair):
            first, second = sorted(pair, key=order.index)
            (one, one_at), (other, other_at) = given[first], given[second]
            raise InvalidInput(
                f"{other} ({other_at})",
                f"with {one} ({one_at})",
                "sbatch refuses the two together; give one",
            )


def _put(
    found: dict[str, Any], origins: dict[str, str], name: str, value: Any, at: str, flag: str = ""
) -> None:
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
            raise InvalidInput(f"{flag or exc.field} ({at})", exc.value, exc.problem) from None
        found.setdefault(name, []).append(value)
    else:
        found[name] = value
        origins[name] = at


def _gpuq_line(line: str, number: int) -> list[tuple[str, str, Any]]:
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
            for _, name, value in _gpuq_line(line, number):
                _put(found, {}, name, value, "")
    return found


def parse_tokens(tokens: list[str], where: str) -> list[tuple[str, str, Any]]:
    """gpuq's own options in a `#GPUQ` line: `--gpus 2`, `--gpus=2`, `-G 2`, `-G2`, or a prefix
    of one (`--part gpu`), as getopt_long takes it: (the flag resolved, option name, value)."""
    triples: list[tuple[str, str, Any]] = []
    index = 0
    while index < len(tokens):
        flag, has_value, value = tokens[index].partition("=")
        option = _gpuq_option(flag, where, tokens[index])
        if option is None and not flag.startswith("--") and BY_FLAG.get(flag[:2]):
            option, has_value, value = BY_FLAG[flag[:2]], "=", tokens[index][2:]
            flag = flag[:2]
            if option.is_flag:
                option = None
        if option is None:
            raise InvalidInput(where, brief(tokens[index]), "unknown option")
        if flag.startswith("--"):
            flag = next(f for f in option.flags if f.startswith(flag))
        if option.is_flag:
            if has_value:
                raise InvalidInput(where, brief(tokens[index]), "takes no value")
            triples.append((flag, option.name, True))
        elif has_value:
            triples.append((flag, option.name, value))
        elif index + 1 < len(tokens):
            index += 1
            triples.append((flag, option.name, tokens[index]))
        else:
            raise InvalidInput(where, brief(flag), "needs a value")
        index += 1
    return triples


_GPUQ_MEANINGS = {flag: o.name for o in BY_NAME.values() for flag in o.flags if flag[1] == "-"}


def _gpuq_option(flag: str, where: str, token: str) -> Any:
    """The gpuq option a `#GPUQ` flag names (a long one by any unambiguous prefix); None."""
    if not flag.startswith("--"):
        return BY_FLAG.get(flag)
    found = long_matches(flag, _GPUQ_MEANINGS)
    if len(found) > 1:
        raise InvalidInput(where, brief(token), ambiguous(flag, found))
    return BY_FLAG[found[0]] if found else None


@dataclass(frozen=True, slots=True)
class _Given:
    """One option of an `#SBATCH` line, as sbatch reads it."""

    long: str  # sbatch's long name of it ("gres")
    flag: str  # as written, a prefix resolved: "--gres", "-G"
    name: str  # the gpuq option it sets (gpuq.sbatch_table.USED), WAIT, or UNUSED
    value: Any


UNUSED = ""  # an option gpuq does not use (warned): kept only for the pairs sbatch refuses


def _sbatch_line(line: str, number: int, notes: list[str]) -> list[_Given]:
    """The options of one `#SBATCH` line: those gpuq uses, and the others as UNUSED with a
    warning in `notes` for each; an InvalidInput for one sbatch would refuse."""
    at = f"(line {number})"
    try:
        tokens = shlex.split(line[len(SBATCH) :], comments=True)
    except ValueError as exc:
        notes.append(f"{SBATCH} line {number} is not used by gpuq: {exc}")
        return []
    found: list[_Given] = []
    for long, flag, value, shown in _getopt(tokens, at, notes):
        shown = brief(shown)
        if long not in USED:
            if long not in QUIET:
                notes.append(f"{SBATCH} {shown} {at} is not used by gpuq")
            found.append(_Given(long, flag, UNUSED, None))
            continue
        name = USED[long][0]
        if name == WAIT or (name in BY_NAME and BY_NAME[name].is_flag and long != "exclusive"):
            found.append(_Given(long, flag, name, True))
            continue
        if long == "exclusive":
            if value is not None and not _exclusive_kind(value, shown, at, notes):
                continue
            found.append(_Given(long, flag, name, True))
            continue
        if value is None and long == "nice":
            value = "100"  # sbatch's --nice without a value
        translated = _sbatch_value(long, str(value), shown, at, notes)
        if translated is not None:
            found.append(_Given(long, flag, name, translated))
    return found


def _getopt(tokens: list[str], at: str, notes: list[str]) -> list[tuple[str, str, Any, str]]:
    """The options in an `#SBATCH` line's words as getopt_long reads them with sbatch's table:
    (long name, the flag as written and resolved, value or None, the words as written)."""
    where = f"{SBATCH} {at}"
    options: list[tuple[str, str, Any, str]] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if token.startswith("--") and len(token) > 2:
            flag, eq, value = token.partition("=")
            named = _sbatch_long(flag, token, where)  # as written, a prefix resolved
            long, kind = SAME.get(named, named), LONG[named]
            if kind == NONE and eq:
                raise InvalidInput(where, brief(token), f"--{named} takes no value")
            if eq or kind == NONE:
                options.append((long, f"--{named}", value if eq else None, token))
            elif kind == OPTIONAL:
                if long == "nice":  # read as before: a number after it is its value
                    nice_given = index < len(tokens) and re.fullmatch(r"[+-]?[0-9]+", tokens[index])
                    if nice_given:
                        options.append((long, "--nice", tokens[index], f"{token} {tokens[index]}"))
                        index += 1
                        continue
                options.append((long, f"--{named}", None, token))
            elif index < len(tokens):
                options.append((long, f"--{named}", tokens[index], f"{token} {tokens[index]}"))
                index += 1
            else:
                raise InvalidInput(where, brief(flag), "needs a value")
        elif token.startswith("-") and len(token) > 1 and token != "--":
            index = _short_options(tokens, index, where, options)
        else:
            notes.append(f"{SBATCH} {brief(token)} {at} is not an option; not used by gpuq")
    return options


def _short_options(
    tokens: list[str], index: int, where: str, options: list[tuple[str, str, Any, str]]
) -> int:
    """The short options in `tokens[index - 1]` (`-H`, `-t5`, `-t 5`, `-HW`); the next index."""
    token = tokens[index - 1]
    for position in range(1, len(token)):
        letter = token[position]
        long = SHORT.get(letter)
        if long is None:
            raise InvalidInput(where, brief(token), f"sbatch has no option -{letter}")
        rest = token[position + 1 :]
        if LONG[long] == NONE:
            options.append((long, f"-{letter}", None, f"-{letter}"))
            continue
        if rest or LONG[long] == OPTIONAL:
            value = rest.removeprefix("=") or None
            options.append((long, f"-{letter}", value, token))
        elif index < len(tokens):
            options.append((long, f"-{letter}", tokens[index], f"{token} {tokens[index]}"))
            index += 1
        else:
            raise InvalidInput(where, brief(token), "needs a value")
        break
    return index


def _sbatch_long(flag: str, token: str, where: str) -> str:
    """sbatch's long option that `flag` (`--err`) names, as spelled in its table (one of two
    names of an option, gpuq.sbatch_table.SAME, stays as written), or an InvalidInput as
    sbatch refuses."""
    found = long_matches(flag, MEANINGS)
    if len(found) > 1:
        raise InvalidInput(where, brief(token), ambiguous(flag, found))
    if not found:
        hint = REMOVED.get(flag[2:])
        raise InvalidInput(
            where, brief(token), f"sbatch has no option {flag}" + (f": {hint}" if hint else "")
        )
    return found[0][2:]


# sbatch's --exclusive=user|mcs|topo: nodes shared only with the user's own jobs (or ...);
# gpuq takes each as --exclusive, the stricter whole nodes
_EXCLUSIVE_KINDS = frozenset({"user", "mcs", "topo"})


def _exclusive_kind(value: str, shown: str, at: str, notes: list[str]) -> bool:
    if value.strip().lower() not in _EXCLUSIVE_KINDS:
        notes.append(f"{SBATCH} {shown} {at} is not used by gpuq: expected user or mcs")
        return False
    notes.append(
        f"{SBATCH} {shown} {at}: gpuq takes it as --exclusive (whole nodes, shared "
        "with no other job)"
    )
    return True


# what sbatch reads as no time limit: SLURM's words for it and `-1` (time_str2mins), and any
# time of zero (`0`, `0:00`, `0-0`), which sbatch's --time turns into INFINITE
_NO_LIMIT_WORDS = frozenset({"unlimited", "infinite", "-1"})
_ZERO_TIME_RE = re.compile(r"0+(?:-0+)?(?::0+){0,2}")


def _no_time_limit(value: str) -> bool:
    text = value.strip().lower()
    return text in _NO_LIMIT_WORDS or bool(_ZERO_TIME_RE.fullmatch(text))


def _sbatch_value(long: str, value: str, shown: str, at: str, notes: list[str]) -> str | None:
    """sbatch's value as gpuq takes it; None (and a warning) when gpuq cannot use it."""
    if long == "gres":
        gpus: str | None = None
        for item in value.split(","):
            kind, _, rest = item.partition(":")
            if kind.strip().lower() != "gpu":
                notes.append(f"{SBATCH} {shown} {at}: {item} is not used by gpuq")
                continue
            gpus = rest or "1"
        return gpus
    if long == "time" and _no_time_limit(value):
        notes.append(f"{SBATCH} {shown} {at} is not used by gpuq: the default time limit applies")
        return None
    if long == "export":
        head, *items = value.split(",")
        if head.strip().upper() not in ("ALL", "NONE") or any("=" not in i for i in items):
            notes.append(
                f"{SBATCH} {shown} {at} is not used by gpuq: only ALL or NONE (then K=V "
                "items) are; your whole environment is carried"
            )
            return None
    return value


def asks_to_wait(script: str) -> bool:
    """Whether the script's header has `#SBATCH --wait` (`-W`): `gpuq submit` then waits."""
    return Header(script, []).wait
