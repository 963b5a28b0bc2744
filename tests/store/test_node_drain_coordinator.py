"""A node whose agent cannot start jobs (its heartbeat says so) drains itself, as the front
door of the assembled coordinator in process shows it, on a real store (SQLite and
PostgreSQL): `gpuq nodes` says why, its running jobs go on, new jobs wait (their pending
reason names the drain) instead of being sent there, and once the agent can start jobs again
the node takes work. (Why a real agent says so, its fork server, and what the command line
prints: tests/e2e/test_node_drain_e2e.py.)"""

from __future__ import annotations

from harness import FakeAgent, InProcessClient, eventually, passes_ran, run

from gpuq.coordinator.server import Coordinator
from gpuq.store.api import Store

WHY = "the fork server cannot be restarted: test"


def test_a_node_whose_agent_cannot_start_jobs_takes_none(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", "2xA100-80GB").connect()
        alice = InProcessClient(co, "alice")
        running = await alice.submit(gpus=1)
        await agent.started(running)
        agent.beat(not_accepting=WHY)
        [node] = alice.nodes()
        assert (node.state, node.reason) == ("drained", f"drained by its agent: {WHY}")
        assert list(node.running_jobs) == [running]  # its running job stays

        waiting = await alice.submit("echo ran", gpus=1)

        async def named() -> list[str]:
            [job] = await alice.list_raw(job_ids=[waiting])
            assert job.state == "pending", (job.state, job.reason)
            return [r for r in job.pending.reasons if "node a drained by its agent" in r]

        # it waits, its reason naming the drain, and is never sent to the node
        assert await eventually(named)
        await passes_ran(co)
        _, events = await alice.detail(waiting)
        assert [e.to_state.value for e in events] == ["pending"]
        assert [launch.job_id for launch in agent.launches] == [running]
        assert await alice.state(running) == "running"

        agent.beat()  # it can start jobs again: the node takes work
        await agent.started(waiting)
        agent.end(waiting)
        job = await alice.wait_state(waiting, "completed")
        assert job.node == "a"
        [node] = alice.nodes()
        assert (node.state, node.reason) == ("up", "")

    run(store, body)
