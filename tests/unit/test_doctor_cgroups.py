"""The doctor's cgroup checks (gpuq.admin.doctor_cgroups) against fake /proc, /sys and /run
trees: v1, hybrid, pure v2 delegated and not, no device control; and once on this machine."""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path

import pytest

from gpuq.admin.checks import Check, DoctorContext
from gpuq.admin.doctor_cgroups import cgroup_checks
from gpuq.config.settings import AgentSettings, Settings

JOBS = "system.slice/gpuq-jobs.service"
V1 = (
    "cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,memory 0 0\n"
    "cgroup /sys/fs/cgroup/devices cgroup rw,devices 0 0\n"
    "cgroup /sys/fs/cgroup/cpuset cgroup rw,cpuset 0 0\n"
    "cgroup /sys/fs/cgroup/systemd cgroup rw,name=systemd 0 0\n"
)
V2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nsdelegate 0 0\n"


def context(
    tmp_path: Path,
    mounts: str,
    *,
    parent: str = JOBS,
    systemd: bool = True,
    probe: str = "",
) -> DoctorContext:
    proc, sys, run = tmp_path / "proc", tmp_path / "sys", tmp_path / "run"
    (proc / "self").mkdir(parents=True, exist_ok=True)
    (proc / "self" / "mounts").write_text(mounts)
    (sys / "fs" / "cgroup").mkdir(parents=True, exist_ok=True)
    if systemd:
        (run / "systemd" / "system").mkdir(parents=True, exist_ok=True)
    settings = dataclasses.replace(Settings(), agent=AgentSettings(cgroup_parent=parent))
    return DoctorContext(settings, proc=proc, sys=sys, run=run, extra={"device_probe": probe})


def by_name(checks: list[Check]) -> dict[str, Check]:
    assert all(c.fix for c in checks if c.status in ("fail", "warn")), checks
    return {c.name: c for c in checks}


def jobs_unit(tmp_path: Path, controllers: str = "cpuset memory pids") -> Path:
    folder = tmp_path / "sys" / "fs" / "cgroup" / JOBS
    folder.mkdir(parents=True)
    (folder / "cgroup.controllers").write_text(controllers + "\n")
    return folder


def delegate(folder: Path, value: bytes | None) -> None:
    """Set (or leave unset: None) trusted.delegate; skip where the file system takes none."""
    if value is None:
        return
    try:
        os.setxattr(folder, "trusted.delegate", value)
    except OSError as error:
        if error.errno in (errno.ENOTSUP, errno.EPERM):
            pytest.skip("this file system takes no trusted.* xattr here")
        raise


def test_cgroup_v1(tmp_path: Path) -> None:
    checks = by_name(cgroup_checks(context(tmp_path, V1)))
    assert checks["cgroup version"].status == "ok"
    assert checks["cgroup version"].detail == "cgroup v1 (cpuset devices memory)"
    assert checks["cgroup delegation"].status == "skip"
    assert checks["cgroup controllers"].status == "ok"
    assert checks["device control"].status == "ok"
    assert checks["device control"].detail.startswith("devices cgroup v1")


def test_hybrid(tmp_path: Path) -> None:
    mounts = V1 + "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
    checks = by_name(cgroup_checks(context(tmp_path, mounts)))
    assert checks["cgroup version"].detail.startswith("hybrid")
    assert checks["cgroup delegation"].status == "skip"
    assert checks["device control"].detail.startswith("devices cgroup v1")


def test_pure_v2_delegated(tmp_path: Path) -> None:
    delegate(jobs_unit(tmp_path), b"1")
    checks = by_name(cgroup_checks(context(tmp_path, V2)))
    assert checks["cgroup version"].detail.startswith("pure cgroup v2")
    assert checks["cgroup delegation"].status == "ok", checks
    assert checks["cgroup controllers"].status == "ok"
    assert "memory pids cpuset" in checks["cgroup controllers"].detail
    assert checks["device control"] == Check(
        "device control", "ok", "cgroup v2 device program (a test program loaded)"
    )


def test_pure_v2_not_delegated(tmp_path: Path) -> None:
    unit = jobs_unit(tmp_path, "cpuset memory")  # pids left out of Delegate=
    try:
        os.setxattr(unit, "trusted.probe", b"1")
        os.removexattr(unit, "trusted.probe")
    except OSError:
        pytest.skip("this file system takes no trusted.* xattr here")
    checks = by_name(cgroup_checks(context(tmp_path, V2)))
    assert checks["cgroup delegation"].status == "fail"
    assert "not delegated" in checks["cgroup delegation"].detail
    assert "Delegate=" in checks["cgroup delegation"].fix
    assert checks["cgroup controllers"].status == "warn"
    assert "missing pids" in checks["cgroup controllers"].detail


def test_pure_v2_parent_outside_any_unit(tmp_path: Path) -> None:
    checks = by_name(cgroup_checks(context(tmp_path, V2, parent="gpuq")))
    assert checks["cgroup delegation"].status == "fail"
    assert "outside a delegated subtree" in checks["cgroup delegation"].detail
    assert "gpuq admin install" in checks["cgroup delegation"].fix
    # a container without systemd: a parent from the root is how it works there
    plain = by_name(cgroup_checks(context(tmp_path / "c", V2, parent="gpuq", systemd=False)))
    assert plain["cgroup delegation"].status == "ok"


def test_pure_v2_jobs_unit_not_running(tmp_path: Path) -> None:
    checks = by_name(cgroup_checks(context(tmp_path, V2)))
    assert checks["cgroup delegation"].status == "fail"
    assert "does not exist" in checks["cgroup delegation"].detail
    assert checks["cgroup controllers"].status == "fail"  # no memory for job groups


def test_no_device_control(tmp_path: Path) -> None:
    mounts = "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
    checks = by_name(cgroup_checks(context(tmp_path, mounts)))
    assert checks["device control"].status == "fail"
    refused = by_name(cgroup_checks(context(tmp_path / "b", V2, probe="Operation not permitted")))
    assert refused["device control"].status == "fail"
    assert "Operation not permitted" in refused["device control"].detail


def test_nothing_mounted(tmp_path: Path) -> None:
    checks = by_name(cgroup_checks(context(tmp_path, "")))
    assert checks["cgroup version"].status == "fail"
    assert checks["device control"].status == "fail"


def test_this_machines_device_program_loads_as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real probe (the C extension): on this machine's /proc, as root, a program loads."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if not any(
        line.split()[2] == "cgroup2" for line in Path("/proc/self/mounts").read_text().splitlines()
    ):
        pytest.skip("no cgroup2 here")
    from gpuq.agent import _supervise

    assert _supervise.probe_device_program() == ""
    monkeypatch.setenv("GPUQ_TEST_DEVICE_PROGRAM_FAIL", "1")  # a refused load, as the C says it
    assert _supervise.probe_device_program().startswith("cannot load a cgroup v2 device program")
    monkeypatch.delenv("GPUQ_TEST_DEVICE_PROGRAM_FAIL")
    settings = dataclasses.replace(Settings(), agent=AgentSettings(cgroup_parent=JOBS))
    checks = by_name(cgroup_checks(DoctorContext(settings)))
    assert checks["device control"].status == "ok"
