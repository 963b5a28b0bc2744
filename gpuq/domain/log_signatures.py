"""Signatures of known failures in a job's output: what a line means and what to do.

The signatures are data (gpuq/diagnosis_signatures.toml, which an admin extends with
`[coordinator] diagnosis_signatures`): each `[[signature]]` has a `name` (lower-case words
joined by `-`), a `pattern` (a Python regular expression, searched in each line of the output's
tail), a `meaning` (the verdict's title), an `advice` (the next step), and a `weight` (0-1000:
verdicts rank by it, highest first). An entry of a later file with the same name replaces the
earlier one; `disabled = true` switches a packaged one off.

What a pattern cannot say is read here in code: PyTorch's CUDA out-of-memory figures (how much
of the reserved memory was free but fragmented) and a Python traceback's last frame.

Pure: text in, signatures and findings out (tomllib parses text; reading files is the
caller's, gpuq.signature_files).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuq.errors import ConfigError

MAX_LINES = 2000  # the newest lines of a tail looked at
MAX_LINE = 2000  # characters of a line looked at
MAX_QUOTE = 240  # characters of a matched line quoted as evidence
MAX_WEIGHT = 1000
_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_KEYS = {"name", "pattern", "meaning", "advice", "weight", "disabled"}
_REQUIRED = ("name", "pattern", "meaning", "advice")


@dataclass(frozen=True, slots=True)
class Signature:
    """One known failure: a line matching `pattern` means `meaning`; `advice` is what to do."""

    name: str
    pattern: re.Pattern[str]
    meaning: str
    advice: str
    weight: int
    disabled: bool = False


@dataclass(frozen=True, slots=True)
class Finding:
    """A signature found in a tail: its newest matching line (whole: quote() it to show it)
    and how many lines matched."""

    signature: Signature
    line: str
    count: int


def parse_signatures(text: str, source: str) -> dict[str, Signature]:
    """The signatures of one file's `text`, by name; ConfigError (naming `source` and the
    entry) for anything wrong: not TOML, an unknown key, a missing one, a bad name, a pattern
    that does not compile, a weight out of range."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, "signature", "(file)", f"not TOML: {exc}") from None
    unknown = set(data) - {"signature"}
    if unknown:
        raise ConfigError(source, sorted(unknown)[0], "", "expected only [[signature]] entries")
    entries = data.get("signature", [])
    if not isinstance(entries, list):
        raise ConfigError(source, "signature", entries, "expected [[signature]] entries")
    found: dict[str, Signature] = {}
    for number, entry in enumerate(entries, 1):
        signature = _entry(entry, f"{source}: signature {number}")
        found[signature.name] = signature
    return found


def _entry(entry: object, where: str) -> Signature:
    if not isinstance(entry, dict):
        raise ConfigError(where, "signature", entry, "expected a table")
    extra = set(entry) - _KEYS
    if extra:
        raise ConfigError(where, sorted(extra)[0], "", f"expected only {', '.join(sorted(_KEYS))}")
    for key in _REQUIRED:
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            raise ConfigError(where, key, entry.get(key, ""), "expected a non-empty string")
    name = entry["name"]
    if not _NAME.fullmatch(name) or len(name) > 64:
        raise ConfigError(where, "name", name, "expected lower-case words joined by '-'")
    try:
        pattern = re.compile(entry["pattern"])
    except re.error as exc:
        why = f"not a regular expression: {exc}"
        raise ConfigError(where, "pattern", entry["pattern"], why) from None
    weight = entry.get("weight", 50)
    if not isinstance(weight, int) or isinstance(weight, bool) or not 0 <= weight <= MAX_WEIGHT:
        raise ConfigError(
            where, "weight", weight, f"expected a whole number from 0 to {MAX_WEIGHT}"
        )
    disabled = entry.get("disabled", False)
    if not isinstance(disabled, bool):
        raise ConfigError(where, "disabled", disabled, "expected true or false")
    return Signature(
        name, pattern, entry["meaning"].strip(), entry["advice"].strip(), weight, disabled
    )


def merged(*layers: Mapping[str, Signature]) -> tuple[Signature, ...]:
    """The signatures in force: later layers replace earlier entries of the same name; those
    disabled are left out."""
    found: dict[str, Signature] = {}
    for layer in layers:
        found.update(layer)
    return tuple(s for s in found.values() if not s.disabled)


def tail_lines(tail: str) -> list[str]:
    """The tail's newest lines (a progress bar's `\\r` rewrites split too), each cut short."""
    return [line[-MAX_LINE:] for line in re.split(r"[\r\n]+", tail)[-MAX_LINES:]]


def find_signatures(lines: list[str], signatures: Iterable[Signature]) -> list[Finding]:
    """Each signature that matches a line: with its newest matching line."""
    found = []
    for signature in signatures:
        matched = [line for line in lines if signature.pattern.search(line)]
        if matched:
            found.append(Finding(signature, matched[-1], len(matched)))
    return found


