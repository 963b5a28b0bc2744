"""Faults lose nothing and never double-book: a start the agent never received goes back to
the queue (not node_fail), an agent cut off from its coordinator stops its jobs itself, and a
job lost with its node is requeued as its QOS allows."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

from e2e_cluster import Cluster, pid_alive, wait_for

from gpuq.agent.jobs.job_folder import supervisor_alive
from gpuq.config.loading import load_settings
from gpuq.domain.states import JobState


def gated_job(cluster: Cluster, gate_name: str, gpus: int) -> tuple[int, int]:
    """A job that runs until its gate file appears; (job id, its shell's pid)."""
    gate = cluster.root / gate_name
    pid_file = cluster.root / f"{gate_name}.pid"
    job_id = cluster.submit(
        f"echo $$ > {pid_file}; while [ ! -e {gate} ]; do sleep 0.05; done; echo done", gpus=gpus
    )
    cluster.wait_state(job_id, "running")
    pid = wait_for(lambda: pid_file.exists() and int(pid_file.read_text() or 0), what="job pid")
    return job_id, pid


def run_folder(cluster: Cluster, node: str) -> Path:
    return load_settings(home=cluster.home).agent_run_root / node


def events(cluster: Cluster, job_id: int) -> list[tuple[str, str]]:
    _, history = cluster.client().detail(job_id)
    return [(e.to_state.value, e.reason) for e in history]


def test_a_start_the_agent_never_knew_goes_back_to_the_queue(cluster: Cluster) -> None:
    """The agent comes back with an empty run folder: the coordinator's running job is one
    whose start never reached it, so it is queued again (not node_fail) and then runs."""
    job_id, pid = gated_job(cluster, "gate", gpus=4)  # only node a has 4 GPUs
    cluster.kill(cluster.agents["a"])
    folder = run_folder(cluster, "a")
    supervisor = supervisor_alive(folder / "jobs" / str(job_id))
    assert supervisor is not None
    os.kill(supervisor, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid) and not pid_alive(supervisor), what="the job to be gone")
    shutil.rmtree(folder)
    (cluster.root / "gate").touch()
    cluster.start_agent("a", "4xA100-80GB")
    job = cluster.wait_state(job_id, "completed", "failed", "node_fail", "cancelled")
    assert job.state is JobState.COMPLETED, events(cluster, job_id)
    history = events(cluster, job_id)
    assert ("pending", "requeued: the agent never received the start") in history
    assert all(state != "node_fail" for state, _ in history), history
    assert [state for state, _ in history].count("running") == 2
    assert job.requeue_count == 0  # it never ran twice: not a requeue
    assert (cluster.root / f"gpuq-{job_id}.out").read_text() == "done\n"


def test_an_agent_cut_off_from_its_coordinator_fences_its_jobs(tmp_path: Path) -> None:
    """No coordinator for longer than fence_time: the job's supervisor stops it (node_fail),
    so a job the coordinator requeues never runs in two places; when a coordinator is back,
    the end is reported and the job is requeued once (its QOS's default)."""
    cluster = Cluster(tmp_path, fence_time=1.5, node_timeout=4.5)
    try:
        cluster.start_coordinator()
        cluster.start_agent("a", "4xA100-80GB")
        job_id, pid = gated_job(cluster, "gate", gpus=1)
        cluster.kill(cluster.coordinator)
        # its connection broke at the kill at the latest: the job runs until the fence time
        killed_at = time.monotonic()
        wait_for(lambda: not pid_alive(pid), timeout=20, what="the agent to stop its job")
        # not at once: fence_time after the last heartbeat the coordinator echoed, which may
        # be up to ~0.5 s before the kill (a heartbeat each 0.3 s, its echo, the lease's step)
        assert time.monotonic() - killed_at >= 1.0
        (cluster.root / "gate").touch()
        cluster.start_coordinator()
        job = cluster.wait_state(job_id, "completed", "failed", "cancelled", timeout=30)
        assert job.state is JobState.COMPLETED
        history = events(cluster, job_id)
        fenced = [r for s, r in history if s == "node_fail"]
        assert fenced == ["fenced: no word from the coordinator for 1.5 s"], history
        assert ("pending", "requeued after node_fail (1 of 1 allowed by qos normal)") in history
        assert job.requeue_count == 1
    finally:
        cluster.close()


