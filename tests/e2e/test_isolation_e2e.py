"""Device isolation and CPU binding end to end (issue 10, items 6 and 8): real fork server,
real supervisors, real processes, the machine's own cgroups.

A job's device rules deny the GPU nodes it was not given: opening a denied node fails with
EPERM (the cgroup said no), while a node of the job's own with no driver behind it fails with
ENXIO (the cgroup let it through). Skipped, with the reason, where this cannot be tried (not
root, no devices controller); under CI (CI=true) as root they must run.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import skip_or_fail
from supervisor_helpers import Reports, cleanup, make_spec, running_hub

from gpuq.agent.jobs.isolation import device_numbers, device_rules
from gpuq.agent.jobs.supervisor_reports import SupervisorReport

pytestmark = pytest.mark.timeout(60)

# prints "<path> ok" or "<path> <errno name>" for each path it is given
OPEN = """for path in "$@"; do
  "$PY" - "$path" <<'EOF'
import errno, os, sys
try:
    os.close(os.open(sys.argv[1], os.O_RDONLY))
    print(sys.argv[1], "ok")
except OSError as e:
    print(sys.argv[1], errno.errorcode[e.errno])
EOF
done
"""


def mount_of(controller: str) -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, fstype, options, *_ = line.split()
        if fstype == "cgroup" and controller in options.split(","):
            return Path(point)
    return None


def cgroup2_mount() -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, fstype, *_ = line.split()
        if fstype == "cgroup2":
            return Path(point)
    return None


def on_v2_only() -> bool:
    root = cgroup2_mount()
    return (
        root is not None
        and (root / "cgroup.subtree_control").exists()
        and not any(
            line.split()[2] == "cgroup"
            for line in Path("/proc/self/mounts").read_text().splitlines()
        )
    )


def need_root() -> None:
    if os.geteuid() != 0:
        skip_or_fail("needs root: only root may make cgroups and device rules")


def need_devices() -> str:
    """How this machine isolates devices: 'v1' or 'v2' (skip where neither)."""
    need_root()
    if mount_of("devices") is not None:
        return "v1"
    if on_v2_only():
        return "v2"
    skip_or_fail("no cgroup v1 devices controller and no cgroup v2 here")


def expected_isolation(kind: str) -> str:
    return "devices cgroup v1" if kind == "v1" else "cgroup v2 device program"


def opened(work: Path, job_id: int) -> dict[str, str]:
    lines = (work / f"{job_id}.out").read_text().splitlines()
    return dict(line.rsplit(" ", 1) for line in lines)


async def ended(reports: Reports, job_id: int) -> SupervisorReport:
    end = await reports.wait(job_id, "ended", timeout=20)
    assert end.end_state == "completed", end
    return end


def job_files(state: Path, job_id: int) -> tuple[str, dict[str, object]]:
    """The job folder's isolation file and result.json (read before the ack removes them)."""
    folder = state / "jobs" / str(job_id)
    return (folder / "isolation").read_text(), json.loads((folder / "result.json").read_text())


def test_a_denied_device_cannot_be_opened(tmp_path: Path) -> None:
    kind = need_devices()
    state = tmp_path / "state"
    denied = make_spec(tmp_path, 1, OPEN, args=("/dev/zero", "/dev/null"), device_deny=("c 1:5",))
    allowed = make_spec(tmp_path, 2, OPEN, args=("/dev/zero",))

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(denied)
            await hub.launch(allowed)
            for job in (1, 2):
                await ended(reports, job)
            isolation, result = job_files(state, 1)
            assert isolation == expected_isolation(kind) + "\n"
            assert result["isolation"] == expected_isolation(kind)
            assert job_files(state, 2)[1]["isolation"] == "none: no device to deny"

    with cleanup(state):
        asyncio.run(scenario())
    assert opened(tmp_path, 1) == {"/dev/zero": "EPERM", "/dev/null": "ok"}
    assert opened(tmp_path, 2) == {"/dev/zero": "ok"}


@pytest.fixture
def gpu_nodes(tmp_path: Path) -> Iterator[Path]:
    """/dev/nvidia0 and /dev/nvidia1 look-alikes (major 195): with no NVIDIA driver loaded,
    opening one that the cgroup allows fails with ENXIO."""
    need_root()
    folder = tmp_path / "dev"
    folder.mkdir()
    if Path("/proc/driver/nvidia").exists():
        skip_or_fail("an NVIDIA driver is loaded: its nodes would open (this test wants ENXIO)")
    for minor in (0, 1):
        os.mknod(folder / f"nvidia{minor}", 0o666 | stat.S_IFCHR, os.makedev(195, minor))
    yield folder


