"""Per-GPU history (the dashboard's heat map): what each GPU unit did, in 5-minute buckets,
and the map a range of them makes. Pure: the coordinator gathers buckets from heartbeats
(gpuq.coordinator.workload.history_buckets), the store keeps them (table gpu_usage) and sums them
into columns; this module says what a bucket and a column are and merges them into cells.

A unit no job held has no row in a bucket: it shows as free. A held unit whose jobs left it
cold shows a low utilisation: that is how idle GPUs stand out. However long the range, the map
has at most MAX_COLUMNS columns (each a whole number of buckets, a width from COLUMN_WIDTHS)
and MAX_ROWS units, so an answer's size is bounded whatever the cluster's history.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

BUCKET = 300  # seconds per stored bucket
MAX_COLUMNS = 200  # columns of one map, whatever its range
MAX_ROWS = 512  # GPU units of one map (a bigger cluster's map says it is cut)
# a column's width: the narrowest of these that fits the range in MAX_COLUMNS columns
COLUMN_WIDTHS = (300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
RANGES = {"6h": 6 * 3600, "24h": 24 * 3600, "7d": 7 * 86400}  # the dashboard's choices
DEFAULT_HISTORY_DAYS = 14.0  # [coordinator] gpu_history_days: buckets older are pruned


@dataclass(slots=True)
class UnitUse:
    """What one job did on one unit over one bucket (or, read back, one column): how many
    samples, their utilisation's sum over those that knew it, the peak memory its processes
    held there."""

    node: str
    uuid: str
    at: int  # the bucket's (or column's) start, Unix seconds
    job_id: int
    user: str
    samples: int = 0
    util_sum: float = 0.0
    util_samples: int = 0
    peak_mem: int = 0

    def add(self, util: float | None, memory: int) -> None:
        self.samples += 1
        if util is not None:
            self.util_sum += util
            self.util_samples += 1
        self.peak_mem = max(self.peak_mem, memory)

    def merge(self, other: UnitUse) -> None:
        self.samples += other.samples
        self.util_sum += other.util_sum
        self.util_samples += other.util_samples
        self.peak_mem = max(self.peak_mem, other.peak_mem)


def bucket_of(at: float) -> int:
    """The start of the bucket `at` falls in."""
    return int(at // BUCKET) * BUCKET


@dataclass(frozen=True, slots=True)
class Frame:
    """A map's columns: `columns` of `width` seconds from `start` (a multiple of `width`), the
    last one holding `now`."""

    start: int
    width: int
    columns: int

    def column(self, at: int) -> int | None:
        index = (at - self.start) // self.width
        return index if 0 <= index < self.columns else None


def frame(span: float, now: float, max_columns: int = MAX_COLUMNS) -> Frame:
    """The columns of the last `span` seconds up to `now`: at most `max_columns` of them."""
    need = max(span, BUCKET)
    width = next(
        (w for w in COLUMN_WIDTHS if math.ceil(need / w) + 1 <= max_columns),
        math.ceil(need / (max_columns - 1) / BUCKET) * BUCKET,
    )
    end = int(now // width) * width + width  # the end of the column holding now
    start = int((now - need) // width) * width
    return Frame(start, width, (end - start) // width)


@dataclass(frozen=True, slots=True)
class Cell:
    """One unit over one column: mean utilisation (None: unknown), peak memory, and the job
    that held it most there (`holders`: how many jobs did)."""

    column: int
    util: float | None
    peak_mem: int
    user: str
    job_id: int
    holders: int


@dataclass(frozen=True, slots=True)
class Unit:
    """A map's row: a unit as the node table knows it (index -1, no name: one gone since)."""

    node: str
    uuid: str
    index: int = -1
    name: str = ""
    memory: int = 0


@dataclass(frozen=True, slots=True)
class Row:
    unit: Unit
    cells: tuple[Cell, ...]  # the held columns only, in order; the others: free


@dataclass(frozen=True, slots=True)
class HistoryMap:
    frame: Frame
    rows: tuple[Row, ...]
    cut: int = 0  # units left out past MAX_ROWS
    users: dict[str, tuple[float, int]] = field(default_factory=dict)  # util sum, samples


def history_map(
    frame: Frame, units: Sequence[Unit], uses: Iterable[UnitUse], max_rows: int = MAX_ROWS
) -> HistoryMap:
    """The map of `uses` (each at a bucket's or a column's start, stored or not, summed here)
    over `frame`: a row per unit of `units` in their order, then per unit only the uses know
    (one since removed), at most `max_rows`. `users`: each holder's utilisation over the frame
    (sum and samples that knew it), for the per-user table."""
    merged: dict[tuple[str, str, int, int], UnitUse] = {}
    users: dict[str, tuple[float, int]] = {}
    for use in uses:
        column = frame.column(use.at)
        if column is None:
            continue
        key = (use.node, use.uuid, column, use.job_id)
        kept = merged.get(key)
        if kept is None:
            merged[key] = UnitUse(use.node, use.uuid, column, use.job_id, use.user)
            kept = merged[key]
        kept.merge(use)
        total, samples = users.get(use.user, (0.0, 0))
        users[use.user] = (total + use.util_sum, samples + use.util_samples)
    by_unit: dict[tuple[str, str], dict[int, list[UnitUse]]] = {}
    for (node, uuid, column, _), use in sorted(merged.items()):
        by_unit.setdefault((node, uuid), {}).setdefault(column, []).append(use)
    rows = list(units)
    known = {(u.node, u.uuid) for u in rows}
    rows += [Unit(node, uuid) for node, uuid in sorted(by_unit) if (node, uuid) not in known]
    rows.sort(key=lambda u: (u.node, u.index < 0, u.index, u.uuid))
    shown = tuple(
        Row(u, tuple(_cell(c, us) for c, us in sorted(by_unit.get((u.node, u.uuid), {}).items())))
        for u in rows[:max_rows]
    )
    return HistoryMap(frame, shown, max(0, len(rows) - max_rows), users)


def _cell(column: int, uses: list[UnitUse]) -> Cell:
    known = sum(u.util_samples for u in uses)
    util = sum(u.util_sum for u in uses) / known if known else None
    top = max(uses, key=lambda u: (u.samples, -u.job_id))
    return Cell(column, util, max(u.peak_mem for u in uses), top.user, top.job_id, len(uses))
