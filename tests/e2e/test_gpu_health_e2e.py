"""GPUs as they really behave, end to end on fake GPUs with real processes: a lost GPU, XIDs,
a clean hand-over (stragglers keep a unit dirty), foreign processes, and an agent without a
driver. Faults are injected through the fake NVML's files (see gpuq.agent.fake.gpu_spec)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for
from helpers import needs

from gpuq.agent.fake.gpu_state import claim_fake_vram
from gpuq.v1 import queue_pb2

GIB = 1024**3


def fake_dir(cluster: Cluster, node: str) -> Path:
    return cluster.home / "agent" / node / "fake-gpus"


def node_info(cluster: Cluster, name: str) -> queue_pb2.NodeInfo:
    (node,) = [n for n in cluster.client().nodes() if n.name == name]
    return node


def unit_uuids(cluster: Cluster, name: str) -> list[str]:
    return [u.uuid for u in sorted(node_info(cluster, name).gpus, key=lambda u: u.index)]


def health(cluster: Cluster, name: str, uuid: str) -> tuple[str, str, list[str]]:
    for usage in node_info(cluster, name).usage:
        if usage.uuid == uuid:
            return usage.health or "ok", usage.health_reason, list(usage.notes)
    return "missing", "", []


def wait_health(cluster: Cluster, name: str, uuid: str, state: str, timeout: float = 20.0) -> str:
    def reached() -> str | None:
        found, reason, _ = health(cluster, name, uuid)
        return (reason or state) if found == state else None

    return wait_for(reached, timeout, f"unit {uuid} of {name} to be {state}")


def job_python(code: str) -> str:
    """A job command that runs Python code with gpuq importable (the fakes' claim helper)."""
    return f"{sys.executable} -c '{code}'"


CLAIM = (
    "import os, time; from gpuq.agent.fake.gpu_state import claim_fake_vram; "
    'claim_fake_vram(os.environ["CUDA_VISIBLE_DEVICES"], 2 << 30{extra}); {then}'
)


@pytest.fixture
def gpu_cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path)
    try:
        running.start_coordinator()
        running.start_agent("a", "2xH100-80GB")
        yield running
    finally:
        running.close()


def test_a_lost_gpu_leaves_the_node_up_and_its_other_job_running(gpu_cluster: Cluster) -> None:
    cluster = gpu_cluster
    first, second = unit_uuids(cluster, "a")
    job = cluster.submit("sleep 60", gpus=1)
    running = cluster.wait_state(job, "running")
    held = running.gpus[0]
    lost = second if held == first else first
    (fake_dir(cluster, "a") / lost).mkdir(parents=True, exist_ok=True)
    (fake_dir(cluster, "a") / lost / "lost").touch()
    reason = wait_health(cluster, "a", lost, "unhealthy")
    assert "lost" in reason.lower()
    # heartbeats go on past the coordinator's node timeout (3 s here): the node stays up
    seen = node_info(cluster, "a").last_seen
    wait_for(lambda: node_info(cluster, "a").last_seen > seen + 3.5, 10, "heartbeats to go on")
    assert node_info(cluster, "a").state == "up"
    assert cluster.job(job).state.value == "running"
    assert health(cluster, "a", held)[0] == "ok"
    # a job that needs both GPUs waits, and says why
    both = cluster.submit("true", gpus=2)
    waiting = wait_for(
        lambda: (j := cluster.job(both)).reason and "unhealthy" in j.reason and j,
        10,
        "the 2-GPU job's pending reason",
    )
    assert waiting.state.value == "pending"


def test_a_hardware_xid_ends_the_job_with_it_and_takes_the_gpu_out(gpu_cluster: Cluster) -> None:
    cluster = gpu_cluster
    job = cluster.submit("sleep 60", gpus=1)
    held = cluster.wait_state(job, "running").gpus[0]
    (fake_dir(cluster, "a") / held).mkdir(parents=True, exist_ok=True)
    (fake_dir(cluster, "a") / held / "xid").write_text("48\n")
    wait_health(cluster, "a", held, "unhealthy")

    def ended_by_xid() -> bool:
        _, events = cluster.client().detail(job)
        return any("XID 48" in event.reason for event in events)

    wait_for(ended_by_xid, 20, "the job to end with the XID in its reason")
    # its QOS requeues it once after a node failure: it runs again, on the other GPU
    rerun = wait_for(
        lambda: (j := cluster.job(job)).state.value == "running" and j.start_count > 1 and j,
        20,
        "the requeued job to run again",
    )
    assert rerun.gpus and rerun.gpus[0] != held
    assert health(cluster, "a", held)[0] == "unhealthy"


