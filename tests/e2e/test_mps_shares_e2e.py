"""MPS shares the whole way (issue 12's acceptance): a real coordinator and agent with fake
GPUs the admin shares; jobs ask for --gpu-share and --gpu-mem."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for

GIB = 1 << 30
# prints its MPS environment, claims CLAIM GiB through the fake NVML, holds it HOLD seconds
JOB = """
import os, sys, time
from gpuq.agent.fake.gpu_state import claim_fake_vram
for key, value in sorted(os.environ.items()):
    if key.startswith("CUDA_"):
        print(f"{key}={value}", flush=True)
claim_fake_vram(os.environ["CUDA_VISIBLE_DEVICES"], int(sys.argv[1]) << 30)
time.sleep(float(sys.argv[2]))
print("done", flush=True)
"""


def share_job(cluster: Cluster, claim: int, hold: float, **options: object) -> int:
    script = cluster.root / "share_job.py"
    script.write_text(JOB)
    command = f"{sys.executable} {script} {claim} {hold}"
    return cluster.submit(command, gpus=1, gpu_share=50, gpu_mem=20 * GIB, **options)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, '[agent]\nsample_interval = 0.2\nshared_gpus = "all"\n')
    try:
        running.start_coordinator()
        running.start_agent("a", "1xH100-80GB")
        yield running
    finally:
        running.close()


def output(cluster: Cluster, job: int) -> str:
    path = cluster.root / f"gpuq-{job}.out"
    return path.read_text() if path.exists() else ""


def test_two_shares_of_one_user_run_together_and_a_third_waits(cluster: Cluster) -> None:
    first = share_job(cluster, 1, 6)
    second = share_job(cluster, 1, 6)
    third = share_job(cluster, 1, 1)
    a = cluster.wait_state(first, "running")
    b = cluster.wait_state(second, "running")
    assert a.gpus == b.gpus  # one GPU, two shares
    for job in (first, second):
        env = wait_for(
            lambda j=job: "CUDA_MPS_PIPE_DIRECTORY=" in output(cluster, j) and output(cluster, j),
            15,
            "the job's env",
        )
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in env, env
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in env, env
        assert "CUDA_MPS_LOG_DIRECTORY=" in env and "/tmp/nvidia-mps" not in env, env
    pending = cluster.client().detail(third)[0]
    assert pending.state == "pending"
    reasons = " ".join(pending.pending.reasons)
    assert "share" in reasons and "left" in reasons, reasons
    shown = cluster.gpuq("show", str(first)).stdout
    assert "MPS (limits)" in shown, shown
    for job in (first, second, third):
        assert cluster.wait_state(job, "completed", timeout=40).state.value == "completed"


def test_a_share_over_its_memory_ends_out_of_memory_and_its_neighbour_completes(
    cluster: Cluster,
) -> None:
    greedy = share_job(cluster, 25, 20)
    neighbour = share_job(cluster, 5, 4)
    ended = cluster.wait_state(greedy, "out_of_memory", timeout=30)
    assert ended.result is not None and "share" in ended.result.reason, ended.result
    assert cluster.wait_state(neighbour, "completed", timeout=30).state.value == "completed"
