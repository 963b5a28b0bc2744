"""The queue end to end: real coordinator and agents, fake GPUs, real jobs: cancelling kills
the whole process tree, time limits, exit codes, output files and the GPUs a job sees. (The
order jobs start in and the GPUs they are given: tests/store/test_queue_order_coordinator.py.)"""

from __future__ import annotations

from e2e_cluster import Cluster, pid_alive, wait_for

from gpuq.domain.states import JobState


def test_cancel_pending_and_running_kills_the_whole_tree(cluster: Cluster) -> None:
    pids = cluster.root / "pids"
    stubborn = (
        f"trap '' TERM; "
        f"(trap '' TERM; sleep 1000 & echo $! >> {pids}; wait) & "
        f"setsid sh -c 'trap \"\" TERM; echo $$ >> {pids}; sleep 1000' & "
        f"echo $$ >> {pids}; sleep 1000"
    )
    running = cluster.submit(stubborn, gpus=4)
    pending = cluster.submit("true", gpus=4, qos="low")
    pending2 = cluster.submit("true", gpus=4, qos="low")
    cluster.wait_state(running, "running")
    wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 3, what="three pids")
    result = cluster.gpuq("cancel", str(pending))
    assert result.returncode == 0, result.stderr
    assert cluster.job(pending).state is JobState.CANCELLED
    before = __import__("time").monotonic()
    outcomes = cluster.client().cancel(running)
    assert outcomes[0].done and "stopping" in outcomes[0].message
    job = cluster.wait_state(running, "cancelled", timeout=20)
    elapsed = __import__("time").monotonic() - before
    assert elapsed >= 1.5, "SIGTERM was ignored, so the kill must wait for the 2 s grace"
    for pid in map(int, pids.read_text().split()):
        assert not pid_alive(pid), f"process {pid} of the cancelled job survived"
    assert job.result is not None and job.result.signal == 9
    # the GPUs came back: the other pending 4-GPU job runs
    cluster.wait_state(pending2, "completed")
    events = [e.to_state for e in cluster.client().detail(running)[1]]
    assert events == [JobState.PENDING, JobState.RUNNING, JobState.CANCELLED]


def test_time_limit_ends_a_job_as_timeout(cluster: Cluster) -> None:
    job_id = cluster.submit("sleep 60", time=2)  # seconds (text is whole minutes)
    job = cluster.wait_state(job_id, "timeout", timeout=20)
    assert job.start_time is not None and job.end_time is not None
    assert 1.5 < job.end_time - job.start_time < 10


def test_exit_codes_and_output_files(cluster: Cluster) -> None:
    ok = cluster.submit("echo out; echo err >&2")
    bad = cluster.submit("echo failing; exit 3", output="custom-%j.log")
    split = cluster.submit(
        "echo to-out; echo to-err >&2", output="o-%x.txt", error="e-%x.txt", name="split"
    )
    killed = cluster.submit("kill -SEGV $$")
    gpus = cluster.submit("echo $CUDA_VISIBLE_DEVICES", gpus=3)
    assert cluster.wait_state(ok, "completed").result.exit_code == 0  # type: ignore[union-attr]
    failed = cluster.wait_state(bad, "failed")
    assert failed.result is not None and failed.result.exit_code == 3
    cluster.wait_state(split, "completed")
    segv = cluster.wait_state(killed, "failed")
    assert segv.result is not None and segv.result.signal == 11
    assert (cluster.root / f"gpuq-{ok}.out").read_text() == "out\nerr\n"
    assert (cluster.root / f"custom-{bad}.log").read_text() == "failing\n"
    assert (cluster.root / "o-split.txt").read_text() == "to-out\n"
    assert (cluster.root / "e-split.txt").read_text() == "to-err\n"
    assert cluster.client().logs(ok) == "out\nerr\n"
    # the units it was given, in its order, and only those
    job = cluster.wait_state(gpus, "completed")
    assert len(job.gpus) == 3
    assert (cluster.root / f"gpuq-{gpus}.out").read_text() == ",".join(job.gpus) + "\n"
