"""sbatch's file-name patterns in --output and --error, filled in as SLURM fills them for a
batch script (`expand_stdio_fields` in SLURM's src/common/print_fields.c).

`%%` a percent sign; `%j` the job id; `%J` the job id too (SLURM's "jobid.stepid", and the
batch script's step adds nothing); `%A` the array's job id (the job id outside an array);
`%a` the array task index (0 outside an array); `%b` that index modulo 10; `%s` the step,
`batch`; `%n` the node's index in the job and `%t` the task's, 0 for the batch script; `%N`
the node the script runs on (its first); `%u` the user; `%x` the job name, with each `/`
written `_` so that a name such as `CS 601.471/671 hw5` never reaches into another folder
(SLURM writes it as is). A width, `%3a` or `%10j`, pads a number with zeros (at most 10; a
name is not padded). Any other `%` sequence stays as written (`%q`, `%r`), as in SLURM; a
pattern with a `\\` is not expanded at all, its backslashes dropped, as in SLURM.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_FIELD_RE = re.compile(r"%(?:(%)|([0-9]*)(.?))", re.DOTALL)
_NUMERIC = frozenset("AabjJnts")
MAX_WIDTH = 10


@dataclass(frozen=True, slots=True)
class Fields:
    """What the patterns stand for, for one job. `task` is a string ("%a") for an array's
    record of tasks not yet started: their `%a` and `%b` stay as written."""

    job_id: int
    user: str
    name: str
    node: str
    array_id: int | None = None
    task: int | str | None = None


def expand(pattern: str, fields: Fields) -> str:
    """`pattern` with its sbatch fields filled in."""
    if "\\" in pattern:
        return pattern.replace("\\", "")
    values = _values(fields)

    def one(match: re.Match[str]) -> str:
        if match[1]:
            return "%"
        width, key = match[2], match[3]
        value = values.get(key)
        if value is None:
            return match[0]
        if key in _NUMERIC and width and value.isdigit():
            return value.zfill(min(int(width), MAX_WIDTH))
        return value

    return _FIELD_RE.sub(one, pattern)


def _values(fields: Fields) -> Mapping[str, str | None]:
    task = fields.task
    index: str | None = None if isinstance(task, str) else str(task or 0)
    return {
        "j": str(fields.job_id),
        "J": str(fields.job_id),
        "A": str(fields.array_id if fields.array_id is not None else fields.job_id),
        "a": index,
        "b": None if index is None else str(int(index) % 10),
        "s": "batch",
        "n": "0",
        "t": "0",
        "N": fields.node,
        "u": fields.user,
        "x": fields.name.replace("/", "_"),
    }
