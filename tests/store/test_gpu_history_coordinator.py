"""The cluster's history through the assembled coordinator in process, on a real store (SQLite
and PostgreSQL), with a clock moved by hand (issue 26): heartbeats' unit samples become
per-GPU buckets, stored once each is over, and the dashboard's map shows a busy GPU hot and a
held-but-idle one cold, within its bounds whatever the range; private usage hides other
users' holders; old buckets are pruned; and the queue comes in the order the scheduler ranks
it, with its filters."""

from __future__ import annotations

import asyncio

import pytest
from harness import GIB, Clock, FakeAgent, InProcessClient, eventually, run, user

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.front.ranked_queue import queue_filter
from gpuq.coordinator.server import Coordinator
from gpuq.domain.gpu_history import MAX_COLUMNS, RANGES, UnitUse, bucket_of, frame
from gpuq.errors import InvalidInput
from gpuq.store.api import Store
from gpuq.v1 import agent_pb2 as apb

ADMIN = user("root", admin=True)


def beat(co: Coordinator, agent: FakeAgent, clock: Clock, utils: dict[int, float]) -> None:
    """A heartbeat a minute after the last: each running job's units at `utils[job]`, 4 GiB
    each; and a unit the job does not hold, which must be ignored."""
    clock.advance(60.0)
    samples = []
    for job_id, launch in agent.running.items():
        units = [apb.UnitSample(uuid=u, util=utils[job_id], memory=4 * GIB) for u in launch.gpus]
        units.append(apb.UnitSample(uuid="GPU-not-its-own", util=100.0, memory=GIB))
        samples.append(apb.JobSample(job_id=job_id, at=clock(), gpu_mem=4 * GIB, units=units))
    agent.beat(samples)


def test_heartbeats_make_a_bounded_private_history_that_is_pruned(store: Store) -> None:
    clock = Clock()
    settings = CoordinatorSettings(private_data=("usage",))

    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", 3).connect()
        alice, bob = InProcessClient(co, "alice"), InProcessClient(co, "bob")
        busy = await alice.submit(gpus=1)
        idle = await bob.submit(gpus=1)
        for job in (busy, idle):
            await agent.started(job)
            await alice.wait_state(job, "running")

        async def stored() -> list[UnitUse]:
            return await co.writer.read(lambda s: s.gpu_history(frame(3600, clock())))

        # within a bucket: shown, not written (a write per bucket, never per heartbeat)
        assert bucket_of(clock() + 120) == bucket_of(clock())
        beat(co, agent, clock, {busy: 90.0, idle: 2.0})
        await asyncio.sleep(0.05)
        assert await stored() == []
        now = await co.queries.cluster_history(ADMIN, "6h")
        assert sum(len(r.cells) for r in now.map.rows) == 2
        for _ in range(12):  # 12 minutes: two buckets over, at least
            beat(co, agent, clock, {busy: 90.0, idle: 2.0})

        rows = await eventually(stored)
        assert {(r.job_id, r.user) for r in rows} == {(busy, "alice"), (idle, "bob")}

        view = await co.queries.cluster_history(ADMIN, "6h")
        assert [r.unit.node for r in view.map.rows] == ["a"] * 3
        by_job = {c.job_id: c for r in view.map.rows for c in r.cells}
        assert set(by_job) == {busy, idle}  # the third GPU: free, no cells
        assert [r.cells for r in view.map.rows].count(()) == 1
        cells = [c for r in view.map.rows for c in r.cells]
        assert all(c.util == 90.0 for c in cells if c.job_id == busy)  # hot
        assert all(c.util == 2.0 and c.peak_mem == 4 * GIB for c in cells if c.job_id == idle)
        # the current bucket (not stored yet) is on the map too
        assert max(c.column for c in cells) == view.map.frame.column(bucket_of(clock()))
        usage = {u.user: u for u in view.users}
        assert usage["alice"].running_gpus == 1 and usage["alice"].gpu_seconds >= 12 * 60
        assert usage["bob"].util_mean == 2.0 and usage["alice"].util_mean == 90.0

        # whatever the range: at most MAX_COLUMNS columns, a cell per held column at most
        for name, span in RANGES.items():
            wide = await co.queries.cluster_history(ADMIN, name)
            assert wide.map.frame.columns <= MAX_COLUMNS
            assert wide.map.frame.columns * wide.map.frame.width >= span
            assert all(len(r.cells) <= wide.map.frame.columns for r in wide.map.rows)

        with pytest.raises(InvalidInput):
            await co.queries.cluster_history(ADMIN, "1y")

        # private usage: bob sees alice's GPU's figures but not whose it was
        seen = await co.queries.cluster_history(bob.caller, "24h")
        holders = {(c.user, c.job_id) for r in seen.map.rows for c in r.cells}
        assert holders == {("bob", idle), ("", 0)}
        assert [u.user for u in seen.users] == ["bob"]

        # two weeks later, after the jobs: the chore prunes what is past gpu_history_days
        agent.end_all()
        await alice.wait_state(busy, "completed")
        clock.advance(settings.gpu_history_days * 86400 + 3600)
        await co.history.prune()
        assert await co.writer.read(lambda s: s.gpu_history(frame(30 * 86400, clock()))) == []

    run(store, body, settings, clock)


def test_the_queue_comes_in_rank_order_with_filters(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", 1).connect()
        alice, bob = InProcessClient(co, "alice"), InProcessClient(co, "bob")
        running = await alice.submit(gpus=1, name="first")
        await agent.started(running)
        low = await alice.submit(gpus=1, name="sweep-low", qos="low")
        normal = await bob.submit(gpus=1, name="Sweep-normal")
        high = await alice.submit(gpus=1, name="train", qos="high")
        held = await bob.submit(gpus=1, name="later", hold=True)

        async def ids(**words: str) -> list[int]:
            wanted = queue_filter(
                words.get("user", ""), words.get("state", ""), "", words.get("name", "")
            )
            texts, _ = await co.queries.ranked_queue_json(ADMIN, wanted, 100)
            return [int(text.split('"id":"')[1].split('"')[0]) for text in texts]

        await alice.wait_state(running, "running")
        assert await ids() == [high, normal, low, held, running]
        assert await ids(state="pending") == [high, normal, low]
        assert await ids(user="alice") == [high, low, running]
        assert await ids(name="SWEEP") == [normal, low]  # a part of the name, in any case
        texts, more = await co.queries.ranked_queue_json(ADMIN, queue_filter("", "", "", ""), 2)
        assert len(texts) == 2 and more

    run(store, body)
