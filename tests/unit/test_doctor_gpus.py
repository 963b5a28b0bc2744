"""The doctor's GPU checks against fakes: no driver, a fabric manager that is not running, a
node-wide MPS daemon, MIG slices without caps nodes; each finding says how to fix it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq.admin.checks import Check, DoctorContext
from gpuq.admin.doctor_gpus import gpu_checks
from gpuq.agent.fake.gpu_spec import fake_uuid
from gpuq.agent.gpu.nvml_backend import NvmlGpuBackend
from gpuq.config.settings import AgentSettings, Settings


def context(tmp_path: Path, **agent: object) -> DoctorContext:
    settings = Settings(home=tmp_path / "home", agent=AgentSettings(node_name="n1", **agent))  # type: ignore[arg-type]
    for root in ("proc", "sys", "dev", "run"):
        (tmp_path / root).mkdir(exist_ok=True)
    return DoctorContext(
        settings,
        proc=tmp_path / "proc",
        sys=tmp_path / "sys",
        dev=tmp_path / "dev",
        run=tmp_path / "run",
        extra={
            "fake_gpu_dir": str(tmp_path / "fake"),
            "mps_pipe": str(tmp_path / "nvidia-mps"),
            "path": str(tmp_path / "bin"),
        },
    )


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


def test_fake_gpus_that_are_fine_pass_every_check(tmp_path: Path) -> None:
    checks = by_name(gpu_checks(context(tmp_path, fake_gpus="2xH100-80GB")))
    assert checks["driver"].status == "skip" and "fake GPUs" in checks["driver"].detail
    assert checks["fabric manager"].status == "ok", checks["fabric manager"]
    assert checks["MPS binary"].status == "skip"
    assert checks["node-wide MPS"].status == "ok"
    assert checks["MIG"].status == "skip"
    assert all(c.status != "fail" for c in checks.values())


def test_a_fabric_manager_that_is_not_running_fails_with_how_to_start_it(tmp_path: Path) -> None:
    gpu = fake_uuid("GPU", "n1", "gpu/1")
    (tmp_path / "fake" / gpu).mkdir(parents=True)
    (tmp_path / "fake" / gpu / "fabric").write_text("not started\n")
    fabric = by_name(gpu_checks(context(tmp_path, fake_gpus="2xH100-80GB")))["fabric manager"]
    assert fabric.status == "fail" and "fabric manager not running" in fabric.detail
    assert "1 GPU(s)" in fabric.detail and "nvidia-fabricmanager" in fabric.fix
    (tmp_path / "fake" / gpu / "fabric").write_text("completed Unknown\n")
    fabric = by_name(gpu_checks(context(tmp_path, fake_gpus="2xH100-80GB")))["fabric manager"]
    assert fabric.status == "fail" and "registration failed" in fabric.detail
    no_switch = by_name(gpu_checks(context(tmp_path, fake_gpus="2xL4-24GB")))["fabric manager"]
    assert no_switch.status == "skip"


def start_daemon(program: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`program` (a link to python named as MPS's daemon) sleeping, once it runs: forked but
    not yet exec'd, it would still bear its parent's name."""
    daemon = subprocess.Popen([str(program), "-c", "import time; time.sleep(60)"], env=env)
    comm, deadline = Path(f"/proc/{daemon.pid}/comm"), time.monotonic() + 10
    while not comm.read_text().startswith("nvidia-cuda-mps"):
        assert time.monotonic() < deadline, "the daemon's program never ran"
        time.sleep(0.01)
    return daemon


@pytest.fixture
def mps_daemon(tmp_path: Path) -> Iterator[int]:
    """A process named nvidia-cuda-mps-control that gpuq did not start (a node-wide one)."""
    program = tmp_path / "bin" / "nvidia-cuda-mps-control"
    program.parent.mkdir(parents=True)
    program.symlink_to(sys.executable)
    daemon = start_daemon(program)
    try:
        yield daemon.pid
    finally:
        daemon.kill()
        daemon.wait(10)


