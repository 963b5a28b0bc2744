"""Dependencies: which job (or which task of an array) a job waits for, and for what ending.

Also parse_job_ref, a job as a user types it (`42`, `40_3`), which a dependency names and
every command that takes a job id reads. SLURM's lists (`afterok:12:13,singleton`) are split
by gpuq.domain.parsing.parse_dependencies, one Dependency.parse per item.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from gpuq.domain.limits import MAX_ARRAY_INDEX, MAX_JOB_ID, bounded_number, check_range, shown
from gpuq.errors import InvalidInput


class DependencyKind(StrEnum):
    OK = "ok"  # start after the job completed with exit code 0 (SLURM afterok)
    ANY = "any"  # start after the job ended in any way (afterany)
    NOTOK = "notok"  # start after the job ended in failure of any kind (afternotok)


@dataclass(frozen=True, slots=True)
class Dependency:
    """Start after `job_id` (every task, when it is an array) or after one task of it."""

    job_id: int
    kind: DependencyKind = DependencyKind.OK
    task: int | None = None  # `--after 40_3`: task 3 of array 40

    def __post_init__(self) -> None:
        check_range("--after", self.job_id, 1, MAX_JOB_ID)
        if self.task is not None:
            check_range("--after task", self.task, 0, MAX_ARRAY_INDEX)

    @property
    def display(self) -> str:
        return f"{self.job_id}_{self.task}" if self.task is not None else str(self.job_id)

    @classmethod
    def parse(cls, text: str) -> Dependency:
        """One dependency: `JOB[:ok|any|notok]` (`123`, `40_3:any`) or SLURM's `afterok:JOB`,
        `afterany:JOB`, `afternotok:JOB`; JOB is `N` or `N_T` (task T of array N).

        SLURM's lists (`afterok:12:13,afterany:14`) and `singleton` are split by
        gpuq.domain.parsing.parse_dependencies; start-based `after:` and `?` (any of) are refused.
        """
        raw = text.strip() if isinstance(text, str) else ""
        if not raw:
            raise InvalidInput("--after", text, "expected JOB[:ok|any|notok]")
        if len(raw) > 200:
            raise InvalidInput("--after", shown(text), "expected JOB[:ok|any|notok]")
        if "?" in raw:
            raise InvalidInput("--after", text, _NO_EITHER)
        if "," in raw:
            raise InvalidInput("--after", text, "one dependency here; give --after again")
        head, _, rest = raw.partition(":")
        word = head.lower()
        if word[:1].isalpha():
            kind = _SLURM_KINDS.get(word)
            if kind is None:
                raise InvalidInput("--after", text, _unsupported_kind(word))
            if not rest or ":" in rest:
                raise InvalidInput("--after", text, f"expected {word}:JOB")
            job_text = rest
        else:
            job_text = head
            try:
                kind = DependencyKind((rest or "ok").lower())
            except ValueError:
                raise InvalidInput(
                    "--after", text, "the kind must be ok, any or notok (JOB[:ok|any|notok])"
                ) from None
        job_id, task = parse_job_ref(job_text, "--after")
        return cls(job_id, kind, task)


_SLURM_KINDS = {
    "afterok": DependencyKind.OK,
    "afterany": DependencyKind.ANY,
    "afternotok": DependencyKind.NOTOK,
}
_NO_EITHER = (
    "'?' (any one of several) is not supported: a job waits for all its dependencies "
    "(separate them with ',')"
)


def _unsupported_kind(word: str) -> str:
    supported = "use JOB[:ok|any|notok], afterok:JOB, afterany:JOB, afternotok:JOB or singleton"
    if word == "after":
        return f"after: (start once JOB has started) is not supported; {supported}"
    if word in ("aftercorr", "afterburstbuffer", "expand"):
        return f"{word} is not supported; {supported}"
    if word == "singleton":
        return "singleton stands alone (or use --singleton)"
    return f"unknown dependency type {word!r}; {supported}"


_JOB_REF_RE = re.compile(r"([0-9]+)(?:_([0-9]+))?")


def parse_job_ref(text: str, field_name: str = "job id") -> tuple[int, int | None]:
    """A job as a user types it: `42` -> (42, None), `40_3` (task 3 of array 40) -> (40, 3).

    Decimal ASCII digits only (int() would also take `5_0`, ` 5`, `+5` or other scripts'
    digits, none of which is an id); job ids from 1 to MAX_JOB_ID, tasks from 0 to
    MAX_ARRAY_INDEX. Anything else raises InvalidInput(field_name, ...).
    """
    match = _JOB_REF_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidInput(
            field_name, shown(text), "expected a job id such as 42, or 42_3 for task 3 of array 42"
        )
    job_id = bounded_number(match[1], MAX_JOB_ID)
    if job_id is None or job_id < 1:
        raise InvalidInput(field_name, shown(text), f"job ids go from 1 to {MAX_JOB_ID}")
    if match[2] is None:
        return job_id, None
    task = bounded_number(match[2], MAX_ARRAY_INDEX)
    if task is None:
        raise InvalidInput(field_name, shown(text), f"task ids go from 0 to {MAX_ARRAY_INDEX}")
    return job_id, task
