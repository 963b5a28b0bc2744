"""A job submitted to an idle queue starts in the transaction that creates it (as SLURM tries a
job at submission): it is running when the submit call returns, and the agent has its launch,
with no scheduling pass in between. Only then: a job that others wait ahead of, or one
submitted while a pass is under way, is left to a pass, and a start the store refuses leaves
the submission standing. With SQLite, whose commits run on the event loop; on PostgreSQL a
pass starts every job (gpuq.coordinator.workload.submissions). Through the assembled
coordinator in process, on a real store, with agents that run nothing (tests/harness.py)."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
from harness import FakeAgent, passes_ran, run, submit, until
from helpers import make_spec

from gpuq.coordinator.server import Coordinator
from gpuq.domain.model import Job
from gpuq.domain.states import JobState
from gpuq.scheduler.snapshot import Start
from gpuq.store.api import Store

PASS = re.compile(r"scheduling pass \d+")


def on_loop(store: Store) -> bool:
    return store.engine.dialect.name == "sqlite"


def start_cause(store: Store, job_id: int) -> str:
    [started] = [e for e in store.events(job_id) if e.to_state is JobState.RUNNING]
    return started.cause


def test_a_job_submitted_to_an_idle_queue_runs_when_the_submit_returns(store: Store) -> None:
    ids: list[int] = []

    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", "2xA100-80GB").connect()
        passes = co.loop.passes
        [job] = await submit(co, make_spec(gpus=1), "alice")
        ids.append(job)
        if on_loop(store):
            assert co.jobs.jobs[job].state is JobState.RUNNING  # no await since the reply
            assert co.loop.passes == passes
        launch = await agent.started(job)
        assert len(launch.gpus) == 1
        [second] = await submit(co, make_spec(gpus=1), "bob")  # the other GPU
        launch = await agent.started(second)
        assert set(launch.gpus) | set(agent.launches[0].gpus) == set(agent.uuids)
        ids.append(second)

    run(store, body)
    for job in ids:
        events = store.events(job)
        assert [e.to_state for e in events] == [JobState.PENDING, JobState.RUNNING]
        if on_loop(store):  # one transaction: one time, one cause
            assert events[0].at == events[1].at
            assert events[1].cause == "test"
            assert events[1].reason == "started on a"
        else:
            assert PASS.fullmatch(events[1].cause)


def test_a_submission_never_starts_ahead_of_a_job_that_waits(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", "4xA100-80GB").connect()
        [first] = await submit(co, make_spec(gpus=2), "alice")
        await agent.started(first)
        [whole] = await submit(co, make_spec(gpus=4), "alice")  # waits for the first
        await passes_ran(co)
        assert co.jobs.jobs[whole].state is JobState.PENDING
        [small] = await submit(co, make_spec(gpus=1), "bob")  # two GPUs are free
        assert co.jobs.jobs[small].state is JobState.PENDING  # a pass decides, not the submit

    run(store, body)


def test_a_submission_during_a_pass_leaves_its_start_to_a_pass(store: Store) -> None:
    ids: list[int] = []

    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", "1xA100-80GB").connect()
        passes = co.loop.passes
        async with co.scheduling.starting:  # as a pass holds it, from snapshot to memory
            [job] = await submit(co, make_spec(gpus=1), "alice")
            assert co.jobs.jobs[job].state is JobState.PENDING
            # and a pass waits for a submission that holds it: the pass the submission asked
            # for begins, takes no snapshot, and starts nothing however often the loop turns
            await until(lambda: co.loop.passes > passes)
            for _ in range(100):
                await asyncio.sleep(0)
            assert co.jobs.jobs[job].state is JobState.PENDING and not agent.launches
        await agent.started(job)
        ids.append(job)

    run(store, body)
    assert PASS.fullmatch(start_cause(store, ids[0]))


def test_a_start_the_store_refuses_leaves_the_submission_standing(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Memory and the store disagree on a unit (a backstop: with one starter at a time they
    do not): the store's check refuses the start, and the job is created all the same, for a
    pass to start once the unit is free."""
    if not on_loop(store):
        pytest.skip("PostgreSQL: no start at submission")
    ids: list[int] = []

    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", "2xA100-80GB").connect()
        [first] = await submit(co, make_spec(gpus=1), "alice")
        held = (await agent.started(first)).gpus[0]

        def taken(job: Job) -> Start:
            return Start(job.id, "a", (held,))  # a unit memory should have known was taken

        monkeypatch.setattr(co.scheduling, "start_alone", taken)
        with caplog.at_level(logging.WARNING):
            [second] = await submit(co, make_spec(gpus=1), "bob")
        assert co.jobs.jobs[second].state is JobState.PENDING
        assert f"job {second} waits for a pass" in caplog.text
        assert f"GPU {held} is already allocated to job {first}" in caplog.text
        launch = await agent.started(second)  # a pass starts it on the free unit
        assert list(launch.gpus) != [held]
        ids.extend((first, second))

    run(store, body)
    assert PASS.fullmatch(start_cause(store, ids[1]))
