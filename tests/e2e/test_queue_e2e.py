"""The queue end to end: real coordinator and agents, fake GPUs, real jobs."""

from __future__ import annotations

import itertools
from pathlib import Path

from e2e_cluster import Cluster, pid_alive, wait_for

from gpuq.domain.states import JobState

RECORD = (
    'echo "start $GPUQ_JOB_ID $(date +%s.%N) $GPUQ_NODE $CUDA_VISIBLE_DEVICES" >> {log}; '
    "sleep {seconds}; "
    'echo "end $GPUQ_JOB_ID $(date +%s.%N)" >> {log}'
)


def read_record(log: Path) -> dict[int, dict[str, object]]:
    jobs: dict[int, dict[str, object]] = {}
    for line in log.read_text().splitlines():
        parts = line.split()
        entry = jobs.setdefault(int(parts[1]), {})
        if parts[0] == "start":
            entry.update(
                start=float(parts[2]),
                node=parts[3],
                gpus=parts[4].split(",") if len(parts) > 4 else [],
            )
        else:
            entry["end"] = float(parts[2])
    return jobs


def test_no_gpu_is_ever_held_by_two_overlapping_jobs(cluster: Cluster) -> None:
    log = cluster.root / "record.log"
    shapes = [1, 2, 1, 3, 1, 2, 2, 1, 4, 1, 1, 2, 1, 1]
    ids = [
        cluster.submit(RECORD.format(log=log, seconds=0.3 + 0.1 * (i % 3)), gpus=g)
        for i, g in enumerate(shapes)
    ]
    for job_id in ids:
        job = cluster.wait_state(job_id, "completed", "failed", timeout=60)
        assert job.state is JobState.COMPLETED, job
    record = read_record(log)
    assert sorted(record) == sorted(ids)
    nodes = {n.name: {g.uuid for g in n.gpus} for n in cluster.client().nodes()}
    for job_id, gpus in zip(ids, shapes, strict=True):
        entry = record[job_id]
        assert len(entry["gpus"]) == gpus  # type: ignore[arg-type]
        assert set(entry["gpus"]) <= nodes[entry["node"]]  # type: ignore[index,arg-type]
        assert cluster.job(job_id).gpus == tuple(
            sorted(
                entry["gpus"],  # type: ignore[arg-type]
                key=list(cluster.job(job_id).gpus).index,
            )
        )
    for (a, ra), (b, rb) in itertools.combinations(record.items(), 2):
        shared = set(ra["gpus"]) & set(rb["gpus"])  # type: ignore[arg-type]
        if shared:
            overlap = ra["start"] < rb["end"] and rb["start"] < ra["end"]  # type: ignore[operator]
            assert not overlap, f"jobs {a} and {b} both held {shared}"


def test_higher_priority_starts_first(cluster: Cluster) -> None:
    gate = cluster.root / "gate"
    blockers = [
        cluster.submit(f"while [ ! -e {gate} ]; do sleep 0.05; done", gpus=g) for g in (4, 2)
    ]
    for job_id in blockers:
        cluster.wait_state(job_id, "running")
    log = cluster.root / "record.log"
    low = [cluster.submit(RECORD.format(log=log, seconds=0.5), gpus=1, qos="low") for _ in range(6)]
    high = [
        cluster.submit(RECORD.format(log=log, seconds=0.5), gpus=1, qos="high") for _ in range(6)
    ]
    gate.touch()
    done = {j: cluster.wait_state(j, "completed", timeout=60) for j in low + high}
    # the scheduler's start times (the jobs' own clocks can run a few ms out of order)
    last_high_start = max(done[j].start_time or 0 for j in high)
    first_low_start = min(done[j].start_time or 0 for j in low)
    assert last_high_start <= first_low_start, "a low-priority job started before a high one"


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
    job_id = cluster.submit("sleep 60", time="0:02")
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
