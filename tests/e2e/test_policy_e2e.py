"""Scheduling policy end to end, where it reaches a job's processes: a preempted job told by
SIGTERM checkpoints and resumes, a --no-requeue job gets its warning signal, a memory limit
ends a job. (Arrays with a limit, dependencies, begin times and pending reasons: tests/store/
test_queue_order_coordinator.py and test_dependencies_coordinator.py, in process.)"""

from __future__ import annotations

from e2e_cluster import Cluster, wait_for

from gpuq.domain.states import JobState

CHECKPOINTING = """#!/bin/bash
ckpt={root}/ckpt
trap 'echo "$i" > $ckpt; echo "checkpointed at $i"; exit 0' TERM
i=$(cat $ckpt 2>/dev/null || echo 0)
echo "start from $i, restart $GPUQ_RESTART_COUNT"
while [ "$i" -lt 30 ]; do i=$((i+1)); echo "$i" > {root}/progress; sleep 0.1; done
echo "done at $i"
"""


def test_preempted_job_checkpoints_requeues_and_completes(cluster: Cluster) -> None:
    script = cluster.root / "train.sh"
    script.write_text(CHECKPOINTING.format(root=cluster.root))
    low = cluster.client().submit(
        str(script), gpus=4, qos="low", environ=cluster.env, chdir=str(cluster.root)
    )
    cluster.wait_state(low, "running")
    output = cluster.root / f"gpuq-{low}.out"
    wait_for(lambda: output.exists() and "start from 0" in output.read_text(), what="low start")
    progress = cluster.root / "progress"
    wait_for(lambda: progress.exists() and int(progress.read_text() or 0) >= 3, what="progress")
    high = cluster.submit("echo high ran on $GPUQ_NODE", gpus=4, qos="high")
    assert cluster.wait_state(high, "completed", timeout=30).node == "a"
    job = cluster.wait_state(low, "completed", "failed", timeout=30)
    assert job.state is JobState.COMPLETED
    assert job.requeue_count == 1
    text = output.read_text()
    assert "start from 0, restart 0" in text
    checkpoint = int(text.split("checkpointed at ")[1].split()[0])
    assert checkpoint > 0
    assert f"start from {checkpoint}, restart 1" in text
    assert text.endswith("done at 30\n")
    _, events = cluster.client().detail(low)
    assert [e.to_state.value for e in events] == [
        "pending",
        "running",
        "preempted",
        "pending",
        "running",
        "completed",
    ]
    assert events[2].reason.startswith(f"preempted by job {high}")
    high_job = cluster.job(high)
    assert high_job.start_time is not None and high_job.start_time >= events[2].at


def test_no_requeue_job_ends_preempted_after_its_warning_signal(cluster: Cluster) -> None:
    warned, ready = cluster.root / "warned", cluster.root / "ready"
    low = cluster.submit(
        f"trap 'echo usr1 > {warned}; exit 0' USR1; touch {ready}; while true; do sleep 0.05; done",
        gpus=2,
        qos="low",
        no_requeue=True,
        signal="USR1",
    )
    assert cluster.wait_state(low, "running").node == "b"
    wait_for(ready.exists, what="the job to set its trap")  # a signal before it kills the job
    # fill node a so that the high job can only get node b by preemption
    gate = cluster.root / "gate"
    cluster.submit(f"while [ ! -e {gate} ]; do sleep 0.05; done", gpus=4)
    high = cluster.submit("true", gpus=2, qos="high")
    job = cluster.wait_state(low, "preempted", timeout=20)
    assert warned.read_text() == "usr1\n"
    assert job.requeue_count == 0
    assert cluster.wait_state(high, "completed").node == "b"
    gate.touch()
    assert cluster.job(low).state is JobState.PREEMPTED  # it stays ended


def test_memory_limit_ends_a_job_as_out_of_memory(cluster: Cluster) -> None:
    hog = cluster.submit(
        "python3 -c 'import time; x = bytearray(400 << 20); time.sleep(30)'", mem="100M"
    )
    job = cluster.wait_state(hog, "out_of_memory", "failed", "completed", timeout=30)
    assert job.state is JobState.OUT_OF_MEMORY
    assert "100M" in job.reason
