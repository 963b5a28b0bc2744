"""Crashes and restarts: a job's supervisor, not the agent, is its parent, and the store keeps
every accepted job."""

from __future__ import annotations

import time
from typing import Any

from e2e_cluster import Cluster, pid_alive, wait_for

from gpuq.domain.states import JobState


def running_job(cluster: Cluster, node: str, gate_name: str, **options: Any) -> tuple[int, int]:
    """A job on `node` that runs until its gate file appears; (job id, its shell's pid)."""
    gate = cluster.root / gate_name
    pid_file = cluster.root / f"{gate_name}.pid"
    gpus = 4 if node == "a" else 2
    job_id = cluster.submit(
        f"echo $$ > {pid_file}; while [ ! -e {gate} ]; do sleep 0.05; done; echo done",
        gpus=gpus,
        **options,
    )
    job = cluster.wait_state(job_id, "running")
    assert job.node == node
    pid = wait_for(lambda: pid_file.exists() and int(pid_file.read_text() or 0), what="job pid")
    return job_id, pid


def test_agent_killed_and_restarted_readopts_its_jobs(cluster: Cluster) -> None:
    job_id, pid = running_job(cluster, "a", "gate")
    cluster.kill(cluster.agents["a"])
    assert pid_alive(pid), "the job must survive its agent"
    cluster.start_agent("a", "4xA100-80GB")
    assert cluster.job(job_id).state is JobState.RUNNING
    (cluster.root / "gate").touch()
    job = cluster.wait_state(job_id, "completed", "failed", "node_fail")
    assert job.state is JobState.COMPLETED
    assert (cluster.root / f"gpuq-{job_id}.out").read_text() == "done\n"
    # the node works normally afterwards
    after = cluster.submit("true", gpus=4)
    assert cluster.wait_state(after, "completed").node == "a"


def test_job_that_ends_while_its_agent_is_down_is_reported_on_return(cluster: Cluster) -> None:
    job_id, pid = running_job(cluster, "b", "gate")
    cluster.kill(cluster.agents["b"])
    (cluster.root / "gate").touch()
    wait_for(lambda: not pid_alive(pid), what="the job to finish")
    ended_by = time.time()
    assert cluster.job(job_id).state is JobState.RUNNING  # nobody has told the coordinator yet
    wait_for(lambda: time.time() > ended_by + 1.0, what="a second to pass")
    cluster.start_agent("b", "2xL4-24GB", tcp=True)
    job = cluster.wait_state(job_id, "completed")
    assert job.result is not None and job.result.exit_code == 0
    # its end time is when it ended (the supervisor's record), not when the coordinator heard
    assert job.end_time is not None and job.end_time <= ended_by


def test_agent_that_stays_down_fails_its_jobs_after_the_timeout(cluster: Cluster) -> None:
    # --no-requeue: it stays node_fail (requeueing is test_faults_e2e's)
    job_id, _ = running_job(cluster, "b", "gate", no_requeue=True)
    cluster.kill(cluster.agents["b"])
    job = cluster.wait_state(job_id, "node_fail", timeout=15)
    assert "no word from its agent" in job.reason
    cluster.wait_node("b", "down")
    # its GPUs are not offered any more: a 2-GPU job goes to node a
    other = cluster.submit("true", gpus=2)
    assert cluster.wait_state(other, "completed").node == "a"


def test_coordinator_restart_keeps_queued_and_running_jobs(cluster: Cluster) -> None:
    job_id, pid = running_job(cluster, "a", "gate")
    queued = [cluster.submit("echo later", gpus=4) for _ in range(2)]
    held = cluster.submit("echo held", gpus=1, hold=True)
    cluster.kill(cluster.coordinator)
    assert pid_alive(pid)
    cluster.start_coordinator()
    cluster.wait_node("a", "up")
    assert cluster.job(job_id).state is JobState.RUNNING
    assert [cluster.job(q).state for q in queued] == [JobState.PENDING, JobState.PENDING]
    assert cluster.job(held).state is JobState.HELD
    (cluster.root / "gate").touch()
    assert cluster.wait_state(job_id, "completed", "failed").state is JobState.COMPLETED
    for q in queued:
        assert cluster.wait_state(q, "completed").state is JobState.COMPLETED
    cluster.client().release(held)
    assert cluster.wait_state(held, "completed").state is JobState.COMPLETED
    # the client from before the restart submits again (its open stream died with the server)
    after = cluster.submit("true", gpus=1)
    assert cluster.wait_state(after, "completed").state is JobState.COMPLETED
