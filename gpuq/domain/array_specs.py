"""Job arrays: which task indices an array has (SLURM's `0-99%8`), as text and back.

ArraySpec is what `--array` says; format_indices is the compact text the store keeps for an
array's record of tasks not yet started, and parse_indices reads it back. Kept apart from
gpuq.domain.model because the notation has its own rules and bounds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gpuq.domain.limits import (
    DIGITS_RE,
    MAX_ARRAY_INDEX,
    MAX_ARRAY_TASKS,
    MAX_ARRAY_TEXT,
    bounded_number,
    check_range,
    shown,
)
from gpuq.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """Task indices and how many may run at once (SLURM's `0-99%8`)."""

    indices: tuple[int, ...]
    max_running: int | None = None

    def __post_init__(self) -> None:
        indices = self.indices
        if not isinstance(indices, tuple) or not indices:
            raise InvalidInput("--array", shown(str(indices)), "has no tasks")
        if len(indices) > MAX_ARRAY_TASKS:
            raise InvalidInput(
                "--array", f"{len(indices)} tasks", f"more than {MAX_ARRAY_TASKS} tasks"
            )
        if any(type(index) is not int for index in indices):
            raise InvalidInput("--array", shown(str(indices)), "task indices are whole numbers")
        low, high = min(indices), max(indices)
        if low < 0 or high > MAX_ARRAY_INDEX:
            raise InvalidInput(
                "--array", shown(high if high > MAX_ARRAY_INDEX else low), _INDEX_RANGE
            )
        if len(set(indices)) != len(indices):
            raise InvalidInput("--array", shown(str(indices)), "repeats a task index")
        if self.max_running is not None:
            check_range(
                "--array limit",
                self.max_running,
                1,
                MAX_ARRAY_TASKS,
                f"the %N limit must be from 1 to {MAX_ARRAY_TASKS}",
            )

    @classmethod
    def parse(cls, text: str) -> ArraySpec:
        """`0-99`, `0-99%8`, `1,3,5-7`, `0-15:4` (step 4). Bounds are checked on the text,
        before any range is built: `0-99999999999` is refused at once."""
        raw = text.strip() if isinstance(text, str) else ""
        if len(raw) > MAX_ARRAY_TEXT:
            raise InvalidInput("--array", shown(raw), f"is longer than {MAX_ARRAY_TEXT} bytes")
        body, percent, limit_text = raw.partition("%")
        indices: set[int] = set()
        for part in body.split(","):
            match = _ARRAY_PART_RE.fullmatch(part)
            if match is None:
                raise InvalidInput("--array", shown(text), _ARRAY_FORMS)
            low = _array_index(match[1], text)
            high = _array_index(match[2], text) if match[2] else low
            step = bounded_number(match[3], MAX_ARRAY_INDEX) if match[3] else 1
            if step == 0:
                raise InvalidInput("--array", shown(text), "a step must be at least 1")
            if step is None:  # a step beyond any index: the range's first task only
                step = MAX_ARRAY_INDEX + 1
            if high < low:
                raise InvalidInput("--array", shown(text), f"the range {part} goes down")
            if (high - low) // step >= MAX_ARRAY_TASKS:
                raise InvalidInput("--array", shown(text), f"more than {MAX_ARRAY_TASKS} tasks")
            indices.update(range(low, high + 1, step))
            if len(indices) > MAX_ARRAY_TASKS:
                raise InvalidInput("--array", shown(text), f"more than {MAX_ARRAY_TASKS} tasks")
        max_running = None
        if percent:
            if not DIGITS_RE.fullmatch(limit_text):
                raise InvalidInput("--array", shown(text), _ARRAY_FORMS)
            max_running = bounded_number(limit_text, MAX_ARRAY_TASKS)
            if not max_running:  # %0, or above the bound
                raise InvalidInput(
                    "--array", shown(text), f"the %N limit must be from 1 to {MAX_ARRAY_TASKS}"
                )
        return cls(tuple(sorted(indices)), max_running)


_ARRAY_PART_RE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")
_ARRAY_FORMS = "expected e.g. 0-99, 1,3,5-7, 0-15:4 or 0-99%8"
_INDEX_RANGE = f"task indices go from 0 to {MAX_ARRAY_INDEX}"


def _array_index(digits: str, text: str) -> int:
    index = bounded_number(digits, MAX_ARRAY_INDEX)
    if index is None:
        raise InvalidInput("--array", shown(text), _INDEX_RANGE)
    return index


def format_indices(indices: tuple[int, ...] | list[int]) -> str:
    """Sorted task indices in ArraySpec.parse's notation, runs collapsed: `0-99`, `1,3,5-7`,
    `0-96:4`; the exact inverse of parsing, so a record's tasks can be stored as this text."""
    parts: list[str] = []
    i, n = 0, len(indices)
    while i < n:
        start = indices[i]
        if i + 1 == n:
            parts.append(str(start))
            break
        step = indices[i + 1] - start
        j = i + 1
        while j + 1 < n and indices[j + 1] - indices[j] == step:
            j += 1
        if j - i >= 2 or step == 1:
            parts.append(f"{start}-{indices[j]}" + (f":{step}" if step != 1 else ""))
            i = j + 1
        else:
            parts.append(str(start))
            i += 1
    return ",".join(parts)


def format_runs(numbers: Iterable[int]) -> str:
    """(0, 1, 2, 3, 8) -> "0-3,8": consecutive numbers folded, as cpulists and SLURM's task
    lists write them ("" for none); unlike format_indices, no `:step`."""
    ordered = sorted(set(numbers))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_indices(text: str) -> tuple[int, ...]:
    """The inverse of format_indices (trusted text from the store)."""
    return ArraySpec.parse(text).indices if text else ()
