"""What every SLURM command of gpuq.slurm reads its arguments with: getopt, as SLURM's own
commands parse (getopt_long), and one refusal, by name, for an option gpuq does not support
(`sbatch: --foo is not supported by gpuq's sbatch`), before anything is done."""

from __future__ import annotations

import getopt
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class Refused(Exception):
    """One line for stderr after the command's name: `--foo is not supported by ...`."""


def options(
    command: str,
    argv: Sequence[str],
    short: str,
    long: Sequence[str],
    *,
    interspersed: bool = True,
) -> tuple[list[tuple[str, str]], list[str]]:
    """SLURM's commands parse with getopt_long: `-o FMT`, `-oFMT`, `--format=FMT`,
    `--format FMT`, `-hu alice`, unique prefixes of long names. `interspersed` False stops at
    the first word that is not an option (sbatch's script, srun's command)."""
    try:
        if interspersed:
            return getopt.gnu_getopt(list(argv), short, list(long))
        return getopt.getopt(list(argv), short, list(long))
    except getopt.GetoptError as exc:
        flag = ("--" if len(exc.opt) > 1 else "-") + exc.opt
        if "requires argument" in exc.msg:
            raise Refused(f"error: option {flag} requires an argument") from None
        if "must not have an argument" in exc.msg:
            raise Refused(f"error: option {flag} takes no argument") from None
        raise Refused(f"{flag} is not supported by gpuq's {command}") from None


def values(pairs: Sequence[tuple[str, str]], *flags: str) -> list[str]:
    """Every value given under any of these spellings, in order (`-u a -u b`, `--user=c`)."""
    return [value for flag, value in pairs if flag in flags]


def given(pairs: Sequence[tuple[str, str]], *flags: str) -> bool:
    return any(flag in flags for flag, _ in pairs)


def last(pairs: Sequence[tuple[str, str]], *flags: str) -> str | None:
    found = values(pairs, *flags)
    return found[-1] if found else None


def split_list(texts: Sequence[str]) -> list[str]:
    """`-u a,b -u c` -> [a, b, c]."""
    return [item.strip() for text in texts for item in text.split(",") if item.strip()]


def context() -> Any:
    """The CLI's context (settings, a client) from GPUQ_HOME and GPUQ_CONFIG, as `gpuq`
    reads them."""
    from gpuq.cli.group import Context

    home = os.environ.get("GPUQ_HOME")
    config = os.environ.get("GPUQ_CONFIG")
    return Context(Path(home).absolute() if home else None, Path(config) if config else None)
