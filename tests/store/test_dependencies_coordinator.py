"""Dependencies and pending reasons through the assembled coordinator in process, on a real
store (SQLite and PostgreSQL), with agents that run nothing (tests/harness.py): a job after
another starts once it ended as asked (ok, notok, any) and is cancelled when that can never
be; after an array, once every task ended, after a task (`40_1`), once that task did; and a
pending job says why it waits and what its priority is made of. (These were end-to-end
tests; what a dependency does is the coordinator's alone.)"""

from __future__ import annotations

import pytest
from harness import FakeAgent, InProcessClient, eventually, passes_ran, run, until

from gpuq.coordinator.server import Coordinator
from gpuq.domain.states import JobState
from gpuq.errors import InvalidInput
from gpuq.store.api import Store
from gpuq.v1 import types_pb2 as pb


class Timeline:
    """What ran, in order: each job's start and end, as its agents saw them (what the jobs'
    own log lines said in the end-to-end tests)."""

    def __init__(self, *agents: FakeAgent) -> None:
        self.agents = agents
        self.events: list[tuple[str, int]] = []
        self._seen = 0

    def _starts(self) -> None:
        launches = [launch for agent in self.agents for launch in agent.launches]
        for launch in launches[self._seen :]:
            self.events.append(("start", launch.job_id))
        self._seen = len(launches)

    async def step(self, exit_code: int = 0, by_task: bool = False) -> None:
        """Once something runs: every running job ends (exit code `exit_code`, or with
        `by_task` its array task's index, as `exit $GPUQ_ARRAY_TASK_ID`)."""
        await until(lambda: any(agent.running for agent in self.agents))
        self._starts()
        for agent in self.agents:
            for job_id, launch in list(agent.running.items()):
                agent.end(job_id, launch.array_task_id if by_task else exit_code)
                self.events.append(("end", job_id))

    def index(self, kind: str, job_id: int) -> int:
        return self.events.index((kind, job_id))


async def task_ids(alice: InProcessClient, array: int, tasks: range) -> list[int]:
    return [(await alice.get(f"{array}_{t}")).id for t in tasks]


def test_after_an_array_waits_for_every_task_and_after_a_task_for_that_task(
    store: Store,
) -> None:
    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", "4xA100-80GB").connect()
        timeline = Timeline(agent)
        alice = InProcessClient(co, "alice")
        array = await alice.submit(array="0-3%1", gpus=1)
        after_all = await alice.submit(after=[str(array)])
        after_one = await alice.submit(after=[f"{array}_1:ok"])
        slurm = await alice.submit(after=[f"afterok:{array}"])
        dependents = (after_all, after_one, slurm)
        while not all(("end", j) in timeline.events for j in dependents):
            await timeline.step()
        for job_id in dependents:
            assert (await alice.wait_state(job_id, "completed")).state is JobState.COMPLETED
        tasks = await task_ids(alice, array, range(4))
        assert timeline.index("start", after_one) > timeline.index("end", tasks[1])
        assert timeline.index("start", after_all) > timeline.index("end", tasks[3])
        assert timeline.index("start", slurm) > timeline.index("end", tasks[3])

        failing = await alice.submit(array="0-2")  # exit $GPUQ_ARRAY_TASK_ID
        await until(lambda: len(agent.running) == 3)  # every task off the array's record
        needs_ok = await alice.submit(after=[str(failing)])
        on_failure = await alice.submit(after=[f"{failing}:notok"])
        # the tasks end one by one, the one that holds the array's id first: while any
        # runs, both wait
        tasks = sorted(agent.running, key=lambda j: j != failing)
        for job_id in tasks[:-1]:
            agent.end(job_id, agent.running[job_id].array_task_id)
            await passes_ran(co)
            assert await alice.state(needs_ok) == await alice.state(on_failure) == "pending"
        agent.end(tasks[-1], agent.running[tasks[-1]].array_task_id)
        await agent.started(on_failure)
        agent.end(on_failure)
        job = await alice.wait_state(needs_ok, "cancelled")
        assert f"job {failing} failed (afterok)" in job.reason
        assert (await alice.wait_state(on_failure, "completed")).state is JobState.COMPLETED
        with pytest.raises(InvalidInput, match=f"{array}_9.*no such job or array task"):
            await alice.submit(after=[f"{array}_9"])

    run(store, body)


def test_dependencies_run_in_order_and_a_failed_one_cancels(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", "4xA100-80GB").connect()
        timeline = Timeline(agent)
        alice = InProcessClient(co, "alice")
        first = await alice.submit()
        second = await alice.submit(after=[f"{first}:ok"])
        while ("end", second) not in timeline.events:
            await timeline.step()
        assert (await alice.wait_state(second, "completed")).state is JobState.COMPLETED
        assert timeline.index("start", second) > timeline.index("end", first)

        failing = await alice.submit()
        needs_ok = await alice.submit(after=[str(failing)])
        on_failure = await alice.submit(after=[f"{failing}:notok"])
        anyway = await alice.submit(after=[f"{failing}:any"])
        await timeline.step(exit_code=1)  # only `failing` may start
        assert timeline.events[-2:] == [("start", failing), ("end", failing)]
        cancelled = await alice.wait_state(needs_ok, "cancelled")
        assert cancelled.reason == f"dependency can never be met: job {failing} failed (afterok)"
        while not {("end", on_failure), ("end", anyway)} <= set(timeline.events):
            await timeline.step()
        assert (await alice.wait_state(on_failure, "completed")).state is JobState.COMPLETED
        assert (await alice.wait_state(anyway, "completed")).state is JobState.COMPLETED
        assert ("start", needs_ok) not in timeline.events

    run(store, body)


def test_pending_job_says_why_and_when(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        a = await FakeAgent(co, "a", "4xA100-80GB").connect()
        await FakeAgent(co, "b", "2xL4-24GB").connect()
        alice = InProcessClient(co, "alice")
        blocker = await alice.submit(gpus=4, time="10")
        await a.started(blocker)
        waiting = await alice.submit(gpus=4, after=[str(blocker)])
        later = await alice.submit(begin="now+3600")

        async def info(job_id: int) -> pb.PendingInfo:
            return (await alice.detail(job_id))[0].pending

        async def reasons(job_id: int) -> list[str]:
            return list((await info(job_id)).reasons)

        found = await eventually(lambda: reasons(waiting))
        assert found[0] == f"dependency: waiting for job {blocker} (afterok)"
        assert any("largest free block is 2" in r for r in found)
        begin = await eventually(lambda: reasons(later))
        assert begin[0].startswith("begin time")
        detail = await info(waiting)
        assert {f.name for f in detail.factors} == {"qos", "age", "fairshare", "nice"}
        assert detail.priority > 0
        a.end(blocker)
        await a.started(waiting)
        a.end(waiting)
        assert (await alice.wait_state(waiting, "completed")).state is JobState.COMPLETED

    run(store, body)
