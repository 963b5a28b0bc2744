"""Jobs on several nodes through the assembled coordinator in process (tests/harness.py), on
SQLite and PostgreSQL: a gang start gives every node a launch with its own units, the job's
node list, one MASTER_PORT and step secret; one job, one fate (an end on any node ends the job
and stops it on the others; a lost node ends it node_fail everywhere and requeues it as one);
FailJob, srun's KillOnBadExit, for the owner only; cancel reaches every node. The processes
themselves (the script on the first node, step workers on the others) are tests/e2e's."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from harness import Clock, FakeAgent, InProcessClient, eventually, passes_ran, run

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.server import Coordinator
from gpuq.domain.model import JobSpec, Resources
from gpuq.domain.states import JobState
from gpuq.errors import PermissionDenied, Unsatisfiable
from gpuq.store.api import Store
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb


def gang_spec(nodes: int = 2, gpus: int = 2, **resources: object) -> JobSpec:
    return JobSpec(
        name="train",
        script="#!/bin/sh\nsrun true\n",
        workdir="/tmp",
        resources=Resources(gpus=gpus, nodes=nodes, **resources),  # type: ignore[arg-type]
    )


async def two_nodes(co: Coordinator, gpus: int = 2) -> list[FakeAgent]:
    return [await FakeAgent(co, name, gpus).connect() for name in ("n0", "n1")]


async def launches(agents: list[FakeAgent], job_id: int) -> dict[str, apb.JobLaunch]:
    for agent in agents:
        await agent.started(job_id)
    return {a.node: a.running[job_id] for a in agents}


def stops_of(agent: FakeAgent, job_id: int) -> list[apb.StopJob]:
    return [s for s in agent.stops if s.job_id == job_id]


def test_a_gang_start_launches_on_every_node_with_its_own_units(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agents = await two_nodes(co)
        alice = InProcessClient(co, "alice")
        [job_id] = await alice.submit_spec(gang_spec())
        sent = await launches(agents, job_id)
        job = await alice.wait_state(job_id, "running")
        assert set(job.nodes) == {"n0", "n1"} and job.node == job.nodes[0]
        first = sent[job.nodes[0]]
        other = sent[job.nodes[1]]
        # the same node list, one address per node, each node its index
        assert list(first.nodes) == list(other.nodes) == list(job.nodes)
        assert len(first.node_addrs) == 2
        assert (first.node_index, other.node_index) == (0, 1)
        # each node its own two units, disjoint; the job holds all four
        for agent in agents:
            assert sorted(sent[agent.node].gpus) == sorted(agent.uuids)
        assert sorted(job.gpus) == sorted(agents[0].uuids + agents[1].uuids)
        # one MASTER_PORT (even, in the jobs' range) and one step secret for both
        assert first.master_port == other.master_port and first.master_port % 2 == 0
        assert 20000 <= first.master_port <= 29998
        assert re.fullmatch("[0-9a-f]{64}", first.step_key)
        assert first.step_key == other.step_key
        # nothing is left for a one-GPU job: it waits
        [small] = await alice.submit_spec(gang_spec(nodes=1, gpus=1))
        await passes_ran(co)
        assert await alice.state(small) == "pending"

    run(store, body)


def test_a_gang_job_waits_until_every_node_has_room(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agents = await two_nodes(co)
        alice = InProcessClient(co, "alice")
        [blocker] = await alice.submit_spec(gang_spec(nodes=1, gpus=1))
        await eventually(lambda: _some(agents, blocker))
        holder = next(a for a in agents if blocker in a.running)
        [gang] = await alice.submit_spec(gang_spec())
        await passes_ran(co)
        assert await alice.state(gang) == "pending"  # never a partial start
        assert all(gang not in a.running for a in agents)
        holder.end(blocker)
        await launches(agents, gang)

    run(store, body)


async def _some(agents: list[FakeAgent], job_id: int) -> bool | None:
    return True if any(job_id in a.running for a in agents) else None


def test_an_end_on_any_node_ends_the_job_and_stops_the_others(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agents = await two_nodes(co)
        alice = InProcessClient(co, "alice")
        [job_id] = await alice.submit_spec(gang_spec())
        sent = await launches(agents, job_id)
        job = await alice.wait_state(job_id, "running")
        follower = next(a for a in agents if a.node == job.nodes[1])
        leader = next(a for a in agents if a.node == job.nodes[0])
        follower.end(job_id, exit_code=1)  # its step worker died
        ended = await alice.wait_state(job_id, "failed")
        assert ended.result is not None and ended.result.exit_code == 1
        await eventually(lambda: _true(stops_of(leader, job_id)))
        [stop] = stops_of(leader, job_id)
        assert stop.attempt == sent[leader.node].attempt
        assert stop.grace <= 5
        assert not stops_of(follower, job_id)  # its part had ended: nothing to stop

    run(store, body)


async def _true(value: object) -> bool | None:
    return True if value else None


def test_a_lost_node_ends_the_job_everywhere_and_requeues_it_as_one(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agents = await two_nodes(co)
        alice = InProcessClient(co, "alice")
        [job_id] = await alice.submit_spec(gang_spec())
        await launches(agents, job_id)
        job = await alice.wait_state(job_id, "running")
        lost = next(a for a in agents if a.node == job.nodes[1])
        alive = next(a for a in agents if a.node == job.nodes[0])
        lost.disconnect()
        await co.endings.node_lost(lost.node, "no word from its agent for 300 s")
        await eventually(lambda: _true(stops_of(alive, job_id)))
        [stop] = stops_of(alive, job_id)
        assert stop.end_state == "node_fail"
        again = await alice.wait_state(job_id, "pending", "running")
        assert again.requeue_count == 1  # requeued once, as one job
        assert job_id not in alive.running  # its part was stopped

    run(store, body, CoordinatorSettings())


def test_fail_job_ends_a_running_job_on_every_node_for_its_owner_only(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agents = await two_nodes(co)
        alice = InProcessClient(co, "alice")
        bob = InProcessClient(co, "bob")
        [job_id] = await alice.submit_spec(gang_spec())
        await launches(agents, job_id)
        with pytest.raises(PermissionDenied):
            await bob.fail_job(job_id, "not yours")
        assert await alice.state(job_id) == "running"
        outcome = await alice.fail_job(job_id, "task 1 on n1 exited 1 at 12:03:04")
        assert outcome.done, outcome.message
        ended = await alice.wait_state(job_id, "failed")
        assert ended.reason == "task 1 on n1 exited 1 at 12:03:04"
        for agent in agents:
            await eventually(lambda agent=agent: _true(stops_of(agent, job_id)))
        again = await alice.fail_job(job_id, "twice")
        assert not again.done and "not running" in again.message
        assert (await alice.wait_state(job_id, "failed")).reason.startswith("task 1")

    run(store, body)


def test_cancel_reaches_every_node(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agents = await two_nodes(co)
        alice = InProcessClient(co, "alice")
        [job_id] = await alice.submit_spec(gang_spec())
        await launches(agents, job_id)
        await alice.cancel(job_id)
        for agent in agents:
            await eventually(lambda agent=agent: _true(stops_of(agent, job_id)))
        await alice.wait_state(job_id, "cancelled")

    run(store, body)


def test_jobs_sharing_a_node_get_different_master_ports(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        [agent] = [await FakeAgent(co, "n0", 4).connect()]
        alice = InProcessClient(co, "alice")
        ids = [(await alice.submit_spec(gang_spec(nodes=1, gpus=1)))[0] for _ in range(4)]
        ports = [(await agent.started(i)).master_port for i in ids]
        assert len(set(ports)) == 4, ports

    run(store, body)


def test_a_job_is_charged_for_every_gpu_on_every_node(store: Store) -> None:
    clock = Clock()

    async def body(co: Coordinator) -> None:
        agents = await two_nodes(co)
        alice = InProcessClient(co, "alice")
        [job_id] = await alice.submit_spec(gang_spec())
        await launches(agents, job_id)
        clock.advance(100)
        agents[0].end(job_id)
        await alice.wait_state(job_id, "completed")
        used, _ = co.inputs.usage["alice"]
        assert used == pytest.approx(400, rel=0.01)  # 4 GPUs x 100 s

    run(store, body, clock=clock)


def test_a_restarted_coordinator_knows_where_a_multi_node_job_runs(store: Store) -> None:
    """The nodes, MASTER_PORT and step secret of a start are kept with the job: a
    coordinator that restarts sends the same launch again to an agent that asks."""
    kept: dict[str, object] = {}

    async def first(co: Coordinator) -> None:
        agents = await two_nodes(co)
        alice = InProcessClient(co, "alice")
        [job_id] = await alice.submit_spec(gang_spec())
        sent = await launches(agents, job_id)
        job = co.jobs.jobs[job_id]
        kept.update(
            id=job_id, nodes=job.nodes, port=sent["n0"].master_port, key=sent["n0"].step_key
        )

    async def second(co: Coordinator) -> None:
        job = co.jobs.jobs[int(kept["id"])]  # type: ignore[call-overload]
        assert job.nodes == kept["nodes"]
        assert (job.master_port, job.step_key) == (kept["port"], kept["key"])
        assert [j.id for j in co.jobs.running_on("n1")] == [job.id]

    run(store, first)
    run(store, second)


def so_far(agent: FakeAgent, job_id: int, peak: int, util: float) -> apb.JobSample:
    return apb.JobSample(
        job_id=job_id,
        at=agent.co.clock(),
        gpu_mem=peak,
        so_far=pb.GpuTelemetry(
            peak_gpu_mem=peak,
            util_mean=util,
            util_p95=util,
            energy=100.0,
            samples=5,
            seconds=10.0,
            units=[pb.UnitTelemetry(uuid=u, peak_mem=peak // 2) for u in agent.uuids],
        ),
    )


def test_a_jobs_telemetry_covers_every_nodes_gpus(store: Store) -> None:
    """Each node's agent measures its own units; the job keeps their sum (memory, energy)
    and their mean (utilisation), units from both nodes."""

    async def body(co: Coordinator) -> None:
        agents = await two_nodes(co)
        alice = InProcessClient(co, "alice")
        [job_id] = await alice.submit_spec(gang_spec())
        await launches(agents, job_id)
        job = await alice.wait_state(job_id, "running")
        leader = next(a for a in agents if a.node == job.nodes[0])
        follower = next(a for a in agents if a.node == job.nodes[1])
        leader.beat([so_far(leader, job_id, 4 << 30, 80.0)])
        follower.beat([so_far(follower, job_id, 2 << 30, 40.0)])
        leader.end(job_id)
        ended = await alice.wait_state(job_id, "completed")
        figures = ended.telemetry
        assert figures is not None
        assert figures.peak_gpu_mem == 6 << 30 and figures.energy == 200.0
        assert figures.util_mean == pytest.approx(60.0)
        assert {u.uuid for u in figures.units} == set(leader.uuids + follower.uuids)

    run(store, body)


def test_more_nodes_than_the_cluster_can_ever_give_is_refused_at_submission(
    store: Store,
) -> None:
    async def body(co: Coordinator) -> None:
        await two_nodes(co)
        alice = InProcessClient(co, "alice")
        with pytest.raises(Unsatisfiable, match="needs 3 nodes"):
            await alice.submit_spec(gang_spec(nodes=3))
        with pytest.raises(Unsatisfiable, match="only 2 nodes"):
            await alice.submit_spec(gang_spec(nodes=3))
        assert await alice.list_raw() == []  # nothing was created

    run(store, body)


def test_a_higher_tier_preempts_a_multi_node_job_on_every_node_and_requeues_it_once(
    store: Store,
) -> None:
    async def body(co: Coordinator) -> None:
        agents = await two_nodes(co)
        alice = InProcessClient(co, "alice")
        [low] = await alice.submit_spec(replace(gang_spec(), qos="low"))
        await launches(agents, low)
        [high] = await alice.submit_spec(replace(gang_spec(), qos="high"))
        for agent in agents:  # both parts of the victim are stopped, as preempted
            await eventually(lambda agent=agent: _true(stops_of(agent, low)))
            assert stops_of(agent, low)[0].end_state == "preempted"
        await launches(agents, high)
        again = await alice.wait_state(low, "pending")
        assert again.requeue_count == 1

    run(store, body)


def test_a_time_limit_on_one_node_ends_the_job_everywhere(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agents = await two_nodes(co)
        alice = InProcessClient(co, "alice")
        [job_id] = await alice.submit_spec(gang_spec(time_limit=60))
        sent = await launches(agents, job_id)
        assert {s.time_limit for s in sent.values()} == {60}  # each node's supervisor knows
        job = await alice.wait_state(job_id, "running")
        leader = next(a for a in agents if a.node == job.nodes[0])
        follower = next(a for a in agents if a.node == job.nodes[1])
        leader.end(job_id, signal=15, state=JobState.TIMEOUT)
        await alice.wait_state(job_id, "timeout")
        await eventually(lambda: _true(stops_of(follower, job_id)))

    run(store, body)
