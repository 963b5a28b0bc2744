"""The listing filters in SQL (`gpuq history --since --until --state --user --name -w`): the
database filters and limits, so a history of millions is never loaded to be filtered. Runs on
SQLite (names by GLOB) and PostgreSQL (names by a POSIX regex): both select what fnmatch does."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any

import pytest
from helpers import make_spec
from sqlalchemy import event

from gpuq.domain.model import JobResult
from gpuq.domain.states import JobState
from gpuq.errors import DoubleBooking
from gpuq.store.api import Store
from gpuq.store.node_rows import check_units_free
from gpuq.store.records import JobQuery, JobStart, NewJob, StateChange

ENDED = frozenset(s for s in JobState if not s.is_live)
# job names are letters, digits and _ . + @ = : , - (gpuq.domain.limits): the patterns below
# test that regex characters among them (. +) are literal in SQL too
NAMES = ("sweep-1", "sweep-12", "sweep-a", "train.py", "a+b", "a.b", "x=y", "a,b", "Sweep-1")


def finish(store: Store, name: str, user: str, end: float, state: JobState, node: str) -> int:
    with store.transaction() as tx:
        new = NewJob(make_spec(name), user=user, qos="normal", priority=0)
        [[job_id]] = tx.add_jobs([new], end - 10)
    with store.transaction() as tx:
        tx.start_jobs([JobStart(job_id, node, ())], now=end - 5)
    with store.transaction() as tx:
        code = 0 if state is JobState.COMPLETED else 1
        tx.transition([StateChange(job_id, state, "ended", JobResult(code, None, ""))], now=end)
    return job_id


@pytest.fixture
def history(store: Store) -> Store:
    for n, name in enumerate(NAMES):
        state = JobState.COMPLETED if n % 2 == 0 else JobState.FAILED
        finish(store, name, "alice" if n % 3 else "bob", 1000.0 + 100 * n, state, f"n{n % 2}")
    return store


def ended(store: Store, **filters: object) -> list[str]:
    query = JobQuery(states=ENDED, newest_first=True, by_end=True, **filters)  # type: ignore[arg-type]
    return [j.spec.name for j in store.list_jobs(query)]


def test_since_and_until_bound_the_end_time(history: Store) -> None:
    # ends at 1000 + 100 n; newest first; `until` is exclusive (x=y ended at 1600)
    assert ended(history, since=1300.0, until=1600.0) == ["a.b", "a+b", "train.py"]
    assert ended(history, since=1800.0) == ["Sweep-1"]
    assert ended(history, until=1000.0) == []


def test_users_states_and_nodes(history: Store) -> None:
    assert set(ended(history, users=("bob",))) == {NAMES[i] for i in range(0, len(NAMES), 3)}
    assert set(ended(history, users=("bob", "alice"))) == set(NAMES)
    assert ended(history, users=()) == []
    failed = history.list_jobs(JobQuery(states=frozenset({JobState.FAILED}), by_end=True))
    assert {j.spec.name for j in failed} == {NAMES[i] for i in range(1, len(NAMES), 2)}
    assert set(ended(history, nodes=("n1",))) == {NAMES[i] for i in range(1, len(NAMES), 2)}


@pytest.mark.parametrize(
    "pattern",
    ["sweep*", "sweep-?", "sweep-[0-9]*", "sweep-[!0-9]", "*.py", "a.b", "a+b", "a?b", "a[.+]b",
     "[!a]*", "[^a]*", "*=*", "Sweep*", "*", "nothing", "[a-c],b", "*-[]1]"]
)  # fmt: skip
def test_name_patterns_select_what_fnmatch_does(history: Store, pattern: str) -> None:
    want = {n for n in NAMES if fnmatch.fnmatchcase(n, pattern)}
    assert set(ended(history, names=(pattern,))) == want


def test_filters_combine_and_the_limit_applies_after_them(history: Store) -> None:
    found = ended(history, names=("sweep*", "*.py"), users=("alice",), limit=2)
    assert found == ["sweep-a", "sweep-12"]  # train.py is bob's
    assert ended(history, names=("sweep*",), since=1100.0, limit=1) == ["sweep-a"]


def test_live_listings_bound_the_submit_time(store: Store) -> None:
    with store.transaction() as tx:
        for at in (100.0, 200.0, 300.0):
            tx.add_jobs([NewJob(make_spec(f"j{at:.0f}"), "alice", "normal", 0)], at)
    query = JobQuery(states=frozenset({JobState.PENDING}), since=150.0, until=300.0)
    assert [j.spec.name for j in store.list_jobs(query)] == ["j200"]


def test_the_database_filters_and_limits(history: Store) -> None:
    """One SELECT of jobs carries the filters and the LIMIT: nothing is filtered after
    loading (a history of millions would be read whole)."""
    from sqlalchemy import event

    seen: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        seen.append(statement)

    event.listen(history.engine, "before_cursor_execute", record)
    try:
        ended(history, names=("sweep*",), users=("alice",), since=1.0, until=2e9, limit=1)
    finally:
        event.remove(history.engine, "before_cursor_execute", record)
    [select_jobs] = [s for s in seen if "FROM jobs" in s and "LIMIT" in s]
    for part in ("end_time >=", "end_time <", "user", "LIMIT"):
        assert part in select_jobs, part
    assert "GLOB" in select_jobs or "~" in select_jobs


def sqlite_plans(store: Store, call: Callable[[], object], table: str) -> list[str]:
    """How SQLite plans each statement on `table` that `call` runs (its steps joined by
    " | "); skips on PostgreSQL, which plans by its statistics."""
    if store.engine.dialect.name != "sqlite":
        pytest.skip("the plan asserted is SQLite's (PostgreSQL plans by its statistics)")
    seen: list[tuple[str, Any]] = []

    def record(*args: Any) -> None:
        statement, parameters = args[2:4]
        seen.append((str(statement), parameters))

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        call()
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    plans = []
    with store.engine.connect() as conn:
        for statement, parameters in seen:
            if f"FROM {table}" in statement:
                plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
                plans.append(" | ".join(str(row[-1]) for row in plan))
    assert plans, f"no statement on {table}"
    return plans


def test_a_users_recent_ends_are_an_index_range_not_their_whole_history(
    history: Store,
) -> None:
    """`gpuq status` asks for my jobs that ended in the last hour on every call: the store
    reads that hour's rows by the (user, end_time) index, not every ended job of mine (130 ms
    for a user with 200,000 of them, each call). Planned as SQLite plans it."""
    found: list[list[str]] = []
    [steps, *_] = sqlite_plans(
        history, lambda: found.append(ended(history, user="alice", since=1700.0, limit=5)), "jobs"
    )
    assert found == [["Sweep-1", "a,b"]]
    assert "ix_jobs_user_end_time (user=? AND end_time>?)" in steps, steps


def test_everyones_ends_in_a_window_are_an_index_range_not_the_whole_history(
    history: Store,
) -> None:
    """The dashboard's GPU history (held_seconds, on every view), sacct -a, report --since and
    history --since ask for everyone's jobs that ended since T: a range of the end_time index,
    not every ended job (SQLite took `state IN (every ended state)` for narrow: ~105 ms each at
    200,000 ended jobs; bench/store_plans_bench.py)."""
    with history.transaction() as tx:  # 2 GPUs for 5 s: held_seconds counts GPU jobs only
        [[job_id]] = tx.add_jobs([NewJob(make_spec("gpu", gpus=2), "bob", "normal", 0)], 1990.0)
        tx.start_jobs([JobStart(job_id, "n0", ("GPU-1", "GPU-2"))], now=1995.0)
        tx.transition([StateChange(job_id, JobState.COMPLETED, "ended")], now=2000.0)
    results: list[object] = []
    calls: list[Callable[[], object]] = [
        lambda: results.append(history.held_seconds(1700.0)),
        lambda: results.append(history.usage_report(None, 1700.0)),
        lambda: results.append(ended(history, since=1700.0)),
        lambda: results.append(ended(history, since=1100.0, until=1300.0, limit=1)),
    ]
    for call in calls:
        [steps] = sqlite_plans(history, call, "jobs")
        assert "ix_jobs_end_time (end_time>?" in steps, steps
        assert "TEMP B-TREE FOR ORDER BY" not in steps or "LIMIT" not in steps
    held, report, recent, window = results
    assert held == {"bob": 10.0}
    assert [(r.user, r.jobs) for r in report] == [("alice", 2), ("bob", 1)]  # type: ignore[attr-defined]
    assert recent == ["gpu", "Sweep-1", "a,b"]
    assert window == ["sweep-a"]


def test_everyones_newest_ends_are_read_from_the_top_not_sorted_whole(history: Store) -> None:
    """`gpuq history` (everyone's, newest first: also the dashboard's finished jobs, and with
    -w or --name) reads the newest ids first and stops at the page, rather than every ended
    job sorted by id (ix_jobs_pending_order holds them by priority: 45 ms at 200,000)."""
    found: list[list[str]] = []
    for filters in ({}, {"nodes": ("n1",)}, {"names": ("sweep*",)}):
        [steps] = sqlite_plans(
            history, lambda f=filters: found.append(ended(history, limit=2, **f)), "jobs"
        )
        assert "TEMP B-TREE" not in steps and "pending_order" not in steps, steps
    assert found == [["Sweep-1", "a,b"], ["a,b", "a.b"], ["sweep-a", "sweep-12"]]


def test_a_start_finds_live_units_by_index_not_every_allocation(history: Store) -> None:
    """Every start asks whether its units are live, inside the write transaction: a look-up
    of those units' live rows (ix_allocations_unit_live), not a read of every allocation ever
    made (21 ms at 200,000 on SQLite); the answer is the same."""
    with history.transaction() as tx:
        [[job_id]] = tx.add_jobs([NewJob(make_spec("live"), "alice", "normal", 0)], 3000.0)
        tx.start_jobs([JobStart(job_id, "n0", ("GPU-1",))], now=3001.0)

    def check(units: list[str], shared: list[str]) -> None:
        with history.engine.connect() as conn:
            check_units_free(conn, units, shared)

    for steps in sqlite_plans(history, lambda: check(["GPU-2"], ["GPU-3"]), "allocations"):
        assert "ix_allocations_unit_live (unit=? AND live=?)" in steps, steps
    with pytest.raises(DoubleBooking, match="GPU-1 is already allocated to job"):
        check(["GPU-1"], [])
    with pytest.raises(DoubleBooking, match="GPU-1 is held whole"):
        check([], ["GPU-1"])
