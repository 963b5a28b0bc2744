"""`gpuq admin doctor`, the real command line on this machine: against a coordinator that runs
and one that does not, with a key file anyone can read, an expired certificate, a config error,
a node key the coordinator refuses; and on fake-GPU nodes with no driver, a fabric manager not
started, a node-wide MPS daemon, and no device control. Each answer is one entry per check,
the exit status 1 exactly when one of them says FAIL, and never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from doctor_certs import reissue, site
from e2e_cluster import Cluster, wait_for

pytestmark = pytest.mark.timeout(120)

# the checks of gpuq.admin.doctor_node, doctor_reach and doctor_trust, by the names they print
OWN_CHECKS = ("configuration", "role", "clock", "coordinator", "TLS", "key file", "run folder")


def doctor(home: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`gpuq admin doctor ARGS` with GPUQ_HOME=home: (exit status, stdout, stderr)."""
    environment = {**(env or os.environ), "GPUQ_HOME": str(home)}
    environment.pop("GPUQ_CONFIG", None)
    environment.pop("GPUQ_COORDINATOR", None)
    result = subprocess.run(
        [sys.executable, "-m", "gpuq.cli.main", "admin", "doctor", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.returncode, result.stdout, result.stderr


def entries(out: str) -> dict[str, list[str]]:
    """Each check's entry (its line, and its fix line when it has one) by the check's name;
    a name printed twice (one per bad key file) keeps both, joined."""
    found: dict[str, list[str]] = {}
    last = ""
    for line in out.splitlines():
        if line.startswith(" "):
            found[last].append(line.strip())
            continue
        word, _, rest = line.partition("  ")
        assert word.strip() in ("ok", "warn", "FAIL", "skip"), line
        name = next((n for n in (*OWN_CHECKS, "") if rest.strip().startswith(n)), "")
        last = name or rest.strip().split("  ")[0]
        found.setdefault(last, []).append(line)
    return found


def consistent(code: int, out: str, err: str) -> None:
    """One entry per check and no traceback; exit status 1 exactly when a check FAILs."""
    assert "Traceback" not in out + err, err
    failed = any(line.startswith("FAIL") for line in out.splitlines())
    assert code == (1 if failed else 0), (code, out, err)


def own_failures(out: str) -> list[str]:
    return [
        line
        for line in out.splitlines()
        if line.startswith("FAIL") and line[6:].startswith(OWN_CHECKS)
    ]


def fresh_home(tmp_path: Path, config: str) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text(config)
    return home


# ---- the coordinator, up and down ---------------------------------------------------------------


def test_a_running_coordinator_answers(lone_coordinator: Cluster) -> None:
    code, out, err = doctor(lone_coordinator.home)
    consistent(code, out, err)
    [line] = entries(out)["coordinator"]
    assert line.startswith("ok") and f"unix:{lone_coordinator.home}/gpuq.sock" in line
    assert "answers" in line
    assert own_failures(out) == []  # the clock may warn: a container's clock is the host's
    assert entries(out)["configuration"][0].startswith("ok")
    assert "coordinator" in entries(out)["role"][0] and "agent" in entries(out)["role"][0]


def test_json_says_the_same(lone_coordinator: Cluster) -> None:
    code, out, err = doctor(lone_coordinator.home, "--json")
    assert "Traceback" not in err
    document = json.loads(out)
    assert document["ok"] is (code == 0)
    by_name = {check["name"]: check for check in document["checks"]}
    assert by_name["coordinator"]["status"] == "ok"
    assert set(by_name["clock"]) == {"name", "status", "detail", "fix"}


def test_a_coordinator_that_is_down_fails_naming_its_address(bare_cluster: Cluster) -> None:
    code, out, err = doctor(bare_cluster.home)
    consistent(code, out, err)
    assert code == 1
    line, fix = entries(out)["coordinator"]
    assert line.startswith("FAIL") and "no coordinator answers" in line
    assert f"unix:{bare_cluster.home}/gpuq.sock" in line and "no socket there" in line
    assert fix.startswith("fix: start the coordinator")


def test_a_node_key_the_coordinator_refuses(lone_coordinator: Cluster, tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    key.write_text("x" * 43 + "\n")
    key.chmod(0o600)
    config = lone_coordinator.home / "config.toml"
    config.write_text(config.read_text() + f'node_name = "n9"\nnode_key = "{key}"\n')
    code, out, err = doctor(lone_coordinator.home)
    consistent(code, out, err)
    line, fix = entries(out)["coordinator"]
    assert line.startswith("FAIL") and "refuses this node" in line and "n9" in line
    assert "gpuq admin node-key" in fix


# ---- files -------------------------------------------------------------------------------------


def test_a_key_file_others_can_read_fails_with_its_fix(lone_coordinator: Cluster) -> None:
    auth = lone_coordinator.home / "auth.key"
    auth.chmod(0o644)
    try:
        code, out, err = doctor(lone_coordinator.home)
    finally:
        auth.chmod(0o600)
    consistent(code, out, err)
    assert code == 1
    [line, fix] = entries(out)["key file"]
    assert line.startswith("FAIL") and f"{auth} must be private (mode 0644" in line
    assert fix == f"fix: chmod 600 {auth}"


def test_an_expired_certificate_fails(tmp_path: Path) -> None:
    files = site(tmp_path / "tls")
    reissue(files, -2)
    home = fresh_home(
        tmp_path,
        '[agent]\nnode_name = "n1"\ncoordinator = "127.0.0.1:9"\n'
        f'tls_ca = "{files["ca"]}"\ntls_cert = "{files["cert"]}"\ntls_key = "{files["key"]}"\n',
    )
    code, out, err = doctor(home)
    consistent(code, out, err)
    assert code == 1
    line, fix = entries(out)["TLS"]
    assert line.startswith("FAIL") and "TLS [agent]" in line and "expired on" in line
    assert str(files["cert"]) in line and "gpuq admin certs" in fix


def test_a_config_error_fails_naming_file_and_key(tmp_path: Path) -> None:
    home = fresh_home(tmp_path, "[coordinator]\nheartbeat_intervall = 5\n")
    code, out, err = doctor(home)
    consistent(code, out, err)
    assert code == 1
    line, fix = entries(out)["configuration"]
    assert line.startswith("FAIL") and str(home / "config.toml") in line
    assert "[coordinator] heartbeat_intervall" in line and "did you mean heartbeat_interval" in line
    assert str(home / "config.toml") in fix
    assert entries(out)["coordinator"][0].startswith("skip")


# ---- fake-GPU nodes: the GPU and cgroup checks (gpuq.admin.doctor_gpus, doctor_cgroups) --------
#
# The fakes: the node's fake GPUs live in GPUQ_HOME/agent/<node>/fake-gpus, where the agent keeps
# them, and doctor reads them from [agent] fake_gpus; GPU-<uuid>/fabric holding "NotStarted" is a
# fabric manager that has not started; a process named nvidia-cuda-mps-control that gpuq did not
# start is a node-wide MPS daemon; and the hidden --root DIR reads /proc, /sys, /dev and /run
# below DIR (a PCI board of NVIDIA's with no NVML is a missing driver; a cgroup v1 tree without
# a devices controller is a node without device control).

NODE = "n1"


def fake_node(tmp_path: Path, spec: str = "2xA100-80GB") -> tuple[Path, Path]:
    """A node's home with fake GPUs and its fake GPUs' state folder."""
    home = fresh_home(
        tmp_path,
        f'[agent]\nnode_name = "{NODE}"\nfake_gpus = "{spec}"\ncoordinator = "127.0.0.1:9"\n',
    )
    state = home / "agent" / NODE / "fake-gpus"
    state.mkdir(parents=True)
    return home, state


def fails_naming(out: str, *words: str) -> list[str]:
    return [
        line
        for line in out.splitlines()
        if line.startswith("FAIL") and any(w.lower() in line.lower() for w in words)
    ]


def test_no_driver_fails(tmp_path: Path) -> None:
    """A machine with an NVIDIA board on its PCI bus (in the fake /sys that --root reads) and no
    working NVML: its GPUs would silently go unused."""
    from gpuq.agent.gpu.nvml_backend import NvmlGpuBackend

    probe = NvmlGpuBackend()
    has_driver = not probe.inventory().problem
    probe.close()
    if has_driver:
        pytest.skip("this machine has a working NVIDIA driver")
    home = fresh_home(tmp_path, f'[agent]\nnode_name = "{NODE}"\ncoordinator = "127.0.0.1:9"\n')
    machine = tmp_path / "machine"
    for folder in ("proc/self", "dev", "run"):
        (machine / folder).mkdir(parents=True)
    board = machine / "sys" / "bus" / "pci" / "devices" / "0000:1b:00.0"
    board.mkdir(parents=True)
    (board / "vendor").write_text("0x10de\n")
    code, out, err = doctor(home, "--root", str(machine))
    consistent(code, out, err)
    assert code != 0 and fails_naming(out, "NVIDIA device(s) on the PCI bus"), out


def test_a_fabric_manager_not_started_fails(tmp_path: Path) -> None:
    from gpuq.agent.fake.gpu_spec import fake_uuid

    home, state = fake_node(tmp_path, "2xH100-80GB")
    for index in range(2):
        gpu = state / fake_uuid("GPU", NODE, f"gpu/{index}")
        gpu.mkdir()
        (gpu / "fabric").write_text("NotStarted\n")
    code, out, err = doctor(home)
    consistent(code, out, err)
    assert code != 0 and fails_naming(out, "fabric manager"), out


@pytest.fixture
def node_wide_mps(tmp_path: Path) -> Iterator[int]:
    """A process named nvidia-cuda-mps-control that gpuq did not start (a copy of sleep)."""
    program = tmp_path / "bin" / "nvidia-cuda-mps-control"
    program.parent.mkdir()
    sleeper = shutil.which("sleep")
    assert sleeper is not None
    shutil.copy(sleeper, program)
    process = subprocess.Popen([str(program), "300"])
    try:
        wait_for(
            lambda: Path(f"/proc/{process.pid}/comm").read_text().startswith("nvidia-cuda-mps"),
            what="the fake MPS daemon to run",
        )
        yield process.pid
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(10)


def test_a_node_wide_mps_daemon_fails(tmp_path: Path, node_wide_mps: int) -> None:
    home, _state = fake_node(tmp_path)
    code, out, err = doctor(home)
    consistent(code, out, err)
    assert code != 0 and fails_naming(out, "MPS"), out
    assert str(node_wide_mps) in out


def test_no_device_control_fails(tmp_path: Path) -> None:
    home, _state = fake_node(tmp_path)
    machine = tmp_path / "machine"
    controllers = ("cpu", "cpuacct", "cpuset", "memory", "pids", "freezer")  # no "devices"
    for controller in controllers:
        (machine / "sys" / "fs" / "cgroup" / controller).mkdir(parents=True)
    (machine / "proc" / "self").mkdir(parents=True)
    (machine / "proc" / "self" / "cgroup").write_text(
        "".join(f"{n}:{c}:/\n" for n, c in enumerate(controllers, 1)) + "0::/\n"
    )
    (machine / "proc" / "mounts").write_text(
        "".join(f"cgroup /sys/fs/cgroup/{c} cgroup rw,{c} 0 0\n" for c in controllers)
    )
    (machine / "dev").mkdir()
    (machine / "run").mkdir()
    code, out, err = doctor(home, "--root", str(machine))
    consistent(code, out, err)
    assert code != 0 and fails_naming(out, "device"), out