def test_a_job_keeps_its_own_gpu_node_and_loses_the_others(tmp_path: Path, gpu_nodes: Path) -> None:
    kind = need_devices()
    state = tmp_path / "state"
    nodes = [str(gpu_nodes / "nvidia0"), str(gpu_nodes / "nvidia1")]
    devices = {f"GPU-{i}": device_numbers([path]) for i, path in enumerate(nodes)}
    assert devices == {"GPU-0": (("c", 195, 0),), "GPU-1": (("c", 195, 1),)}
    rules = device_rules(devices, ["GPU-0"])
    assert rules == ("c 195:1",)
    spec = make_spec(tmp_path, 1, OPEN, args=tuple(nodes), device_deny=rules)

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            await ended(reports, 1)
            assert job_files(state, 1)[1]["isolation"] == expected_isolation(kind)

    with cleanup(state):
        asyncio.run(scenario())
    assert opened(tmp_path, 1) == {nodes[0]: "ENXIO", nodes[1]: "EPERM"}


def test_cgroup_v2_device_program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The v2 way (a BPF_PROG_TYPE_CGROUP_DEVICE program on the job's v2 group), tried where
    v1's devices controller also exists: the kernel runs a task's v2 device programs even on a
    hybrid machine. GPUQ_DEVICE_CGROUP=v2 makes the supervisor prefer it."""
    need_root()
    if cgroup2_mount() is None:
        # CI may take this skip: its machines need cgroup v1's devices controller, not v2
        pytest.skip("no cgroup v2 mount here")
    monkeypatch.setenv("GPUQ_DEVICE_CGROUP", "v2")
    state = tmp_path / "state"
    spec = make_spec(tmp_path, 1, OPEN, args=("/dev/zero", "/dev/null"), device_deny=("c 1:5",))

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            await ended(reports, 1)
            assert job_files(state, 1)[1]["isolation"] == "cgroup v2 device program"

    with cleanup(state):
        asyncio.run(scenario())
    assert opened(tmp_path, 1) == {"/dev/zero": "EPERM", "/dev/null": "ok"}


def test_isolation_is_advisory_where_no_group_can_be_made(tmp_path: Path) -> None:
    """The job still runs, and says why its device rules are not enforced."""
    need_root()
    state = tmp_path / "state"
    nowhere = "../" * 8 + "proc/gpuq-no-such-folder"  # no cgroup can be made there
    spec = make_spec(
        tmp_path, 1, OPEN, args=("/dev/zero",), device_deny=("c 1:5",), cgroup_parent=nowhere
    )

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            await ended(reports, 1)
            isolation, result = job_files(state, 1)
            assert str(result["isolation"]).startswith("advisory: "), result
            assert isolation == f"{result['isolation']}\n"

    with cleanup(state):
        asyncio.run(scenario())
    assert opened(tmp_path, 1) == {"/dev/zero": "ok"}


def test_a_bad_device_rule_fails_the_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    spec = make_spec(tmp_path, 1, "exit 0\n", device_deny=("c 195:one",))

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            end = await reports.wait(1, "ended", timeout=20)
            assert end.end_state == "failed"
            assert "device_deny" in end.reason, end.reason

    with cleanup(state):
        asyncio.run(scenario())


CPUS = "grep Cpus_allowed_list /proc/self/status\n"


def test_a_job_bound_to_one_cpu_runs_there(tmp_path: Path) -> None:
    online = os.sched_getaffinity(0)
    if 1 not in online:
        # CI may take this skip: how many CPUs a runner offers is not part of what CI promises
        pytest.skip("CPU 1 is not available to this process")
    state = tmp_path / "state"
    spec = make_spec(tmp_path, 1, CPUS, cpuset="1", mems="0")
    unbound = make_spec(tmp_path, 2, CPUS)

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            await hub.launch(unbound)
            for job in (1, 2):
                await ended(reports, job)
            binding = str(job_files(state, 1)[1]["cpu_binding"])
            if os.geteuid() == 0 and mount_of("cpuset") is not None:
                assert binding == "cpuset cgroup v1: 1"
            else:
                assert binding in ("cpuset cgroup v2: 1", "sched_setaffinity: 1"), binding
            assert job_files(state, 2)[1]["cpu_binding"] == "none"

    with cleanup(state):
        asyncio.run(scenario())
    assert (tmp_path / "1.out").read_text().split() == ["Cpus_allowed_list:", "1"]
    assert (tmp_path / "2.out").read_text().split()[1] != "1" or len(online) == 1
