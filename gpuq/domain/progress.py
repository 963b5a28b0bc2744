"""A job's progress as the job itself prints it, read from the tail of its output.

GPU utilisation misleads (a data-loader-bound job keeps its GPUs busy enough to look fine, a
job spinning in NCCL shows 100 %), so gpuq reads what the job says of itself: the last
progress line in its output. Recognised, newest line first (tqdm rewrites its bar with `\\r`,
so a file holds many bars on one "line"):

- tqdm bars: `45%|####5     | 45/100 [00:12<00:15,  3.66it/s, loss=0.1]`, `123it [00:10,
  12.3it/s]`, `1.50s/it`, unit-scaled counts and rates (`1.2k/10.0k`, `3.2kit/s`), any unit
  (`samples/s`, `s/batch`). Hugging Face Trainer and Lightning's default bar are tqdm bars;
  Lightning prefixes `Epoch 3:`.
- Lightning's rich bar: `Epoch 3/9  ━━━━━ 45/100 0:00:12 • 0:00:15 3.66it/s`: with the
  epochs known, progress counts over the whole run.
- Hugging Face Trainer's log dictionaries without a bar: `{'loss': 2.1, ..., 'epoch': 0.42}`
  (progress in epochs; the total when `Num Epochs = 3` is in the tail too).
- The documented line a job can print itself: `GPUQ_PROGRESS 123/1000 [unit]`,
  `GPUQ_PROGRESS 0.42` (a fraction) or `GPUQ_PROGRESS 42%`, at the start of a line.

Pure: text in, a Progress out. Throughput over time (and its collapse) is `ThroughputTrack`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

MAX_LINES = 400  # the newest lines (after splitting on \r) looked at; a tail is bounded anyway
MAX_LINE = 1000  # characters of a line looked at (its end: a bar's figures are near it)

_SCALE = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
# every quantifier is bounded: the text is the job's (anyone's) output, read by root on every
# sample, so a line of 1,000 digits must cost a regex scan, not a backtracking square
_NUMBER = r"\d{1,18}(?:\.\d{1,12})?(?:e[+-]?\d{1,3})?"
_COUNT = rf"(?:{_NUMBER})[kMGTP]?"
_UNIT = r"[A-Za-z_ ]{0,20}"
_TQDM = re.compile(
    rf"(?P<done>{_COUNT})(?:/(?P<total>{_COUNT}))?\s{{0,4}}(?P<nounit>[A-Za-z_]{{0,20}})\s{{0,4}}"
    r"\[(?P<elapsed>[\d:]{1,12})(?:<(?P<left>[\d:?]{1,12}))?,\s{0,4}"
    rf"(?:(?P<rate>{_COUNT})(?P<unit>{_UNIT}?)/s"
    rf"|(?P<inv>{_NUMBER})s/(?P<invunit>[A-Za-z_ ]{{1,20}})"
    rf"|\?{_UNIT}/s)"
)
_EPOCH_PREFIX = re.compile(r"Epoch (?P<epoch>\d{1,9})(?:/(?P<last>\d{1,9}))?\b")
_RICH = re.compile(
    r"(?P<done>\d{1,18})/(?P<total>\d{1,18})\s{1,4}[\d:-]{1,12}\s{1,4}•\s{1,4}[\d:-]{1,12}\s{1,4}"
    rf"(?:(?P<rate>{_NUMBER})(?P<unit>[A-Za-z_]{{1,20}})/s)?"
)
_HF_LOG = re.compile(r"['\"]epoch['\"]:\s{0,4}(?P<epoch>" + _NUMBER + r")")
_HF_EPOCHS = re.compile(r"Num [Ee]pochs\s{0,4}=\s{0,4}(?P<epochs>[\d,]{1,20})")
_OWN = re.compile(
    rf"^GPUQ_PROGRESS\s{{1,4}}(?:(?P<done>{_NUMBER})/(?P<total>{_NUMBER})"
    rf"(?:\s{{1,4}}(?P<unit>[A-Za-z_]{{1,20}}))?|(?P<pct>{_NUMBER})%|(?P<fraction>{_NUMBER}))\s*$"
)


@dataclass(frozen=True, slots=True)
class Progress:
    """One progress reading. `done` and `total` count `unit`s (steps, items, epochs); `rate`
    is the job's own figure in units a second (None: it printed none); `source` says which
    format it was read from; `label` what the counts are of when not the whole run
    ("epoch 3": Lightning's bar counts one epoch's steps)."""

    done: float
    total: float | None
    rate: float | None
    unit: str
    source: str
    label: str = ""

    @property
    def fraction(self) -> float | None:
        if self.total is None or self.total <= 0:
            return None
        return min(1.0, max(0.0, self.done / self.total))

    def eta(self, rate: float | None = None) -> float | None:
        """Seconds until `total` at `rate` (default: the job's own), None when unknown."""
        speed = self.rate if rate is None else rate
        if self.total is None or not speed or speed <= 0:
            return None
        return max(0.0, (self.total - self.done) / speed)


def latest_progress(text: str) -> Progress | None:
    """The newest progress line of `text` (a tail of a job's output), or None."""
    lines = re.split(r"[\r\n]+", text)[-MAX_LINES:]
    epochs = _hf_epochs(text)
    for line in reversed(lines):
        found = read_line(line[-MAX_LINE:], epochs)
        if found is not None:
            return found
    return None


def read_line(line: str, hf_epochs: float | None = None) -> Progress | None:
    """One line's progress, or None. `hf_epochs`: the Trainer's `Num Epochs` when known."""
    line = line.strip()
    if not line:
        return None
    if line.startswith("GPUQ_PROGRESS"):
        return _own(line)
    rich = _RICH.search(line) if "•" in line else None
    if rich is not None:
        return _rich(line, rich)
    bar = _TQDM.search(line) if "[" in line and "/" in line else None
    if bar is not None:
        return _tqdm(line, bar)
    log = _HF_LOG.search(line) if line[0] == "{" and line[-1] == "}" else None
    if log is not None:
        return Progress(float(log["epoch"]), hf_epochs, None, "epoch", "hf-trainer")
    return None


def _own(line: str) -> Progress | None:
    match = _OWN.match(line)
    if match is None:
        return None
    if match["done"] is not None:
        done, total = float(match["done"]), float(match["total"])
        if not _sane(done) or not _sane(total) or total <= 0:
            return None
        return Progress(done, total, None, match["unit"] or "step", "gpuq")
    share = float(match["pct"]) / 100 if match["pct"] is not None else float(match["fraction"])
    if not _sane(share) or share > 1:
        return None
    return Progress(share, 1.0, None, "", "gpuq")


def _tqdm(line: str, bar: re.Match[str]) -> Progress | None:
    done = _count(bar["done"])
    total = _count(bar["total"]) if bar["total"] else None
    if done is None or (bar["total"] and total is None):
        return None
    unit = (bar["unit"] or bar["invunit"] or bar["nounit"] or "it").strip()
    rate = None
    if bar["rate"]:
        rate = _count(bar["rate"])
    elif bar["inv"]:
        seconds = float(bar["inv"])
        rate = 1.0 / seconds if seconds > 0 else None
    epoch = _EPOCH_PREFIX.search(line[: bar.start()])
    label = f"epoch {epoch['epoch']}" if epoch is not None else ""
    source = "lightning" if epoch is not None else "tqdm"
    return Progress(done, total, rate, unit, source, label)


def _rich(line: str, bar: re.Match[str]) -> Progress:
    done, total = float(bar["done"]), float(bar["total"])
    rate = float(bar["rate"]) if bar["rate"] else None
    unit = bar["unit"] or "it"
    epoch = _EPOCH_PREFIX.search(line[: bar.start()])
    if epoch is None:
        return Progress(done, total, rate, unit, "lightning")
    current = int(epoch["epoch"])
    if epoch["last"] is None:
        return Progress(done, total, rate, unit, "lightning", f"epoch {current}")
    epochs = int(epoch["last"]) + 1  # Lightning shows `Epoch e/max_epochs-1`
    return Progress(current * total + done, epochs * total, rate, unit, "lightning")


def _hf_epochs(text: str) -> float | None:
    found = None
    for found in _HF_EPOCHS.finditer(text):  # noqa: B007 (the last one counts)
        continue
    if found is None:
        return None
    value = float(found["epochs"].replace(",", ""))
    return value if value > 0 else None


def _count(text: str | None) -> float | None:
    """A tqdm count or rate, unit-scaled ones (`1.2k`) included; None when absurd."""
    if not text:
        return None
    suffix = text[-1] if text[-1] in _SCALE else ""
    value = float(text[: len(text) - len(suffix)]) * _SCALE[suffix]
    return value if _sane(value) else None


def _sane(value: float) -> bool:
    return math.isfinite(value) and 0 <= value < 1e18


# ---- throughput over time ------------------------------------------------------------------

MIN_POINTS = 3  # readings needed before a collapse is judged
COLLAPSE_SHARE = 0.2  # the recent rate below this share of the typical one: collapsed
STALL_AFTER = 600.0  # seconds without any progress: the rate is 0
WINDOW = 32  # readings kept


@dataclass(frozen=True, slots=True)
class Reading:
    at: float  # when the tail was read (Unix seconds)
    progress: Progress
    rate: float | None  # units a second at that time: the job's own, else from the last move


@dataclass(frozen=True, slots=True)
class Throughput:
    """What a job's readings say now: the latest progress, its rate and ETA, and when the rate
    collapsed (`fell_from` to `rate` at `fell_at`), all None when not known."""

    progress: Progress
    rate: float | None
    eta: float | None
    fell_from: float | None = None
    fell_at: float | None = None
    stalled_since: float | None = None

    def collapse_line(self, clock: str) -> str:
        """ "throughput fell from 3.2 to 0.1 it/s at 14:02" (`clock`: fell_at, formatted)."""
        unit = self.progress.unit or "units"
        if self.stalled_since is not None:
            return f"no progress since {clock} (was {_rate(self.fell_from)} {unit}/s)"
        was, now = _rate(self.fell_from), _rate(self.rate)
        return f"throughput fell from {was} to {now} {unit}/s at {clock}"


class ThroughputTrack:
    """One running job's progress readings, newest last (at most WINDOW). Rates come from the
    job's own figure when its line moved, else from the counts' change since the reading where
    the previous count was first seen; a bar that has not moved for STALL_AFTER seconds is a
    rate of 0 (tqdm's last line keeps its old rate while the job hangs). A collapse stays
    (the rate it fell from, and when) for as long as the rate stays below COLLAPSE_SHARE of
    that rate, also once slow readings fill the window; it goes when the rate recovers."""

    def __init__(self) -> None:
        self.readings: list[Reading] = []
        self.moved: Reading | None = None  # the reading where the latest count was first seen
        self.fell: tuple[float, float] | None = None  # (rate it fell from, when) while fallen

    def add(self, at: float, progress: Progress) -> None:
        last = self.readings[-1] if self.readings else None
        if last is not None and at <= last.at:
            return
        if last is None or progress != last.progress:
            rate = progress.rate
            if rate is None and self.moved is not None:
                rate = _derived_rate(self.moved, at, progress)
            reading = Reading(at, progress, rate)
            self.moved = reading
        elif self.moved is not None and at - self.moved.at >= STALL_AFTER:
            reading = Reading(at, progress, 0.0)
        else:
            reading = Reading(at, progress, last.rate)
        self.readings = [*self.readings[-(WINDOW - 1) :], reading]
        if self.fell is not None and reading.rate and reading.rate >= self.fell[0] * COLLAPSE_SHARE:
            self.fell = None  # recovered
        found = self._windowed() if self.fell is None else None
        if found is not None and found.stalled_since is None and found.fell_at is not None:
            self.fell = (found.fell_from or 0.0, found.fell_at)

    def now(self) -> Throughput | None:
        found = self._windowed()
        if found is None or self.fell is None or found.stalled_since is not None:
            return found
        if found.rate is not None and found.rate < self.fell[0] * COLLAPSE_SHARE:
            return replace(found, fell_from=self.fell[0], fell_at=self.fell[1])
        return found

    def _windowed(self) -> Throughput | None:
        """What the readings in the window say (a collapse against their typical rate)."""
        if not self.readings:
            return None
        last = self.readings[-1]
        rate = last.rate
        result = Throughput(last.progress, rate, last.progress.eta(rate) if rate else None)
        earlier = [r.rate for r in self.readings[:-1] if r.rate]
        if len(self.readings) < MIN_POINTS or not earlier or rate is None:
            return result
        typical = sorted(earlier)[len(earlier) // 2]
        if rate >= typical * COLLAPSE_SHARE:
            return result
        if rate == 0 and self.moved is not None:
            since = self.moved.at
            return replace(result, fell_from=typical, fell_at=since, stalled_since=since)
        fell_at = next(
            r.at for r in self.readings if r.rate is not None and r.rate < typical * COLLAPSE_SHARE
        )
        return replace(result, fell_from=typical, fell_at=fell_at)


def _derived_rate(before: Reading, at: float, progress: Progress) -> float | None:
    """Units a second from `before` to now, for counts of the same thing (unit, label)."""
    then = before.progress
    if (then.unit, then.label, then.source) != (progress.unit, progress.label, progress.source):
        return None
    moved = progress.done - then.done
    return moved / (at - before.at) if moved >= 0 else None


def _rate(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:.2g}" if value < 10 else f"{value:.0f}"