def test_an_application_xid_is_the_jobs_own_and_does_not_take_the_gpu_out(
    gpu_cluster: Cluster,
) -> None:
    cluster = gpu_cluster
    go = cluster.root / "go"
    job = cluster.submit(f"while [ ! -e {go} ]; do sleep 0.05; done", gpus=1)
    held = cluster.wait_state(job, "running").gpus[0]
    (fake_dir(cluster, "a") / held).mkdir(parents=True, exist_ok=True)
    (fake_dir(cluster, "a") / held / "xid").write_text("13\n")
    log = cluster.root / "agent-a.log"
    wait_for(lambda: "XID 13" in log.read_text(errors="replace"), 20, "the agent to see XID 13")
    go.touch()
    done = cluster.wait_state(job, "completed")
    assert done.result is not None and "XID 13" in done.result.reason
    assert health(cluster, "a", held)[0] == "ok"


def test_a_process_that_will_not_go_keeps_its_unit_dirty_and_the_next_job_waits(
    gpu_cluster: Cluster,
) -> None:
    cluster = gpu_cluster
    command = job_python(CLAIM.format(extra=", stuck=True", then="print(os.getpid())"))
    job = cluster.submit(command, gpus=1, output=str(cluster.root / "stuck.out"))
    done = cluster.wait_state(job, "completed")
    held = done.gpus[0]
    pid = int((cluster.root / "stuck.out").read_text().split()[-1])
    reason = wait_health(cluster, "a", held, "dirty")
    assert f"pid {pid}" in reason
    nxt = cluster.submit("true", gpus=2)
    waiting = wait_for(
        lambda: (j := cluster.job(nxt)).reason and "dirty" in j.reason and j,
        10,
        "the next job's pending reason to name the dirty unit",
    )
    assert f"pid {pid}" in waiting.reason
    claim_fake_vram(held, 0, pid=pid, state_dir=fake_dir(cluster, "a"))  # the driver lets go
    cluster.wait_state(nxt, "completed")
    assert health(cluster, "a", held)[0] == "ok"


def test_a_jobs_leftover_gpu_processes_are_gone_before_its_unit_is_given_out(
    gpu_cluster: Cluster,
) -> None:
    """A job that leaves a GPU process behind (daemonised) has it killed with its cgroup; the
    next job on its unit never sees it listed."""
    cluster = gpu_cluster
    leftover = CLAIM.format(extra="", then="time.sleep(300)")
    script = f"setsid {job_python(leftover)} </dev/null >/dev/null 2>&1 &\nsleep 0.5\n"
    job = cluster.submit(script, gpus=2)
    cluster.wait_state(job, "completed", "failed")
    nxt = cluster.submit("true", gpus=2)
    cluster.wait_state(nxt, "completed")
    for uuid in unit_uuids(cluster, "a"):
        listed = [p for p in (fake_dir(cluster, "a") / uuid).glob("[0-9]*")]
        assert listed == [], f"{uuid} still lists {listed}"


def test_a_foreign_process_is_flagged_and_its_free_unit_not_given_out(
    gpu_cluster: Cluster,
) -> None:
    cluster = gpu_cluster
    first, second = unit_uuids(cluster, "a")
    outsider = subprocess.Popen(["sleep", "300"])
    try:
        claim_fake_vram(second, 3 * GIB, pid=outsider.pid, state_dir=fake_dir(cluster, "a"))
        reason = wait_health(cluster, "a", second, "dirty")
        assert f"foreign process pid {outsider.pid} (sleep" in reason
        notes = health(cluster, "a", second)[2]
        assert any("foreign" in note for note in notes)
        job = cluster.submit("true", gpus=1)
        assert cluster.wait_state(job, "completed").gpus == (first,)
    finally:
        outsider.kill()
        outsider.wait()
    wait_health(cluster, "a", second, "ok")


def test_an_agent_without_a_driver_registers_no_gpus_and_runs_cpu_jobs(
    bare_cluster: Cluster,
) -> None:
    cluster = bare_cluster
    cluster.start_coordinator()
    cluster.agents["c"] = cluster._spawn(["agent", "--node-name", "c"], "agent-c")
    cluster.wait_node("c", "up")
    node = node_info(cluster, "c")
    assert list(node.gpus) == []
    assert not node.fake
    job = cluster.submit("echo cpu", cpus=1)
    assert cluster.wait_state(job, "completed").node == "c"
    shown = cluster.gpuq("nodes")
    assert shown.returncode == 0
    assert "driver" in shown.stdout.lower()
    refused = cluster.gpuq("submit", "--gpus", "1", "--wrap", "true")
    assert refused.returncode == 2, refused.stderr


def test_whole_gpus_and_mig_slices_are_given_as_cuda_sees_them(bare_cluster: Cluster) -> None:
    cluster = bare_cluster
    cluster.start_coordinator()
    cluster.start_agent("m", "1xA100-80GB:mig=3g.40gb+3g.40gb,1xA100-80GB")
    units = {u.uuid: u for u in node_info(cluster, "m").gpus}
    whole = [uuid for uuid, unit in units.items() if not unit.parent_uuid]
    assert len(whole) == 1
    # two whole GPUs: the node has one (and two slices, which do not count)
    refused = cluster.gpuq("submit", "--gpus", "2", "--wrap", "true")
    assert refused.returncode == 2, refused.stderr
    go = cluster.root / "go"
    wait = f"while [ ! -e {go} ]; do sleep 0.05; done"
    one = cluster.submit(wait, gpus=1)
    assert cluster.wait_state(one, "running").gpus == (whole[0],)
    another = cluster.submit(wait, gpus=1)
    # it waits for the whole GPU (a pass has said why), never taking a slice
    waiting = wait_for(lambda: (j := cluster.job(another)).reason and j, 10, "a pending reason")
    assert waiting.state.value == "pending", waiting
    sliced = cluster.gpuq("submit", "--mig", "3g.40gb", "--wrap", wait)
    assert sliced.returncode == 0, sliced.stderr
    slice_job = int(sliced.stdout.split()[-1])
    got = cluster.wait_state(slice_job, "running").gpus
    assert len(got) == 1 and units[got[0]].parent_uuid
    go.touch()
    for job in (one, another, slice_job):
        cluster.wait_state(job, "completed")


