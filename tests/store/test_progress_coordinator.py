"""Running jobs' progress through the assembled coordinator in process, on a real store, with a
clock moved by hand and an agent that runs nothing and says what its jobs' output shows
(Heartbeat.progress): the throughput and ETA in `gpuq show` and listings for the owner and
admins only (progress comes from the job's private output), a collapse flagged, readings of
another node or start ignored, and everything forgotten once the job stops running. (A real
agent reading a real job's output: tests/e2e/test_progress_e2e.py.)"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from harness import Clock, FakeAgent, InProcessClient, eventually, run

from gpuq.coordinator.server import Coordinator
from gpuq.coordinator.workload.idle_rules import clock_text
from gpuq.store.api import Store
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import queue_pb2
from gpuq.v1 import types_pb2 as pb


def bar(job: int, attempt: int, at: float, done: float, rate: float) -> apb.JobProgress:
    """What the agent reads of a tqdm bar `done/1000 [..., RATEit/s]`."""
    return apb.JobProgress(
        job_id=job,
        attempt=attempt,
        at=at,
        done=done,
        total=1000,
        rate=rate,
        unit="it",
        source="tqdm",
    )


Body = Callable[[Coordinator, Clock, FakeAgent, InProcessClient], Awaitable[None]]


def on_a_node(store: Store, body: Body) -> None:
    clock = Clock()

    async def main(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", 2).connect()
        await body(co, clock, agent, InProcessClient(co, "alice"))

    run(store, main, clock=clock)


async def running_job(agent: FakeAgent, alice: InProcessClient) -> tuple[int, int]:
    job = await alice.submit("python train.py", gpus=1)
    launch = await agent.started(job)
    await alice.wait_state(job, "running")
    return job, launch.attempt


async def shown(client: InProcessClient, job: int) -> pb.Job:
    message, _ = await client.detail(job)
    return message


async def listed_json(co: Coordinator, client: InProcessClient, job: int) -> dict[str, object]:
    texts, _ = await co.queries.list_jobs_json(client.caller, queue_pb2.ListJobsRequest())
    [entry] = [e for e in map(json.loads, texts) if int(e["id"]) == job]
    return entry  # type: ignore[no-any-return]


def test_the_owner_and_admins_see_a_jobs_throughput_and_eta_others_do_not(store: Store) -> None:
    async def body(co: Coordinator, clock: Clock, agent: FakeAgent, alice: InProcessClient) -> None:
        job, attempt = await running_job(agent, alice)
        assert not (await shown(alice, job)).HasField("progress")  # nothing read yet
        agent.beat(progress=[bar(job, attempt, clock(), 120, 3.2)])

        async def progress() -> pb.JobThroughput | None:
            message = await shown(alice, job)
            return message.progress if message.HasField("progress") else None

        seen = await eventually(progress)
        assert (seen.done, seen.total, seen.fraction, seen.unit) == (120, 1000, 0.12, "it")
        assert seen.rate == 3.2 and abs(seen.eta - 880 / 3.2) < 1e-6
        assert (seen.source, seen.read_at, seen.collapse) == ("tqdm", clock(), "")
        root = InProcessClient(co, "root", admin=True)
        assert (await shown(root, job)).progress == seen
        # bob may not read alice's output: no progress, in show or in listings
        bob = InProcessClient(co, "bob")
        assert not (await shown(bob, job)).HasField("progress")
        [theirs] = await bob.list_raw()
        assert not theirs.HasField("progress")
        assert "progress" not in await listed_json(co, bob, job)
        [mine] = await alice.list_raw()
        assert mine.progress == seen
        entry = await listed_json(co, alice, job)
        assert entry["progress"] == {
            "done": 120.0,
            "total": 1000.0,
            "fraction": 0.12,
            "unit": "it",
            "source": "tqdm",
            "rate": 3.2,
            "eta": seen.eta,
            "read_at": clock(),
        }

    on_a_node(store, body)


def test_a_throughput_collapse_is_flagged_for_the_owner_with_its_time(store: Store) -> None:
    async def body(co: Coordinator, clock: Clock, agent: FakeAgent, alice: InProcessClient) -> None:
        job, attempt = await running_job(agent, alice)
        done = 0.0
        for _ in range(4):  # steady at 3.2 it/s
            clock.advance(5)
            done += 16
            agent.beat(progress=[bar(job, attempt, clock(), done, 3.2)])
        clock.advance(5)
        fell_at = clock()
        agent.beat(progress=[bar(job, attempt, fell_at, done + 0.5, 0.1)])
        line = f"throughput fell from 3.2 to 0.1 it/s at {clock_text(fell_at)}"

        async def flags() -> list[str]:
            return list((await shown(alice, job)).flags)

        assert await eventually(flags) == [line]
        assert (await shown(alice, job)).progress.collapse == line
        [mine] = await alice.list_raw()
        assert list(mine.flags) == [line]
        entry = await listed_json(co, alice, job)
        assert entry["flags"] == [line] and entry["progress"]["collapse"] == line  # type: ignore[index]
        bob = InProcessClient(co, "bob")
        assert list((await shown(bob, job)).flags) == []  # a figure of alice's output
        [theirs] = await bob.list_raw()
        assert list(theirs.flags) == []
        # back to speed: the flag goes
        for _ in range(3):
            clock.advance(5)
            done += 16
            agent.beat(progress=[bar(job, attempt, clock(), done, 3.2)])

        async def cleared() -> bool:
            return not await flags()

        await eventually(cleared)

    on_a_node(store, body)


def test_readings_of_another_node_or_start_are_ignored_and_an_end_forgets(store: Store) -> None:
    async def body(co: Coordinator, clock: Clock, agent: FakeAgent, alice: InProcessClient) -> None:
        other = await FakeAgent(co, "b", 0).connect()
        job, attempt = await running_job(agent, alice)
        other.beat(progress=[bar(job, attempt, clock(), 500, 9.0)])  # not its node
        agent.beat(progress=[bar(job, attempt + 1, clock(), 600, 9.0)])  # another start
        agent.beat(progress=[apb.JobProgress(job_id=job, done=float("nan"))])  # nonsense
        assert not (await shown(alice, job)).HasField("progress")
        assert co.progress.shown(job, attempt) is None
        agent.beat(progress=[bar(job, attempt, clock(), 700, 9.0)])
        assert (await shown(alice, job)).progress.done == 700
        agent.end(job)
        await alice.wait_state(job, "completed")
        assert not (await shown(alice, job)).HasField("progress")
        assert co.progress.shown(job, attempt) is None and job not in co.progress._tracked

    on_a_node(store, body)