def quote(line: str) -> str:
    """A line of output as evidence: stripped and cut to MAX_QUOTE characters."""
    line = line.strip()
    return line if len(line) <= MAX_QUOTE else line[: MAX_QUOTE - 3] + "..."


# ---- PyTorch's CUDA out-of-memory message -------------------------------------------------

# bounded quantifiers: the line is the job's output (up to MAX_LINE characters), and a line of
# digits must cost a scan, not a backtracking square (or cube, with _OLD's gap)
_SIZE = r"(\d{1,15}(?:\.\d{1,6})?) ?([KMGT]i?B|bytes)"
_TRIED = re.compile(rf"Tried to allocate {_SIZE}")
# PyTorch 2.1 and later: "Of the allocated memory 70.12 GiB is allocated by PyTorch, and
# 6.89 GiB is reserved by PyTorch but unallocated."
_NEW = re.compile(
    rf"{_SIZE} is allocated by PyTorch,? and {_SIZE} is reserved by PyTorch but unallocated"
)
# PyTorch 1.x and 2.0: "(GPU 0; 15.78 GiB total capacity; 14.56 GiB already allocated;
# 3.44 MiB free; 14.71 GiB reserved in total by PyTorch)"
_OLD = re.compile(rf"{_SIZE} already allocated;.{{0,120}}?{_SIZE} reserved in total by PyTorch")
_TOTAL = re.compile(rf"total capacity of {_SIZE}|{_SIZE} total capacity")
_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_UNITS.update({"KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4})


@dataclass(frozen=True, slots=True)
class TorchOom:
    """PyTorch's figures in a CUDA out-of-memory message (bytes; None: not printed)."""

    tried: int | None
    allocated: int | None  # by PyTorch's tensors
    unallocated: int | None  # reserved by PyTorch's caching allocator, but free
    capacity: int | None  # the GPU's total

    @property
    def reserved(self) -> int | None:
        if self.allocated is None or self.unallocated is None:
            return None
        return self.allocated + self.unallocated


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


def torch_oom(line: str) -> TorchOom:
    """The figures of one CUDA out-of-memory line (any PyTorch version's form)."""
    tried = _TRIED.search(line)
    total = _TOTAL.search(line)
    capacity = None
    if total is not None:
        number, unit = (total[1], total[2]) if total[1] else (total[3], total[4])
        capacity = _bytes(number, unit)
    allocated = unallocated = None
    if (new := _NEW.search(line)) is not None:
        allocated, unallocated = _bytes(new[1], new[2]), _bytes(new[3], new[4])
    elif (old := _OLD.search(line)) is not None:
        allocated = _bytes(old[1], old[2])
        unallocated = max(0, _bytes(old[3], old[4]) - allocated)
    return TorchOom(_bytes(tried[1], tried[2]) if tried else None, allocated, unallocated, capacity)


# ---- a Python traceback -------------------------------------------------------------------

_TRACEBACK = re.compile(r"^\s*Traceback \(most recent call last\):")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?::|$)")  # "ValueError: ...", "KeyboardInterrupt"
_RANK_PREFIX = re.compile(r"^\s*(?:\[(?:rank)?\d+\]:?|\d+:)\s?")  # torchrun's, srun --label's


@dataclass(frozen=True, slots=True)
class Traceback:
    """A Python traceback's last frame (where it was raised) and its exception line."""

    file: str
    line: int
    function: str
    code: str  # the frame's source line, when printed
    exception: str


def last_traceback(lines: list[str]) -> Traceback | None:
    """The newest traceback in `lines` whose exception line was printed, or None."""
    starts = [i for i, line in enumerate(lines) if _TRACEBACK.match(_unlabelled(line))]
    for start in reversed(starts):
        found = _read_traceback([_unlabelled(line) for line in lines[start + 1 :]])
        if found is not None:
            return found
    return None


def _unlabelled(line: str) -> str:
    return _RANK_PREFIX.sub("", line, count=1)


def _read_traceback(lines: list[str]) -> Traceback | None:
    frame: re.Match[str] | None = None
    code = ""
    for number, line in enumerate(lines):
        if (found := _FRAME.match(line)) is not None:
            frame, code = found, ""
            following = lines[number + 1] if number + 1 < len(lines) else ""
            if following.startswith("    ") and not _FRAME.match(following):
                code = following.strip()
            continue
        if frame is None:
            continue
        if not line.strip() or line.startswith(" "):
            continue  # a frame's source line, its carets
        if _EXCEPTION.match(line):
            return Traceback(
                frame["file"], int(frame["line"]), frame["function"], quote(code), quote(line)
            )
        return None  # the traceback ended without an exception line
    return None
