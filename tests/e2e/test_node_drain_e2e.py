"""A node whose agent cannot start jobs drains itself: `gpuq nodes` says why, its running jobs
go on, new jobs wait (their pending reason names the drain) instead of failing, and once the
agent can start jobs again the node takes work and they run. (The coordinator's part, on
both stores: tests/store/test_node_drain_coordinator.py; when the agent's launches keep
failing: tests/unit/test_launch_failures_drain.py.)"""

from __future__ import annotations

import json
import os
import signal

import pytest
from e2e_cluster import Cluster, wait_for
from test_agent_heals_e2e import fork_server_of

from gpuq.agent.jobs.fork_server_link import TEST_BLOCK_ENV
from gpuq.domain.states import JobState

pytestmark = pytest.mark.timeout(90)


def test_node_drains_while_its_fork_server_cannot_restart(bare_cluster: Cluster) -> None:
    cluster = bare_cluster
    block = cluster.root / "no-fork-server"
    cluster.env[TEST_BLOCK_ENV] = str(block)  # restarts fail while this file exists
    cluster.start_coordinator()
    cluster.start_agent("a", "2xA100-80GB")
    agent = cluster.agents["a"]
    gate = cluster.root / "gate"
    running = cluster.submit(f"while [ ! -e {gate} ]; do sleep 0.05; done", gpus=1)
    assert cluster.wait_state(running, "running").node == "a"

    block.touch()
    first = wait_for(lambda: fork_server_of(agent.pid), what="the fork server")
    os.kill(first, signal.SIGKILL)

    def drained() -> dict[str, object] | None:
        result = cluster.gpuq("nodes", "--json")
        assert result.returncode == 0, result.stderr
        (node,) = json.loads(result.stdout)
        return node if node["state"] == "drained" else None

    node = wait_for(drained, 20, "node a to be drained")
    assert str(node["reason"]).startswith("drained by its agent: the fork server cannot be")
    assert TEST_BLOCK_ENV in str(node["reason"])
    assert node["running_jobs"] == [running]  # its running job stays
    text = cluster.gpuq("nodes").stdout
    assert "drained" in text and "drained by its agent" in text
    assert "a: drained" in cluster.gpuq("status").stdout

    waiting = cluster.submit("echo ran", gpus=1)

    def reasons() -> list[str]:
        (job,) = cluster.client().list_raw(job_ids=[waiting])
        assert job.state == "pending", (job.state, job.reason)
        return list(job.pending.reasons)

    # it waits, its reason naming the drain, and is never sent to the node
    named = wait_for(
        lambda: [r for r in reasons() if "node a drained by its agent" in r],
        15,
        "the drain named in the pending reason",
    )
    assert named
    _, events = cluster.client().detail(waiting)
    assert [e.to_state.value for e in events] == ["pending"]  # never started
    assert cluster.job(running).state is JobState.RUNNING

    block.unlink()  # the next restart (within 5 s) works: the node takes work again
    job = cluster.wait_state(waiting, "completed", "failed", timeout=30)
    assert job.state is JobState.COMPLETED and job.node == "a", job.reason
    assert (cluster.root / f"gpuq-{waiting}.out").read_text() == "ran\n"
    nodes = {n.name: n for n in cluster.client().nodes()}
    assert nodes["a"].state == "up" and nodes["a"].reason == ""
    assert fork_server_of(agent.pid) not in (None, first) and agent.poll() is None
    gate.touch()
    assert cluster.wait_state(running, "completed", "failed").state is JobState.COMPLETED
