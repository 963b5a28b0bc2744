"""The systemd units `gpuq admin install` writes (gpuq.admin.unit_templates, their one source):
valid for systemd (systemd-analyze verify, which also checks that ExecStart is executable), the
coordinator confined (systemd-analyze security: exposure at most 2.5), and the agent's and the
jobs' units shaped so that restarting or upgrading the agent never costs a job."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import skip_or_fail

GPUQ = Path(sys.executable).parent / "gpuq"
UNITS = ("gpuq-agent.service", "gpuq-coordinator.service", "gpuq-jobs.service")
MAX_COORDINATOR_EXPOSURE = 2.5


@pytest.fixture(scope="module")
def units(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the units a `both` install writes (into a scratch root)."""
    root = tmp_path_factory.mktemp("root")
    done = subprocess.run(
        [str(GPUQ), "admin", "install", "--root", str(root), "--node", "n1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    folder = root / "etc/systemd/system"
    assert sorted(p.name for p in folder.iterdir()) == list(UNITS)
    return folder


def analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        skip_or_fail("systemd-analyze is not installed (.ci/run installs it)")
    return str(found)


def test_units_verify(units: Path) -> None:
    for name in ("gpuq-agent.service", "gpuq-coordinator.service"):  # this installation's
        assert f"\nExecStart={GPUQ} " in (units / name).read_text()
    result = subprocess.run(
        [analyze(), "verify", *(str(units / n) for n in UNITS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


def test_verify_would_see_a_wrong_exec_start(units: Path, tmp_path: Path) -> None:
    """What makes test_units_verify worth its name: a unit whose command is missing fails."""
    broken = tmp_path / "gpuq-coordinator.service"
    text = (units / broken.name).read_text()
    broken.write_text(text.replace(f"ExecStart={GPUQ} ", "ExecStart=/nonexistent/gpuq "))
    result = subprocess.run(
        [analyze(), "verify", str(broken)], capture_output=True, text=True, timeout=60
    )
    assert "/nonexistent/gpuq" in result.stderr


def exposure(unit: Path) -> float:
    result = subprocess.run(
        [analyze(), "security", "--offline=true", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
    if found is None and "--offline" in result.stderr:
        skip_or_fail(f"this systemd-analyze has no --offline (systemd < 252): {result.stderr}")
    assert found is not None, (result.stdout, result.stderr)
    return float(found.group(1))


def test_the_coordinator_is_confined(units: Path) -> None:
    text = (units / "gpuq-coordinator.service").read_text()
    assert "\nUser=gpuq\n" in text and "\nStateDirectory=gpuq\n" in text
    # callers' uids (SO_PEERCRED) must stay theirs: no user namespace
    assert not re.search(r"^PrivateUsers=", text, re.MULTILINE)
    assert exposure(units / "gpuq-coordinator.service") <= MAX_COORDINATOR_EXPOSURE


def test_the_agent_keeps_jobs_across_its_restarts(units: Path) -> None:
    agent = (units / "gpuq-agent.service").read_text()
    assert "\nKillMode=process\n" in agent
    assert "\nRestart=always\n" in agent and "\nRestartPreventExitStatus=2\n" in agent
    # its own state folder: StateDirectory=gpuq would chown the coordinator's to root
    assert "\nStateDirectory=gpuq-agent\n" in agent
    assert "StateDirectory=gpuq\n" not in agent
    assert "\nEnvironment=GPUQ_HOME=/var/lib/gpuq-agent\n" in agent
    # nothing that jobs would inherit and that would change what they may do
    for option in ("NoNewPrivileges=", "ProtectSystem=", "PrivateTmp=", "SystemCallFilter="):
        assert f"\n{option}" not in agent, option
    assert "\nPrivateDevices=" not in agent  # jobs' folders live in /dev/shm
    kept = " ".join(
        line.partition("=")[2]
        for line in agent.splitlines()
        if line.startswith("CapabilityBoundingSet=")
    ).split()
    assert {"CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_SYS_ADMIN"} <= set(kept)
    for capability in kept:  # each one kept says why
        assert re.search(rf"^#.*{capability}\b", agent, re.MULTILINE), capability
    # job cgroups live in the delegated jobs unit, started before the agent
    assert "gpuq-jobs.service" in agent.partition("[Service]")[0]
    jobs = (units / "gpuq-jobs.service").read_text()
    assert "\nDelegate=cpuset memory pids\n" in jobs
    sleep = shutil.which("sleep")
    assert sleep is not None
    assert f"\nExecStart={Path(sleep).resolve()} infinity\n" in jobs
    assert "STOPPING THIS UNIT STOPS EVERY JOB" in jobs
    # nothing that acts through the cgroup, which every job is below: a device list there
    # would deny jobs their GPUs
    for option in ("PrivateDevices=", "DevicePolicy=", "DeviceAllow=", "ProtectClock=", "IP"):
        assert not re.search(rf"^{option}", jobs, re.MULTILINE), option
        assert not re.search(rf"^{option}", agent, re.MULTILINE), option
