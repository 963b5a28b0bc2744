"""A node's GPU isolation follows its agent's heartbeats (issue 24): a job's device program
that failed to load makes the node advisory in `gpuq nodes`, with the reason, until a later
load works; a heartbeat without it (an older agent) leaves the registration's claim."""

from __future__ import annotations

from harness import FakeAgent, InProcessClient, run

from gpuq.coordinator.server import Coordinator
from gpuq.store.api import Store

FAILED = "advisory: device rules failed for job 7: cannot load a cgroup v2 device program: EPERM"


def test_the_nodes_isolation_follows_its_heartbeats(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", "2xA100-80GB").connect()
        alice = InProcessClient(co, "alice")
        [node] = alice.nodes()
        registered = node.isolation
        agent.beat()  # an older agent's heartbeat: nothing said, nothing changed
        assert alice.nodes()[0].isolation == registered
        agent.beat(isolation=FAILED)
        assert alice.nodes()[0].isolation == FAILED
        agent.beat(isolation="cgroup v2 device program")
        assert alice.nodes()[0].isolation == "cgroup v2 device program"

    run(store, body)
