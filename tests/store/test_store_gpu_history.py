"""The store's per-GPU history (issue 26, table gpu_usage): buckets written and merged, summed
into a map's columns by the database, pruned by age, and the GPU time users held in a range.
Runs on SQLite and PostgreSQL."""

from __future__ import annotations

from helpers import make_spec

from gpuq.domain.gpu_history import BUCKET, MAX_COLUMNS, RANGES, Unit, UnitUse, frame, history_map
from gpuq.domain.model import JobResult
from gpuq.domain.states import JobState
from gpuq.store.api import Store
from gpuq.store.records import JobStart, NewJob, StateChange

GIB = 2**30
NOW = 1_700_000_000.0 // 86400 * 86400  # a day's start (and so a bucket's and an hour's)


def use(at: float, util: float | None, mem: int, job: int = 7, uuid: str = "GPU-a") -> UnitUse:
    kept = UnitUse("n1", uuid, int(at), job, f"user{job}")
    for _ in range(3):
        kept.add(util, mem)
    return kept


def test_buckets_are_summed_into_columns_and_a_second_part_adds_up(store: Store) -> None:
    # a day of 5-minute buckets on one unit: util 10 % then 90 % (each hour: a column of 24 h)
    uses = [use(NOW - 86400 + i * BUCKET, 10.0 if i < 144 else 90.0, i * GIB) for i in range(288)]
    with store.transaction() as tx:
        tx.add_gpu_usage(uses)
    # the last bucket again (a part written when a coordinator stopped, then the rest)
    with store.transaction() as tx:
        tx.add_gpu_usage([use(NOW - BUCKET, None, 500 * GIB)])
    day = frame(RANGES["24h"], NOW)
    assert day.columns <= MAX_COLUMNS and day.width == 600
    read = store.gpu_history(day)
    assert len(read) == 144  # two buckets a column, every column of the day
    assert all(r.samples == 6 for r in read[:-1])
    last = max(read, key=lambda r: r.at)
    assert (last.samples, last.util_samples, last.peak_mem) == (9, 6, 500 * GIB)
    assert last.util_sum == 6 * 90.0

    week = frame(RANGES["7d"], NOW)
    assert week.columns <= MAX_COLUMNS and week.width == 3600
    mapped = history_map(week, [Unit("n1", "GPU-a", 0, "A100", 80 * GIB)], store.gpu_history(week))
    [row] = mapped.rows
    assert len(row.cells) == 24 and mapped.cut == 0
    assert row.cells[0].util == 10.0 and row.cells[-1].util == 90.0
    assert (row.cells[-1].user, row.cells[-1].job_id) == ("user7", 7)
    # the hours before the day started: free (no cell at all)
    assert row.cells[0].column >= week.columns - 25


def test_a_shared_unit_shows_its_main_holder_and_a_bounded_map(store: Store) -> None:
    with store.transaction() as tx:
        tx.add_gpu_usage([use(NOW, 50.0, GIB, job=1), use(NOW, 70.0, 2 * GIB, job=2)])
        tx.add_gpu_usage([use(NOW + 60 * i, 0.0, GIB, job=3, uuid=f"GPU-{i}") for i in range(5)])
    now = NOW + 10
    span = frame(RANGES["6h"], now)
    shared = [u for u in store.gpu_history(span) if u.uuid == "GPU-a"]
    [cell] = history_map(span, [], shared).rows[0].cells
    assert (cell.util, cell.peak_mem, cell.holders) == (60.0, 2 * GIB, 2)
    assert cell.job_id == 1  # as many samples: the older job
    mapped = history_map(span, [], store.gpu_history(span), max_rows=3)
    assert len(mapped.rows) == 3 and mapped.cut == 3  # six units, three shown


def test_old_buckets_are_pruned(store: Store) -> None:
    with store.transaction() as tx:
        tx.add_gpu_usage([use(NOW - 20 * 86400, 5.0, GIB), use(NOW, 5.0, GIB)])
    with store.transaction() as tx:
        assert tx.prune_gpu_usage(NOW - 14 * 86400) == 1
    everything = frame(30 * 86400, NOW)
    [kept] = store.gpu_history(everything)  # the recent one, in the column holding NOW
    assert NOW - everything.width < kept.at <= NOW


def test_held_seconds_count_only_the_part_of_a_run_in_the_range(store: Store) -> None:
    def ran(user: str, gpus: int, start: float, end: float) -> None:
        with store.transaction() as tx:
            [[job_id]] = tx.add_jobs(
                [NewJob(make_spec("t", gpus=gpus), user=user, qos="normal", priority=0)], start
            )
        units = tuple(f"{user}-{start}-{i}" for i in range(gpus))
        with store.transaction() as tx:
            tx.start_jobs([JobStart(job_id, "n1", units)], now=start)
        with store.transaction() as tx:
            done = StateChange(job_id, JobState.COMPLETED, "exit code 0", JobResult(0, None, ""))
            tx.transition([done], now=end)

    ran("alice", 2, NOW - 7200, NOW - 1800)  # 1.5 h in the last hour's range: 0.5 h counts
    ran("alice", 1, NOW - 600, NOW - 300)
    ran("bob", 1, NOW - 9000, NOW - 5000)  # ended before the range
    ran("carol", 0, NOW - 600, NOW - 300)  # no GPUs
    assert store.held_seconds(NOW - 3600) == {"alice": 2 * 1800.0 + 300.0}
