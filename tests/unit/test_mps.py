"""Opt-in GPU sharing through MPS on the agent (gpuq/agent/jobs/mps_daemons.py): the job environment
contract, shared units at registration, the private control daemons (the fake one, a real
process), a node-wide daemon found, and a share job over its VRAM ended out_of_memory."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
from helpers import needs, until

from gpuq.agent.fake.gpu_backend import FakeGpuBackend
from gpuq.agent.fake.gpu_spec import GIB
from gpuq.agent.fake.gpu_state import claim_fake_vram
from gpuq.agent.gpu.node_gpus import NodeGpus
from gpuq.agent.jobs.launch_spec import LaunchOrder, NodePolicy, build_launch
from gpuq.agent.jobs.mps_daemons import MpsDaemons, MpsError, folder_name
from gpuq.agent.jobs.mps_node_scan import MPS_RESCAN_EVERY, NodeWideMpsScan, node_wide_mps
from gpuq.agent.jobs.mps_share import MpsShare, shared_units
from gpuq.config.settings import AgentSettings
from gpuq.convert import unit_to_proto
from gpuq.domain.model import GpuUnit, JobSpec, Resources

NOBODY = 65534


def unit(uuid: str = "GPU-aaaa", index: int = 0, **fields: object) -> GpuUnit:
    values: dict[str, object] = {
        "uuid": uuid,
        "index": index,
        "name": "NVIDIA H100",
        "memory": 80 * GIB,
        "pci_bus_id": f"0000:0{index}:00.0",
    }
    values.update(fields)
    return GpuUnit(**values)  # type: ignore[arg-type]


# ---- the environment contract (pure) ----------------------------------------------------------


def test_a_share_jobs_environment_names_its_daemon_and_limits() -> None:
    resources = Resources(gpus=1, gpu_mem=20 * GIB, gpu_share=50)
    user_env = {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps", "CUDA_MPS_X": "1", "A": "b"}
    spec = JobSpec(
        name="j", script="#!/bin/sh\n", workdir="/tmp", env=user_env, resources=resources
    )
    order = LaunchOrder(job_id=7, spec=spec, gpus=("GPU-aaaa",), user="alice")
    share = MpsShare("/run/gpuq/mps/x/pipe", "/run/gpuq/mps/x/log", 50, 20 * GIB)
    env = build_launch(order, NodePolicy("n1", {"GPU-aaaa": unit()}), mps=share).env
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpuq/mps/x/pipe"
    assert env["CUDA_MPS_LOG_DIRECTORY"] == "/run/gpuq/mps/x/log"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert "CUDA_MPS_X" not in env and env["A"] == "b"  # the user's own MPS settings go
    plain = build_launch(order, NodePolicy("n1", {"GPU-aaaa": unit()})).env
    assert not [key for key in plain if key.startswith("CUDA_MPS_")]


# ---- shared units -----------------------------------------------------------------------------


def test_shared_gpus_names_whole_gpus_by_index_or_uuid() -> None:
    units = [
        unit("GPU-a", 0),
        unit("GPU-b", 1),
        unit("MIG-c", 2, parent_uuid="GPU-c", mig_profile="3g.40gb"),
    ]
    assert shared_units(units, "") == (frozenset(), [])
    assert shared_units(units, "all") == (frozenset({"GPU-a", "GPU-b"}), [])
    assert shared_units(units, "1, gpu-a") == (frozenset({"GPU-a", "GPU-b"}), [])
    assert shared_units(units, "MIG-c,7") == (frozenset(), ["MIG-c", "7"])


def test_shared_units_register_as_shared_and_unknown_entries_warn_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = FakeGpuBackend("2xH100-80GB,1xA100-80GB:mig=3g.40gb+3g.40gb", "n1", tmp_path / "g")
    settings = AgentSettings(node_name="n1", shared_gpus="0,2,9")
    care = NodeGpus(
        backend,
        settings,
        None,  # type: ignore[arg-type]
        beat_now=lambda: None,
        units_changed=lambda: None,
        stop_job=lambda *_: asyncio.sleep(0),
    )
    care._set_inventory(backend.inventory())  # read again: still one warning
    flags = [(u.index, bool(u.mig_profile), u.shared) for u in care.inventory.units]
    assert flags[0] == (0, False, True)
    assert flags[1] == (1, False, False)
    assert all(not shared for _, mig, shared in flags[2:] if mig)  # a MIG slice never is
    assert unit_to_proto(care.inventory.units[0]).shared
    assert care.units[care.inventory.units[0].uuid].shared
    warnings = [r.getMessage() for r in caplog.records if "shared_gpus" in r.getMessage()]
    assert len([w for w in warnings if "'9'" in w]) == 1, warnings
    backend.close()


# ---- the control daemons (fake, real processes) -----------------------------------------------


def daemon_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)


def gone(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text.rpartition(")")[2].split()[0] == "Z"


@needs(os.geteuid() == 0, "chowns the pipe folder to another user")
def test_the_daemon_starts_with_the_first_share_job_and_stops_after_the_last(
    tmp_path: Path,
) -> None:
    modes: list[tuple[str, int]] = []
    (tmp_path / "run").mkdir()
    daemons = MpsDaemons(
        tmp_path / "run", fake=True, set_compute_mode=lambda u, m: modes.append((u, m))
    )
    gpu = "GPU-12345678-aaaa-bbbb-cccc-000000000000"

    async def scenario() -> None:
        first = await daemons.acquire(7, gpu, NOBODY, NOBODY, percent=50, mem_limit=20 * GIB)
        (daemon,) = daemons.daemons.values()
        pid = daemon.pid
        pipe = Path(first.pipe_dir)
        assert pipe == tmp_path / "run" / "mps" / folder_name(gpu) / "pipe"
        assert stat.S_ISSOCK((pipe / "control").lstat().st_mode)
        info = pipe.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (NOBODY, 0o700)  # the job's user's
        log = Path(first.log_dir) / "control.log"
        assert "started" in log.read_text()
        env = daemon_env(pid)
        assert env["CUDA_VISIBLE_DEVICES"] == gpu
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == first.pipe_dir
        assert env["CUDA_MPS_LOG_DIRECTORY"] == first.log_dir
        assert modes == [(gpu, 3)]  # EXCLUSIVE_PROCESS while it runs
        # a second share job of that user: the same daemon; another user's waits its turn
        second = await daemons.acquire(8, gpu, NOBODY, NOBODY, percent=25, mem_limit=GIB)
        assert second.pipe_dir == first.pipe_dir and daemons.pids() == {pid}
        with pytest.raises(MpsError, match="one user at a time"):
            await daemons.acquire(9, gpu, 0, 0, percent=10, mem_limit=GIB)
        assert daemons.is_ours(pid)
        daemons.release(7)
        assert not daemons._stops and daemons.pids() == {pid}  # job 8 still runs: no stop
        assert not gone(pid)
        daemons.release(8)
        await asyncio.wait_for(asyncio.gather(*daemons._stops), 15)
        assert gone(pid)
        assert not (pipe / "control").exists()
        assert "Command: quit" in log.read_text()
        assert modes == [(gpu, 3), (gpu, 0)]  # back to DEFAULT
        assert daemons.daemons == {}
        # the next user gets a fresh daemon and folders of their own
        third = await daemons.acquire(9, gpu, 0, 0, percent=10, mem_limit=GIB)
        assert Path(third.pipe_dir).stat().st_uid == 0
        # the agent stops while job 9 runs: its daemon stays, and the next agent takes it over
        await daemons.close()
        (kept,) = daemons.daemons.values()
        assert not gone(kept.pid)
        later = MpsDaemons(tmp_path / "run", fake=True)
        later.recover()
        assert later.pids() == {kept.pid} and later.is_ours(kept.pid)
        later.adopt(9, gpu)
        later.stop_idle()
        assert later.pids() == {kept.pid}  # job 9 uses it
        later.release(9)
        await asyncio.wait_for(asyncio.gather(*later._stops), 15)
        assert later.daemons == {}
        deadline = time.monotonic() + 5
        while not gone(kept.pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert gone(kept.pid)

    try:
        asyncio.run(scenario())
    finally:
        for daemon in daemons.daemons.values():
            if daemon.process is not None:
                daemon.process.kill()


def test_a_daemon_that_does_not_start_refuses_the_job(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    daemons = MpsDaemons(tmp_path / "run", fake=True, command=("/bin/false",))

    async def scenario() -> None:
        with pytest.raises(MpsError, match="did not start"):
            await daemons.acquire(7, "GPU-1", os.geteuid(), os.getegid(), percent=5, mem_limit=1)
        assert daemons.daemons == {}

    asyncio.run(scenario())


def test_the_fake_backend_sets_the_compute_mode_where_permitted(tmp_path: Path) -> None:
    state = tmp_path / "g"
    backend = FakeGpuBackend("1xH100-80GB", "n1", state_dir=state)
    gpu = backend.inventory().units[0].uuid
    backend.set_compute_mode(gpu, 3)
    assert (state / gpu / "compute_mode").read_text().strip() == "3"
    (state / gpu / "compute_mode").write_text("noperm\n")
    with pytest.raises(Exception, match=r"(?i)permission"):
        backend.set_compute_mode(gpu, 0)
    backend.close()


# ---- a node-wide daemon ------------------------------------------------------------------------


def test_a_node_wide_daemon_is_found_and_clears_when_it_goes(tmp_path: Path) -> None:
    fake_proc = tmp_path / "bin" / "nvidia-cuda-mps-control"
    fake_proc.parent.mkdir()
    shutil.copy("/bin/sleep", fake_proc)
    default_pipe = tmp_path / "nvidia-mps"
    assert node_wide_mps(lambda pid: False, default_pipe=default_pipe) is None
    process = subprocess.Popen([str(fake_proc), "60"])
    try:
        deadline = time.monotonic() + 5
        found = None
        while found is None and time.monotonic() < deadline:
            found = node_wide_mps(lambda pid: False, default_pipe=default_pipe)
        assert found is not None
        assert f"pid {process.pid}" in found and "misconfigured" in found
        assert "nvidia-cuda-mps-control" in found
        # one of the agent's own daemons is no misconfiguration
        assert node_wide_mps(lambda pid: pid == process.pid, default_pipe=default_pipe) is None
    finally:
        process.kill()
        process.wait()
    assert node_wide_mps(lambda pid: False, default_pipe=default_pipe) is None
    default_pipe.mkdir()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(default_pipe / "control"))
        found = node_wide_mps(lambda pid: False, default_pipe=default_pipe)
        assert found is not None and "control exists" in found


def test_the_agents_look_reads_new_processes_and_every_one_now_and_then(tmp_path: Path) -> None:
    """The heartbeat's look reads the comm of new processes only (a node runs thousands), yet
    a daemon in a new process is found at the next look, and one a known process execs in
    place at the next full reading."""
    proc, now = tmp_path / "proc", [0.0]

    def process(pid: int, comm: str) -> None:
        (proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")

    for pid in range(100, 150):
        process(pid, "bash")
    scan = NodeWideMpsScan(
        lambda pid: pid == 170, clock=lambda: now[0], proc=proc, default_pipe=tmp_path / "mps"
    )

    def look(after: float) -> str | None:
        now[0] += after
        scan.scan()
        return scan.problem

    assert look(0) is None and look(5) is None  # every process read twice: known
    process(160, "nvidia-cuda-mps-control")  # `nvidia-cuda-mps-control -d` forks its daemon
    assert "pid 160" in (look(5) or "")
    assert look(0.5) is not None  # looks stay MPS_SCAN_EVERY apart
    (proc / "160" / "comm").unlink()
    (proc / "160").rmdir()
    process(170, "nvidia-cuda-mps-server")  # the agent's own
    process(180, "python3")  # caught between its fork and its exec...
    assert look(5) is None
    process(180, "nvidia-cuda-mps-control")  # ...is read again at the next look
    assert "pid 180" in (look(5) or "")
    process(180, "sleep")
    assert look(5) is None
    (proc / "130" / "comm").write_text("nvidia-cuda-mps-control\n")  # exec in place
    assert look(5) is None
    assert "pid 130" in (look(MPS_RESCAN_EVERY) or "")


# ---- enforcement by measure ---------------------------------------------------------------------


class TwoJobsHub:
    def __init__(self, pids: dict[int, int], gpu: str) -> None:
        self.pids = pids  # pid -> job
        self.gpu = gpu

    def running_jobs(self) -> list[int]:
        return sorted(self.pids.values())

    def launch_spec_of(self, job_id: int) -> None:
        return None

    def supervisor_pids(self) -> dict[int, int]:
        return dict(self.pids)


def test_a_share_job_over_its_vram_ends_out_of_memory_and_its_neighbour_runs(
    tmp_path: Path,
) -> None:
    state = tmp_path / "g"
    backend = FakeGpuBackend("1xH100-80GB", "n1", state_dir=state)
    gpu = backend.inventory().units[0].uuid
    first = subprocess.Popen(["sleep", "60"])
    second = subprocess.Popen(["sleep", "60"])
    stops: list[tuple[int, str, str]] = []

    async def stop(job_id: int, state: str, reason: str, grace: float) -> None:
        stops.append((job_id, state, reason))

    async def scenario() -> None:
        care = NodeGpus(
            backend,
            AgentSettings(node_name="n1", shared_gpus="all"),
            TwoJobsHub({first.pid: 7, second.pid: 8}, gpu),  # type: ignore[arg-type]
            beat_now=lambda: None,
            units_changed=lambda: None,
            stop_job=stop,
        )
        care.shares.loop = asyncio.get_running_loop()
        for job in (7, 8):
            care.holders.job_units[job] = (gpu,)
            care.holders.set_share(job, 20 * GIB)
        claim_fake_vram(gpu, 20 * GIB, pid=first.pid, state_dir=state)  # at its limit: fine
        claim_fake_vram(gpu, 10 * GIB, pid=second.pid, state_dir=state)
        await asyncio.to_thread(care.reads.usage)
        assert stops == []  # (one asked here would also show in the list checked below)
        claim_fake_vram(gpu, int(23.1 * GIB), pid=first.pid, state_dir=state)
        await asyncio.to_thread(care.reads.usage)
        await asyncio.to_thread(care.reads.usage)  # stopped once
        await until(lambda: stops)
        assert stops == [
            (7, "out_of_memory", "used 23.1G of its 20G GPU share (MPS) on GPU 0"),
        ]
        # the supervisor ends it "cancelled" with that reason: its report says out_of_memory
        reason = stops[0][2]
        assert care.shares.end_state(8, "completed", "") == "completed"
        assert (
            care.shares.end_state(7, "cancelled", f"{reason}; isolation: advisory")
            == "out_of_memory"
        )
        assert care.job_ended(7)
        assert 7 not in care.holders.share_limits and 8 in care.holders.share_limits

    try:
        asyncio.run(scenario())
    finally:
        for process in (first, second):
            process.kill()
            process.wait()
        backend.close()
