"""The order jobs start in and the GPUs they get, through the assembled coordinator in process,
on a real store (SQLite and PostgreSQL), with agents that run nothing (tests/harness.py): equal
priority starts in submission order and an array's tasks from the lowest index up, a higher
priority starts first, no GPU is ever given to two jobs at once, an array's %N limit holds, and
a cancel racing with an array's tasks starting reaches every task. (These were end-to-end tests
with real agents; nothing in them crossed a process boundary that other tests do not cover.)"""

from __future__ import annotations

import itertools

from harness import FakeAgent, InProcessClient, eventually, passes_ran, run, until

from gpuq.coordinator.server import Coordinator
from gpuq.domain.states import JobState
from gpuq.store.api import Store
from gpuq.v1 import agent_pb2 as apb


def task_of(launch: apb.JobLaunch) -> tuple[int, int | None]:
    """(the array's id, the task's index), or (the job's id, None) for a job of its own."""
    if launch.HasField("array_task_id"):
        return launch.array_job_id, launch.array_task_id
    return launch.job_id, None


def test_equal_priority_starts_in_submission_order(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", "1xA100-80GB").connect()
        alice = InProcessClient(co, "alice")
        blocker = await alice.submit(gpus=1)
        await agent.started(blocker)
        singles = [await alice.submit(gpus=1, hold=True) for _ in range(8)]
        array = await alice.submit(gpus=1, array="0-5", hold=True)
        await alice.release(array, *reversed(singles))  # released in reverse: order is id's
        agent.end(blocker)
        while len(agent.launches) < 1 + 8 + 6:  # one GPU: one job at a time
            await until(lambda: agent.running)
            agent.end_all()
        order = [task_of(launch) for launch in agent.launches[1:]]
        assert order[:8] == [(job, None) for job in singles]
        assert order[8:] == [(array, task) for task in range(6)], "lowest index first"
        await alice.wait_state(array, "completed")
        assert await alice.array_states(array) == {"completed": 6}

    run(store, body)


def test_higher_priority_starts_first(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        a = await FakeAgent(co, "a", "4xA100-80GB").connect()
        b = await FakeAgent(co, "b", "2xL4-24GB").connect()
        alice = InProcessClient(co, "alice")
        blockers = [await alice.submit(gpus=g) for g in (4, 2)]
        await a.started(blockers[0])
        await b.started(blockers[1])
        low = [await alice.submit(gpus=1, qos="low") for _ in range(6)]
        high = [await alice.submit(gpus=1, qos="high") for _ in range(6)]
        a.end(blockers[0])
        b.end(blockers[1])
        started: list[int] = []
        while len(started) < 12:
            await until(lambda: a.running or b.running)
            started += a.end_all() + b.end_all()
        assert set(started[:6]) == set(high), "a low-priority job started before a high one"
        done = {j: await alice.wait_state(j, "completed") for j in low + high}
        # the scheduler's start times
        last_high_start = max(done[j].start_time or 0 for j in high)
        first_low_start = min(done[j].start_time or 0 for j in low)
        assert last_high_start <= first_low_start, "a low-priority job started before a high one"

    run(store, body)


def test_no_gpu_is_ever_held_by_two_overlapping_jobs(store: Store) -> None:
    shapes = [1, 2, 1, 3, 1, 2, 2, 1, 4, 1, 1, 2, 1, 1]

    async def body(co: Coordinator) -> None:
        agents = [
            await FakeAgent(co, "a", "4xA100-80GB").connect(),
            await FakeAgent(co, "b", "2xL4-24GB").connect(),
        ]
        alice = InProcessClient(co, "alice")
        ids = [await alice.submit(gpus=g) for g in shapes]
        where: dict[int, tuple[FakeAgent, apb.JobLaunch]] = {}
        ended = 0
        while ended < len(ids):
            await until(lambda: any(agent.running for agent in agents))
            for agent in agents:
                where.update((i, (agent, launch)) for i, launch in agent.running.items())
                running = list(agent.running.items())
                for (x, rx), (y, ry) in itertools.combinations(running, 2):
                    shared = set(rx.gpus) & set(ry.gpus)
                    assert not shared, f"jobs {x} and {y} both hold {shared}"
            oldest = min((a for a in agents if a.running), key=lambda a: min(a.running))
            oldest.end(min(oldest.running))  # one job ends at a time, the first to start
            ended += 1
        assert sorted(where) == sorted(ids)
        for job_id, gpus in zip(ids, shapes, strict=True):
            agent, launch = where[job_id]
            assert len(launch.gpus) == gpus
            assert set(launch.gpus) <= set(agent.uuids)
            job = await alice.wait_state(job_id, "completed")
            assert (job.node, job.gpus) == (agent.node, tuple(launch.gpus))

    run(store, body)


def test_array_limit_is_never_exceeded(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agents = [
            await FakeAgent(co, "a", "4xA100-80GB").connect(),
            await FakeAgent(co, "b", "2xL4-24GB").connect(),
        ]
        alice = InProcessClient(co, "alice")
        array = await alice.submit(gpus=1, array="0-5%2")
        peak = 0
        while sum(len(a.launches) for a in agents) < 6 or any(a.running for a in agents):
            await until(lambda: any(a.running for a in agents))
            await passes_ran(co)  # a pass that would start one task too many has run
            running = sum(len(a.running) for a in agents)
            peak = max(peak, running)
            assert running <= 2, f"{running} tasks ran at once"
            agent = next(a for a in agents if a.running)
            agent.end(min(agent.running))
        assert peak == 2, f"{peak} tasks ran at once"
        assert sorted(task_of(launch) for a in agents for launch in a.launches) == [
            (array, task) for task in range(6)
        ]
        assert (await alice.wait_state(array, "completed")).state is JobState.COMPLETED

    run(store, body)


def test_cancelling_an_array_while_its_tasks_start_reaches_every_task(store: Store) -> None:
    """Tasks are split off the array's record as they start; a cancel racing with that must
    still end every task (none may slip back into the queue)."""

    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", finish=True).connect()  # quick jobs
        alice = InProcessClient(co, "alice")
        for _ in range(4):
            array = await alice.submit(array="0-999")
            await until(lambda: len(agent.launches) >= 5)
            await alice.cancel(array)

            async def over(array: int = array) -> dict[str, int] | None:
                states = await alice.array_states(array)
                return states if states.get("running", 0) == 0 else None

            states = await eventually(over)
            assert set(states) <= {"cancelled", "completed"}, states
            assert sum(states.values()) == 1000
            agent.launches.clear()

    run(store, body)