def test_gpu_mem_at_a_cards_marketed_size_fits(bare_cluster: Cluster) -> None:
    cluster = bare_cluster
    cluster.start_coordinator()
    cluster.start_agent("h", "1xH100-80GB")
    (unit,) = node_info(cluster, "h").gpus
    assert unit.memory == 81_559 * 1024**2  # what NVML says for an H100 80GB
    job = cluster.gpuq("submit", "--gpus", "1", "--gpu-mem", "80G", "--wrap", "true")
    assert job.returncode == 0, job.stderr
    cluster.wait_state(int(job.stdout.split()[-1]), "completed")


def test_a_mig_change_is_found_and_the_node_registers_its_new_units(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "[agent]\ngpu_rescan = 1\n")
    try:
        cluster.start_coordinator()
        cluster.start_agent("m", "1xA100-80GB")
        (gpu,) = unit_uuids(cluster, "m")
        (fake_dir(cluster, "m") / gpu).mkdir(parents=True, exist_ok=True)
        (fake_dir(cluster, "m") / gpu / "mig").write_text("3g.40gb+3g.40gb\n")
        slices = wait_for(
            lambda: len(units := node_info(cluster, "m").gpus) == 2 and units,
            20,
            "the node to register its two MIG slices",
        )
        assert all(unit.parent_uuid == gpu and unit.mig_profile == "3g.40gb" for unit in slices)
        job = cluster.gpuq("submit", "--mig", "3g.40gb", "--wrap", "true")
        assert job.returncode == 0, job.stderr
        cluster.wait_state(int(job.stdout.split()[-1]), "completed")
    finally:
        cluster.close()


ROOT_ONLY = needs(
    os.geteuid() == 0 and Path("/sys/fs/cgroup/devices/devices.deny").exists(),
    "device rules need root and the cgroup v1 devices controller",
)


@ROOT_ONLY
def test_a_job_cannot_open_a_gpu_it_was_not_given(gpu_cluster: Cluster) -> None:
    """The fake GPUs' device nodes are real (195:N): with no driver, opening one's own fails
    with ENXIO (no such device), one denied by the job's device rule with EPERM."""
    cluster = gpu_cluster
    dev = fake_dir(cluster, "a") / "dev"
    assert "advisory" not in cluster.gpuq("nodes").stdout.lower()
    probe = (
        "import errno, os, sys\n"
        "for path in sorted(sys.argv[1:]):\n"
        "    try:\n"
        "        os.close(os.open(path, os.O_RDWR))\n"
        "        print(os.path.basename(path), 'open')\n"
        "    except OSError as error:\n"
        "        print(os.path.basename(path), errno.errorcode[error.errno])\n"
    )
    (cluster.root / "probe.py").write_text(probe)
    nodes = f"{dev}/nvidia0 {dev}/nvidia1"
    command = f"env -u CUDA_VISIBLE_DEVICES {sys.executable} {cluster.root}/probe.py {nodes}"
    none = cluster.submit(command, output=str(cluster.root / "none.out"))
    one = cluster.submit(command, gpus=1, output=str(cluster.root / "one.out"))
    cluster.wait_state(none, "completed")
    held = cluster.wait_state(one, "completed").gpus[0]
    assert (cluster.root / "none.out").read_text().split("\n")[:2] == [
        "nvidia0 EPERM",
        "nvidia1 EPERM",
    ]
    mine = unit_uuids(cluster, "a").index(held)
    expected = {f"nvidia{mine}": "ENXIO", f"nvidia{1 - mine}": "EPERM"}
    seen = dict(line.split() for line in (cluster.root / "one.out").read_text().splitlines())
    assert seen == expected


def test_a_job_is_bound_to_its_cpus(gpu_cluster: Cluster) -> None:
    cluster = gpu_cluster
    if len(os.sched_getaffinity(0)) < 2:
        # CI may take this skip: how many CPUs a runner offers is not part of what CI promises
        pytest.skip("needs 2 CPUs")
    job = cluster.submit(
        "grep Cpus_allowed_list /proc/self/status", cpus=1, output=str(cluster.root / "c.out")
    )
    cluster.wait_state(job, "completed")
    allowed = (cluster.root / "c.out").read_text().split()[-1]
    assert allowed.isdigit(), allowed  # one CPU, not the machine's list
