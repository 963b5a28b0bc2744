"""A node whose agent cannot start jobs drains itself: `gpuq nodes` says why, its running jobs
go on, new jobs wait (their pending reason names the drain) instead of failing, and once the
agent can start jobs again the node takes work and they run."""

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


def test_hub_stops_accepting_after_launches_keep_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    """LAUNCH_FAILURES_DRAIN refused launches in a row: not accepting (on_health is told),
    for DRAIN_RETRY after the last; a launch that works, or a new fork server, ends it."""
    from pathlib import Path

    from gpuq.agent.jobs import fork_server_link
    from gpuq.agent.jobs.supervisors import Supervisors

    told: list[str | None] = []
    hub = Supervisors(Path("/nonexistent"), lambda _: None)
    forks = hub.forks
    forks.on_health = lambda: told.append(forks.not_accepting())
    for _ in range(fork_server_link.LAUNCH_FAILURES_DRAIN - 1):
        forks.launch_refused("cannot fork: EAGAIN")
    assert forks.not_accepting() is None and told == []
    forks.launch_refused("cannot fork: EAGAIN")
    assert told == ["launches keep failing (the last: cannot fork: EAGAIN)"]
    forks.launch_refused("cannot fork: EAGAIN")  # still not accepting: no news
    assert len(told) == 1
    monkeypatch.setattr(fork_server_link, "DRAIN_RETRY", 0.0)  # its time is up: it tries again
    assert forks.not_accepting() is None
    monkeypatch.setattr(fork_server_link, "DRAIN_RETRY", 30.0)
    forks.set_refusing("the fork server cannot be restarted: test")
    assert told[-1] == "the fork server cannot be restarted: test"
    forks.set_refusing(None)
    forks.failed_launches = 0
    assert forks.not_accepting() is None
