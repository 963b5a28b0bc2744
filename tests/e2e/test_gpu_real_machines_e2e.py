"""The GPU details that only show on real machines (issue 24), end to end on fake GPUs: a fabric
manager that is not running, MIG caps nodes that appear after a layout change, MPS shares with
index visibility, a job's containers on its GPU, and what a reset reason tells the admin."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for

from gpuq.v1 import queue_pb2

GIB = 1 << 30


def fake_dir(cluster: Cluster, node: str) -> Path:
    return cluster.home / "agent" / node / "fake-gpus"


def node_info(cluster: Cluster, name: str) -> queue_pb2.NodeInfo:
    (node,) = [n for n in cluster.client().nodes() if n.name == name]
    return node


def units(cluster: Cluster, name: str) -> list[queue_pb2.GpuUnit]:
    return sorted(node_info(cluster, name).gpus, key=lambda u: u.index)


def wait_health(cluster: Cluster, uuid: str, state: str, words: str = "") -> str:
    def reached() -> str | None:
        for usage in node_info(cluster, "a").usage:
            if usage.uuid == uuid and (usage.health or "ok") == state:
                if words in usage.health_reason:
                    return usage.health_reason or state
        return None

    return wait_for(reached, 30, f"unit {uuid} to be {state} ({words})")


def output(cluster: Cluster, job: int) -> str:
    path = cluster.root / f"gpuq-{job}.out"
    return path.read_text() if path.exists() else ""


@pytest.fixture
def nvswitch(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, "[agent]\nfabric_grace = 1.0\n")
    try:
        running.start_coordinator()
        running.start_agent("a", "2xH100-80GB")
        yield running
    finally:
        running.close()


def test_a_fabric_manager_that_is_not_running_takes_the_gpu_out_until_it_registers(
    nvswitch: Cluster,
) -> None:
    cluster = nvswitch
    first, second = (u.uuid for u in units(cluster, "a"))
    (fake_dir(cluster, "a") / second).mkdir(parents=True, exist_ok=True)
    fabric = fake_dir(cluster, "a") / second / "fabric"
    fabric.write_text("not started\n")
    reason = wait_health(cluster, second, "unhealthy", "fabric manager not running")
    assert "systemctl enable --now nvidia-fabricmanager" in reason, reason
    assert "fabric manager not running" in cluster.gpuq("nodes").stdout
    job = cluster.submit("sleep 30", gpus=2)  # needs both: waits while one is unhealthy
    pending = cluster.client().detail(job)[0]
    assert pending.state == "pending", pending
    fabric.write_text("completed\n")  # the admin started it: no agent restart
    wait_health(cluster, second, "ok")
    assert sorted(cluster.wait_state(job, "running").gpus) == sorted([first, second])


SHARE_JOB = """
import os
from gpuq.agent.fake.gpu_state import claim_fake_vram, fake_cuda_devices
print("CUDA_VISIBLE_DEVICES=" + os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
devices = fake_cuda_devices()
if not devices:
    raise SystemExit("no CUDA device")
claim_fake_vram(devices[0], 1 << 30)
print("claimed " + devices[0], flush=True)
"""


def test_a_share_job_on_gpu_1_with_index_visibility_sees_its_mps_servers_device_0(
    tmp_path: Path,
) -> None:
    config = '[agent]\nsample_interval = 0.2\nshared_gpus = "1"\nvisible_devices = "index"\n'
    cluster = Cluster(tmp_path, config)
    try:
        cluster.start_coordinator()
        cluster.start_agent("a", "2xH100-80GB")
        gpu1 = units(cluster, "a")[1].uuid
        script = tmp_path / "share_job.py"
        script.write_text(SHARE_JOB)
        job = cluster.submit(f"{sys.executable} {script}", gpus=1, gpu_share=50, gpu_mem=20 * GIB)
        ended = cluster.wait_state(job, "completed", timeout=40)
        assert list(ended.gpus) == [gpu1]
        text = output(cluster, job)
        assert "CUDA_VISIBLE_DEVICES=0\n" in text and f"claimed {gpu1}" in text, text
    finally:
        cluster.close()
