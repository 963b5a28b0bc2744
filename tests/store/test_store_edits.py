"""The store's edits (gpuq update), requeues of ended jobs (gpuq requeue) and batched state
changes (bulk hold/release/cancel), against SQLite and PostgreSQL."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import make_spec

from gpuq.domain.array_specs import ArraySpec
from gpuq.domain.model import JobResult
from gpuq.domain.states import JobState
from gpuq.errors import IllegalTransition
from gpuq.store.api import Store
from gpuq.store.records import JobEdit, JobQuery, JobStart, NewJob, StateChange


def submit(store: Store, count: int = 1, **options: object) -> list[int]:
    new = [NewJob(make_spec(f"j{i}", **options), "alice", "normal", 10) for i in range(count)]
    with store.transaction() as tx:
        return [i for group in tx.add_jobs(new, 100.0) for i in group]


def test_an_edit_rewrites_the_spec_and_its_columns_with_an_event(store: Store) -> None:
    [job_id] = submit(store, gpus=1, hold=True)
    old = store.get_job(job_id)
    spec = replace(
        old.spec,
        name="renamed",
        nice=5,
        resources=replace(old.spec.resources, time_limit=600, gpus=2, mem=2**30),
    )
    with store.transaction() as tx:
        tx.edit_jobs([JobEdit(job_id, spec, "low", 95, "updated by alice: time")], 200.0)
    job = store.get_job(job_id)
    assert (job.spec, job.qos, job.priority, job.state) == (spec, "low", 95, JobState.HELD)
    [got] = store.list_jobs(JobQuery(job_ids=(job_id,)))
    assert got.name == "renamed" and got.spec.resources.time_limit == 600
    last = store.events(job_id)[-1]
    assert (last.from_state, last.to_state, last.reason, last.at) == (
        JobState.HELD,
        JobState.HELD,
        "updated by alice: time",
        200.0,
    )


def test_a_running_job_is_not_edited_and_nothing_of_the_batch_is_kept(store: Store) -> None:
    waiting, running = submit(store, 2, gpus=1)
    with store.transaction() as tx:
        tx.start_jobs([JobStart(running, "n1", ("GPU-1",))], 150.0)
    specs = {i: store.get_job(i).spec for i in (waiting, running)}
    edits = [JobEdit(i, replace(specs[i], nice=3), "normal", 7, "x") for i in (waiting, running)]
    with pytest.raises(IllegalTransition), store.transaction() as tx:
        tx.edit_jobs(edits, 200.0)
    assert store.get_job(waiting).spec.nice == 0
    assert len(store.events(waiting)) == 1


def test_a_split_array_task_is_edited_alone(store: Store) -> None:
    [array] = submit(store, array=ArraySpec((0, 1, 2)))
    with store.transaction() as tx:
        _, ids = tx.split_tasks(array, [0], 110.0)
    record = store.get_job(array)
    spec = replace(record.spec, nice=9)
    with store.transaction() as tx:
        tx.edit_jobs([JobEdit(ids[0], spec, "normal", 1, "updated")], 200.0)
    assert store.get_job(ids[0]).spec.nice == 9
    assert store.get_job(array).spec.nice == 0  # the record keeps its own


@pytest.mark.parametrize("hold", [False, True])
def test_ended_jobs_are_requeued_with_the_same_id(store: Store, hold: bool) -> None:
    failed, cancelled = submit(store, 2, gpus=1)
    with store.transaction() as tx:
        tx.start_jobs([JobStart(failed, "n1", ("GPU-1",))], 150.0)
        tx.transition(
            [
                StateChange(failed, JobState.FAILED, "exit 3", JobResult(3, None, "exit 3")),
                StateChange(cancelled, JobState.CANCELLED, "cancelled by alice"),
            ],
            160.0,
        )
    with store.transaction() as tx:
        tx.requeue_jobs([failed, cancelled], "requeued by alice", 200.0, hold=hold)
    after = JobState.HELD if hold else JobState.PENDING
    for job_id in (failed, cancelled):
        job = store.get_job(job_id)
        assert (job.state, job.requeue_count, job.node, job.end_time, job.result) == (
            after,
            1,
            None,
            None,
            None,
        )
        steps = [(e.from_state, e.to_state) for e in store.events(job_id)][-2 if hold else -1 :]
        assert steps[-1][1] is after and steps[0][1] is JobState.PENDING
    assert store.live_allocations() == []
    # and it starts again
    with store.transaction() as tx:
        if hold:
            tx.transition([StateChange(failed, JobState.PENDING, "released")], 210.0)
        tx.start_jobs([JobStart(failed, "n1", ("GPU-1",))], 220.0)
    assert store.get_job(failed).start_count == 2


def test_live_jobs_are_not_requeued_by_the_store(store: Store) -> None:
    pending, other = submit(store, 2)
    with store.transaction() as tx:
        tx.transition([StateChange(other, JobState.CANCELLED, "x")], 150.0)
    with pytest.raises(IllegalTransition), store.transaction() as tx:
        tx.requeue_jobs([other, pending], "requeued", 200.0)
    assert store.get_job(other).state is JobState.CANCELLED  # all or none


def test_a_bulk_release_is_one_transition(store: Store) -> None:
    ids = submit(store, 500, hold=True)
    with store.transaction() as tx:
        tx.transition([StateChange(i, JobState.PENDING, "released by alice") for i in ids], 200.0)
    jobs = store.list_jobs(JobQuery(job_ids=tuple(ids)))
    assert {j.state for j in jobs} == {JobState.PENDING}
    assert store.count_jobs([JobState.PENDING]) == {JobState.PENDING: 500}
