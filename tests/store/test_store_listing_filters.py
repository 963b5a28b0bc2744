"""The listing filters in SQL (`gpuq history --since --until --state --user --name -w`): the
database filters and limits, so a history of millions is never loaded to be filtered. Runs on
SQLite (names by GLOB) and PostgreSQL (names by a POSIX regex): both select what fnmatch does."""

from __future__ import annotations

import fnmatch

import pytest
from helpers import make_spec

from gpuq.domain.model import JobResult
from gpuq.domain.states import JobState
from gpuq.store.api import Store
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


def test_a_users_recent_ends_are_an_index_range_not_their_whole_history(
    history: Store,
) -> None:
    """`gpuq status` asks for my jobs that ended in the last hour on every call: the store
    reads that hour's rows by the (user, end_time) index, not every ended job of mine (130 ms
    for a user with 200,000 of them, each call). Planned as SQLite plans it."""
    from sqlalchemy import event

    if history.engine.dialect.name != "sqlite":
        pytest.skip("the plan asserted is SQLite's (PostgreSQL plans by its statistics)")
    seen: list[tuple[str, object]] = []

    def record(*args: object) -> None:
        statement, parameters = args[2:4]
        seen.append((str(statement), parameters))

    event.listen(history.engine, "before_cursor_execute", record)
    try:
        assert ended(history, user="alice", since=1700.0, limit=5) == ["Sweep-1", "a,b"]
    finally:
        event.remove(history.engine, "before_cursor_execute", record)
    [(statement, parameters)] = [s for s in seen if "FROM jobs" in s[0] and "LIMIT" in s[0]]
    with history.engine.connect() as conn:
        plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()  # type: ignore[arg-type]
    steps = " | ".join(str(row[-1]) for row in plan)
    assert "ix_jobs_user_end_time (user=? AND end_time>?)" in steps, steps
