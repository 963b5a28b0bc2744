"""MPS shares end to end on fake GPUs with real processes: a real coordinator and agent, GPU 0
shared. Two share jobs of one user run on it under one private (fake) MPS control daemon and
see the MPS environment; the one that claims more VRAM than its share ends out_of_memory with
the figures while its neighbour completes; the daemon stops after the last. A node-wide MPS
daemon left running (a copy of sleep named nvidia-cuda-mps-control) makes the node take no
work until it is gone."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for

GIB = 1 << 30

# writes its MPS environment and whether the daemon's control socket is there, claims CLAIM
# GiB of VRAM on its GPU through the fake NVML, holds it for HOLD seconds
JOB = (
    "import os, time; from gpuq.agent.fake.gpu_state import claim_fake_vram; "
    'e = os.environ; gpu = e["CUDA_VISIBLE_DEVICES"]; '
    'out = open(os.path.join(e["GPUQ_SUBMIT_DIR"], "job-" + e["GPUQ_JOB_ID"] + ".env"), "w"); '
    'out.write("".join(f"{k}={e[k]}\\n" for k in sorted(e) if k.startswith("CUDA_"))); '
    'pipe = e["CUDA_MPS_PIPE_DIRECTORY"]; '
    'out.write("control=" + str(os.path.exists(pipe + "/control")) + "\\n"); '
    "out.close(); claim_fake_vram(gpu, int(CLAIM * (1 << 30))); time.sleep(HOLD)"
)


def job(claim: float, hold: float) -> str:
    body = JOB.replace("CLAIM", repr(claim)).replace("HOLD", repr(hold))
    return f"{sys.executable} -c '{body}'"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, '[agent]\nsample_interval = 0.2\nshared_gpus = "0"\n')
    try:
        running.start_coordinator()
        running.start_agent("a", "2xH100-80GB")
        yield running
    finally:
        running.close()


def env_of(cluster: Cluster, job_id: int) -> dict[str, str]:
    path = cluster.root / f"job-{job_id}.env"
    text = wait_for(lambda: path.exists() and path.read_text(), 20, f"{path}")
    return dict(line.split("=", 1) for line in str(text).splitlines())


def test_a_share_over_its_vram_ends_out_of_memory_and_its_neighbour_completes(
    cluster: Cluster,
) -> None:
    over = cluster.submit(job(23.1, 60), gpu_share=50, gpu_mem="20G")
    neighbour = cluster.submit(job(10, 4), gpu_share=50, gpu_mem="20G")
    seen = [env_of(cluster, j) for j in (over, neighbour)]
    for env in seen:
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
        assert env["control"] == "True"  # its GPU's daemon runs
        assert "/mps/" in env["CUDA_MPS_PIPE_DIRECTORY"]
        assert not env["CUDA_MPS_PIPE_DIRECTORY"].startswith("/tmp/nvidia-mps")
    # one GPU, one daemon: the same folders for both
    assert seen[0]["CUDA_VISIBLE_DEVICES"] == seen[1]["CUDA_VISIBLE_DEVICES"]
    assert seen[0]["CUDA_MPS_PIPE_DIRECTORY"] == seen[1]["CUDA_MPS_PIPE_DIRECTORY"]
    ended = cluster.wait_state(over, "out_of_memory", timeout=30)
    assert "GPU share (MPS)" in ended.reason and "of its 20G" in ended.reason, ended.reason
    assert cluster.job(neighbour).state.value == "running"  # it keeps running
    cluster.wait_state(neighbour, "completed", timeout=30)
    # the last share job ended: the daemon was told to quit
    pipe = Path(seen[0]["CUDA_MPS_PIPE_DIRECTORY"])
    wait_for(lambda: not (pipe / "control").exists(), 20, "the MPS daemon to stop")
    log = (pipe.parent / "log" / "control.log").read_text()
    assert "Command: quit" in log


def test_a_node_wide_mps_daemon_makes_the_node_take_no_work_until_it_goes(
    cluster: Cluster, tmp_path: Path
) -> None:
    program = tmp_path / "bin" / "nvidia-cuda-mps-control"
    program.parent.mkdir()
    shutil.copy("/bin/sleep", program)
    daemon = subprocess.Popen([str(program), "120"])
    try:

        def reason() -> str:
            (node,) = [n for n in cluster.client().nodes() if n.name == "a"]
            return str(node.reason)

        found = wait_for(lambda: "misconfigured" in reason() and reason(), 20, "the report")
        assert f"pid {daemon.pid}" in str(found) and "node-wide MPS" in str(found)
        waiting = cluster.submit("true", gpus=1)
        assert cluster.job(waiting).state.value == "pending"
    finally:
        daemon.kill()
        daemon.wait()
    wait_for(lambda: "misconfigured" not in reason(), 20, "the report to clear")
    cluster.wait_state(waiting, "completed", timeout=30)