def test_a_job_lost_with_its_node_is_requeued_once_and_runs_elsewhere(cluster: Cluster) -> None:
    """Node b dies (its agent and the job's processes): after the node timeout the job ends
    node_fail, goes back to the queue once (the QOS default) and runs on node a."""
    job_id, pid = gated_job(cluster, "gate", gpus=2)
    assert cluster.job(job_id).node == "b"
    cluster.kill(cluster.agents["b"])
    supervisor = supervisor_alive(run_folder(cluster, "b") / "jobs" / str(job_id))
    for victim in (supervisor, pid):
        if victim is not None:
            os.kill(victim, signal.SIGKILL)
    (cluster.root / "gate").touch()
    job = cluster.wait_state(job_id, "completed", "failed", "cancelled", timeout=30)
    assert job.state is JobState.COMPLETED and job.node == "a"
    history = events(cluster, job_id)
    states = [s for s, _ in history]
    assert states == ["pending", "running", "node_fail", "pending", "running", "completed"]
    assert "no word from its agent" in history[2][1]
    assert history[3][1] == "requeued after node_fail (1 of 1 allowed by qos normal)"
    assert job.requeue_count == 1
    cluster.wait_node("b", "down")


def test_a_frozen_agents_job_is_fenced_before_it_runs_elsewhere(cluster: Cluster) -> None:
    """Node b's agent freezes: nobody extends its job's lease, so the job's own supervisor
    stops it (SIGTERM, ignored; SIGKILL after the grace) before the coordinator gives the node
    up and starts the job on node a: never on two nodes at once. When b's agent comes back,
    its late report of the fenced start is noted in the job's history, and b takes work."""
    gate = cluster.root / "gate"
    # ignores SIGTERM: only the SIGKILL after the grace ends it
    script = (
        "trap '' TERM; echo $$ > {root}/x-$GPUQ_NODE.pid; "
        f"while [ ! -e {gate} ]; do sleep 0.05; done"
    ).replace("{root}", str(cluster.root))
    x = cluster.submit(script, gpus=2)
    assert cluster.wait_state(x, "running").node == "b"
    on_b = cluster.root / "x-b.pid"
    stray = wait_for(lambda: on_b.exists() and int(on_b.read_text() or 0), what="x on b")
    z = cluster.submit(f"while [ ! -e {gate} ]; do sleep 0.05; done", gpus=2)
    assert cluster.wait_state(z, "running").node == "a"
    agent_b = cluster.agents["b"]
    agent_b.send_signal(signal.SIGSTOP)
    try:
        # given up after the node timeout, requeued, and started on node a: by then its copy
        # on b is gone (fenced by its supervisor)
        wait_for(
            lambda: (job := cluster.job(x)).state is JobState.RUNNING and job.node == "a",
            timeout=30,
            what="x to run again on a",
        )
        assert not pid_alive(stray)
        y = cluster.submit("true", gpus=2)  # a is full: only b could take it
    finally:
        agent_b.send_signal(signal.SIGCONT)
    cluster.wait_node("b", "up")
    done = cluster.wait_state(y, "completed", "failed", "cancelled", timeout=20)
    assert done.state is JobState.COMPLETED and done.node == "b"
    history = wait_for(
        lambda: [r for _, r in events(cluster, x) if "reported late" in r],
        what="b's late report in x's history",
    )
    assert history[0].startswith("start 1 on node b ended node_fail at "), history
    assert "fenced: the node's agent stopped answering" in history[0], history
    assert cluster.job(x).state is JobState.RUNNING and cluster.job(x).node == "a"
    gate.touch()
    assert cluster.wait_state(x, "completed", "failed").state is JobState.COMPLETED
