"""Idempotent submission through the coordinator, on a real store (SQLite and PostgreSQL):
racing repeats, and a repeat of a job that memory lost."""

from __future__ import annotations

import asyncio
import time

import pytest
from harness import run, submit
from helpers import make_spec

from gpuq.coordinator.server import Coordinator
from gpuq.domain.states import JobState
from gpuq.errors import InvalidInput
from gpuq.store.api import Store
from gpuq.store.records import JobQuery, NewJob


def test_racing_repeats_make_one_job(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        spec = make_spec(hold=True)
        results = await asyncio.gather(*(submit(co, spec, "alice", "same") for _ in range(5)))
        assert len({tuple(r) for r in results}) == 1
        [job_id] = results[0]
        assert [j.id for j in co.queries.live_jobs()] == [job_id]
        assert await submit(co, spec, "alice", "same") == [job_id]  # from memory now
        assert await submit(co, spec, "bob", "same") != [job_id]
        with pytest.raises(InvalidInput, match="request key"):
            await submit(co, spec, "alice", "é")

    run(store, body)
    assert len(store.list_jobs(JobQuery())) == 2


def test_a_repeat_of_a_job_memory_never_saw_brings_it_back(store: Store) -> None:
    """A write committed but reported lost (and tried again) leaves the job only in the store."""

    async def body(co: Coordinator) -> None:
        with store.transaction() as tx:
            [job_id], _ = tx.add_job(NewJob(make_spec(), "alice", "normal", 0, "lost"), time.time())
        assert co.queries.live_jobs() == []
        assert await submit(co, make_spec(), "alice", "lost") == [job_id]
        assert [(j.id, j.state) for j in co.queries.live_jobs()] == [(job_id, JobState.PENDING)]

    run(store, body)
    assert len(store.list_jobs(JobQuery())) == 1