def test_a_node_wide_mps_daemon_fails_and_the_mps_binary_is_found(
    tmp_path: Path, mps_daemon: int
) -> None:
    ctx = context(tmp_path, shared_gpus="all")
    ctx = DoctorContext(ctx.settings, proc=Path("/proc"), sys=ctx.sys, dev=ctx.dev, extra=ctx.extra)
    checks = by_name(gpu_checks(ctx))
    found = checks["node-wide MPS"]
    # the first daemon found is named: ours, or one another test on this machine runs
    assert found.status == "fail" and "node-wide MPS daemon runs" in found.detail, found
    assert "echo quit | nvidia-cuda-mps-control" in found.fix
    assert checks["MPS binary"].status == "ok"
    assert checks["MPS binary"].detail.endswith("bin/nvidia-cuda-mps-control")


def test_a_shared_gpu_without_the_mps_binary_fails(tmp_path: Path) -> None:
    binary = by_name(gpu_checks(context(tmp_path, shared_gpus="0")))["MPS binary"]
    assert binary.status == "fail" and "shared_gpus" in binary.fix


def test_a_node_wide_pipe_left_behind_fails(tmp_path: Path) -> None:
    (tmp_path / "nvidia-mps").mkdir()
    (tmp_path / "nvidia-mps" / "control").write_text("")
    found = by_name(gpu_checks(context(tmp_path)))["node-wide MPS"]
    assert found.status == "fail" and "control exists" in found.detail


@pytest.mark.skipif(os.geteuid() != 0, reason="fake GPUs have device nodes only as root")
def test_mig_slices_without_caps_nodes_fail_and_the_doctor_makes_none(tmp_path: Path) -> None:
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "caps-late").write_text("")
    spec = "1xA100-80GB:mig=3g.40gb+3g.40gb,1xA100-80GB"
    mig = by_name(gpu_checks(context(tmp_path, fake_gpus=spec)))["MIG GPU 0"]
    assert mig.status == "fail" and "2 of 2 slices" in mig.detail, mig
    assert "as root" in mig.fix
    assert not (tmp_path / "fake" / "dev" / "nvidia-caps").exists()  # it only looked
    (tmp_path / "fake" / "caps-late").unlink()
    mig = by_name(gpu_checks(context(tmp_path, fake_gpus=spec)))["MIG GPU 0"]
    assert mig.status == "ok" and "2 slices (3g.40gb, 3g.40gb)" in mig.detail


def test_no_driver_fails_where_nvidia_gpus_sit_on_the_bus_and_skips_elsewhere(
    tmp_path: Path,
) -> None:
    probe = NvmlGpuBackend()
    has_driver = not probe.inventory().problem
    probe.close()
    if has_driver:
        pytest.skip("this machine has a working NVIDIA driver")
    ctx = context(tmp_path)
    driver = by_name(gpu_checks(ctx))["driver"]
    assert driver.status == "skip" and "no NVIDIA GPU in this machine" in driver.detail
    board = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:1b:00.0"
    board.mkdir(parents=True)
    (board / "vendor").write_text("0x10de\n")
    driver = by_name(gpu_checks(ctx))["driver"]
    assert driver.status == "fail" and "no NVIDIA driver" in driver.detail, driver
    assert "1 NVIDIA device(s)" in driver.detail and "driver" in driver.fix


def test_the_agents_own_mps_daemons_are_not_node_wide(tmp_path: Path) -> None:
    program = tmp_path / "bin" / "nvidia-cuda-mps-control"
    program.parent.mkdir(parents=True)
    program.symlink_to(sys.executable)
    pipe = tmp_path / "spool" / "n1" / "mps" / "GPU-1" / "pipe"
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    daemon = start_daemon(program, env)
    try:
        ctx = context(tmp_path, run_dir=str(tmp_path / "spool"))
        ctx = DoctorContext(ctx.settings, proc=Path("/proc"), extra=ctx.extra)
        found = by_name(gpu_checks(ctx))["node-wide MPS"]
        assert f"pid {daemon.pid}" not in found.detail, found
    finally:
        daemon.kill()
        daemon.wait(10)
