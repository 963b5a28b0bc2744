"""Idempotent submission in the store (SQLite and PostgreSQL): a request key names one job."""

from __future__ import annotations

import threading

from helpers import make_spec

from gpuq.domain.array_specs import ArraySpec
from gpuq.domain.states import JobState
from gpuq.store.api import Store
from gpuq.store.records import JobQuery, NewJob


def keyed(user: str = "alice", key: str | None = "k1", name: str = "job") -> NewJob:
    return NewJob(make_spec(name, gpus=1), user, "normal", 0, key=key)


def all_jobs(store: Store) -> list[int]:
    return [j.id for j in store.list_jobs(JobQuery())]


def test_the_same_key_twice_is_one_job_with_one_id(store: Store) -> None:
    with store.transaction() as tx:
        first, created = tx.add_job(keyed(), 1.0)
    assert created
    with store.transaction() as tx:
        again, created_again = tx.add_job(keyed(name="other"), 2.0)
    assert (again, created_again) == (first, False)
    assert all_jobs(store) == first
    assert store.get_job(first[0]).spec.name == "job"
    assert [e.to_state for e in store.events(first[0])] == [JobState.PENDING]
    assert store.submitted("alice", "k1") == first
    # a later submission is unaffected by the one taken back out
    with store.transaction() as tx:
        [[third]] = tx.add_jobs([keyed(key="k2")], 3.0)
    assert all_jobs(store) == [first[0], third]


def test_the_same_key_twice_in_one_transaction_is_one_job(store: Store) -> None:
    array = NewJob(make_spec(array=ArraySpec((0, 1, 2))), "alice", "normal", 0, key="a")
    with store.transaction() as tx:
        ids = tx.add_jobs([array, array, keyed(key="b")], 1.0)
    assert ids[0] == ids[1] != ids[2]
    assert sorted(all_jobs(store)) == sorted({*ids[0], *ids[2]})
    assert store.get_job(ids[0][0]).tasks == (0, 1, 2)


def test_different_users_with_the_same_key_get_two_jobs(store: Store) -> None:
    with store.transaction() as tx:
        [alice], created_a = tx.add_job(keyed("alice"), 1.0)
        [bob], created_b = tx.add_job(keyed("bob"), 1.0)
    assert created_a and created_b and alice != bob
    assert store.submitted("alice", "k1") == [alice]
    assert store.submitted("bob", "k1") == [bob]
    assert store.submitted("carol", "k1") is None


def test_no_key_is_a_new_job_every_time(store: Store) -> None:
    with store.transaction() as tx:
        ids = tx.add_jobs([keyed(key=None), keyed(key=None)], 1.0)
    assert len({i for group in ids for i in group}) == 2


def test_two_racing_requests_with_one_key_make_one_job(store: Store) -> None:
    results: list[tuple[list[int], bool]] = []
    start = threading.Barrier(2)

    def submit() -> None:
        start.wait()
        with store.transaction() as tx:
            results.append(tx.add_job(keyed(), 1.0))

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 2
    assert results[0][0] == results[1][0]
    assert sorted(created for _, created in results) == [False, True]
    assert all_jobs(store) == results[0][0]


def test_purged_keys_are_forgotten_but_their_jobs_stay(store: Store) -> None:
    with store.transaction() as tx:
        [old], _ = tx.add_job(keyed(key="old"), 100.0)
        [recent], _ = tx.add_job(keyed(key="recent"), 200.0)
    with store.transaction() as tx:
        assert tx.purge_submission_keys(before=150.0) == 1
    assert store.submitted("alice", "old") is None
    assert store.submitted("alice", "recent") == [recent]
    assert sorted(all_jobs(store)) == [old, recent]
    with store.transaction() as tx:
        [new], created = tx.add_job(keyed(key="old"), 300.0)
    assert created and new not in (old, recent)
