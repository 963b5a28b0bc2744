"""The GPU details that only show on real machines (issue 24), end to end on fake GPUs: a fabric
manager that is not running, MIG caps nodes that appear after a layout change, MPS shares with
index visibility, a job's containers on its GPU, and what a reset reason tells the admin."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for

from gpuq.agent.fake.gpu_state import claim_fake_vram
from gpuq.v1 import queue_pb2

GIB = 1 << 30


def fake_dir(cluster: Cluster, node: str) -> Path:
    return cluster.home / "agent" / node / "fake-gpus"


def node_info(cluster: Cluster, name: str) -> queue_pb2.NodeInfo:
    (node,) = [n for n in cluster.client().nodes() if n.name == name]
    return node


def units(cluster: Cluster, name: str) -> list[queue_pb2.GpuUnit]:
    return sorted(node_info(cluster, name).gpus, key=lambda u: u.index)


def wait_health(cluster: Cluster, unit: str, state: str, words: str = "") -> str:
    def reached() -> str | None:
        for usage in node_info(cluster, "a").usage:
            found = usage.uuid == unit and (usage.health or "ok") == state
            if found and words in usage.health_reason:
                return usage.health_reason or state
        return None

    return wait_for(reached, 30, f"unit {unit} to be {state} ({words})")


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


def container_group(tag: str) -> Path | None:
    """A new cgroup named as dockerd's scopes are (docker-<id>.scope), or None where this
    machine does not let the test make one (not root, no writable hierarchy)."""
    for base in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        group = Path(base) / f"docker-{tag}.scope"
        if not (Path(base) / "cgroup.procs").exists():
            continue
        try:
            group.mkdir()
        except OSError:
            continue
        return group
    return None


def test_a_container_process_on_a_jobs_gpu_is_flagged_and_not_killed_in_kill_mode(
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex * 2
    group = container_group(tag)
    if group is None:
        pytest.skip("needs root and a writable cgroup hierarchy to model a docker container")
    cluster = Cluster(tmp_path, '[agent]\nforeign_processes = "kill"\n')
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    container = subprocess.Popen(sleeper)
    plain = subprocess.Popen(sleeper)
    try:
        (group / "cgroup.procs").write_text(f"{container.pid}\n")
        cluster.start_coordinator()
        cluster.start_agent("a", "1xH100-80GB")
        job = cluster.submit("sleep 60", gpus=1)
        (held,) = cluster.wait_state(job, "running").gpus
        state = fake_dir(cluster, "a")
        claim_fake_vram(held, GIB, container.pid, state)
        claim_fake_vram(held, GIB, plain.pid, state)  # after the container's: one read has both
        wait_for(lambda: plain.poll() is not None, 30, "the foreign process to be killed")

        def noted() -> str | None:
            for usage in node_info(cluster, "a").usage:
                for note in usage.notes:
                    if f"container process pid {container.pid}" in note:
                        return note
            return None

        note = wait_for(noted, 30, "the container process to be flagged")
        assert f"docker container {tag[:12]}" in note and "never killed" in note, note
        assert container.poll() is None, "the container's process was killed"
        assert cluster.client().detail(job)[0].state == "running"
    finally:
        for process in (container, plain):
            process.kill()
            process.wait(10)
        cluster.close()
        wait_for(lambda: _removed(group), 10, "the test's cgroup to go")


def _removed(group: Path) -> bool:
    try:
        group.rmdir()
    except OSError:
        return False
    return True


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/sys/fs/cgroup/devices/devices.deny").exists(),
    reason="device rules need root and the cgroup v1 devices controller",
)
def test_mig_caps_nodes_missing_after_a_layout_change_are_made_or_found_without_a_restart(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path, "[agent]\ngpu_rescan = 1\n")
    try:
        cluster.start_coordinator()
        cluster.start_agent("a", "1xA100-80GB")
        (gpu,) = (u.uuid for u in units(cluster, "a"))
        isolated = node_info(cluster, "a").isolation
        assert not isolated.startswith("advisory"), isolated
        state = fake_dir(cluster, "a")
        (state / "caps-late").write_text("")  # nvidia-modprobe has not run for new slices
        (state / gpu).mkdir(parents=True, exist_ok=True)
        (state / gpu / "mig").write_text("3g.40gb+3g.40gb\n")
        wait_for(lambda: len(units(cluster, "a")) == 2, 20, "the two MIG slices")
        assert node_info(cluster, "a").isolation == isolated  # the agent made the caps nodes
        assert len(list((state / "dev" / "nvidia-caps").iterdir())) == 4

        # where the agent cannot make them (no nvidia-caps major known), they appear later
        (state / "proc-devices").write_text("195 nvidia-frontend\n")
        (state / gpu / "mig").write_text("2g.20gb+2g.20gb+2g.20gb\n")
        wait_for(lambda: len(units(cluster, "a")) == 3, 20, "the three MIG slices")
        advisory = node_info(cluster, "a").isolation
        assert advisory.startswith("advisory: no device nodes found for GPU"), advisory
        (state / "caps-late").unlink()  # a first CUDA program: the nodes appear
        wait_for(
            lambda: node_info(cluster, "a").isolation == isolated,
            20,
            "the node's isolation back without an agent restart",
        )
    finally:
        cluster.close()


def test_a_gpu_that_needs_a_reset_says_to_stop_the_agent_before_nvidia_smi(
    nvswitch: Cluster,
) -> None:
    cluster = nvswitch
    gpu = units(cluster, "a")[0].uuid
    (fake_dir(cluster, "a") / gpu).mkdir(parents=True, exist_ok=True)
    (fake_dir(cluster, "a") / gpu / "remap").write_text("pending\n")
    reason = wait_health(cluster, gpu, "unhealthy", "needs a reset")
    steps = ["gpuq drain", "systemctl stop gpuq-agent", "nvidia-smi -r -i", "gpuq resume"]
    where = [reason.find(step) for step in steps]
    assert -1 not in where and where == sorted(where), reason


@pytest.mark.skipif(os.geteuid() != 0, reason="the harness submits as root only when root")
def test_roots_job_on_a_mig_slice_hears_it_is_not_kept_off_its_siblings(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        cluster.start_coordinator()
        cluster.start_agent("a", "1xA100-80GB:mig=3g.40gb+3g.40gb,1xA100-80GB")
        on_slice = cluster.gpuq("submit", "--mig", "3g.40gb", "--wrap", "true")
        assert on_slice.returncode == 0, on_slice.stderr
        ended = cluster.wait_state(int(on_slice.stdout.split()[-1]), "completed")
        assert "ran as root on a MIG slice" in ended.result.reason, ended.result
        whole = cluster.wait_state(cluster.submit("true", gpus=1), "completed")
        assert "MIG" not in whole.result.reason, whole.result
    finally:
        cluster.close()
