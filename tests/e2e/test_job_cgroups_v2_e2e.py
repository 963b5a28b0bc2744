"""Job cgroups on cgroup v2 (issue 24): the delegated subtree, the job's v2 limits, the memlock
raise around BPF loads, and what a failed load does to a job and to the node's claim.

Real fork server, real supervisors, real processes. What runs for real depends on the host:
- the holder move and a domain controller enabled in R run on any cgroup2 mount that offers
  one (a hybrid host's /sys/fs/cgroup/unified offers hugetlb);
- a job's group inside R and the device program run on any cgroup2 mount (root);
- memory.oom.group and pids.max need v2's memory and pids controllers, which a hybrid host
  keeps in v1: there they are checked in a fake v2 tree (GPUQ_TEST_CGROUP_V2, test only);
- a job born in its v2 group (clone3 with CLONE_INTO_CGROUP) and the fallback to joining by
  writing run on any cgroup2 mount; strace (attached to the fork server) shows which happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import skip_or_fail
from supervisor_helpers import TEST_CGROUP_PARENT, cleanup, make_spec, running_hub, traced

from gpuq.agent.jobs.isolation import DeviceLoads
from gpuq.agent.jobs.job_cgroups import needs_prepare, prepare

pytestmark = pytest.mark.timeout(60)
UNIT = "jobs.service"  # R = <v2 mount>/<TEST_CGROUP_PARENT>/jobs.service
DEVICE_PROGRAM = "cgroup v2 device program"


def v2_mount() -> Path:
    if os.geteuid() != 0:
        skip_or_fail("needs root: only root may make cgroups")
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, fstype, *_ = line.split()
        if fstype == "cgroup2":
            return Path(point)
    skip_or_fail("no cgroup2 mount here")


def domain_controller(mount: Path) -> str:
    """A domain controller (one the no-internal-process rule applies to) that the mount offers."""
    offered = (mount / "cgroup.controllers").read_text().split()
    for name in ("hugetlb", "memory", "pids", "io"):
        if name in offered:
            return name
    skip_or_fail(f"{mount} offers no domain controller ({offered})")


def remove_tree(folder: Path) -> None:
    """Processes out (to the mount's root), then every group, deepest first."""
    if not folder.is_dir():
        return
    root = folder
    while (root.parent / "cgroup.controllers").exists() and root.parent != root:
        root = root.parent
    for below, _, _ in sorted(os.walk(folder), key=lambda e: -len(e[0])):
        procs = Path(below) / "cgroup.procs"
        with contextlib.suppress(OSError):
            for pid in procs.read_text().split():
                with contextlib.suppress(OSError):
                    (root / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            Path(below).rmdir()


@pytest.fixture
def unit_cgroup() -> Iterator[Path]:
    """R: a unit's cgroup with its main process (`sleep`) in it, as systemd starts one with
    Delegate=: the levels above R (systemd's) offer R the domain controller."""
    mount = v2_mount()
    controller = domain_controller(mount)
    was_on = controller in (mount / "cgroup.subtree_control").read_text().split()
    folder = mount / TEST_CGROUP_PARENT / UNIT
    folder.mkdir(parents=True)
    sleep = subprocess.Popen(["sleep", "300"])
    try:
        for level in (mount, mount / TEST_CGROUP_PARENT):  # systemd's part
            (level / "cgroup.subtree_control").write_text(f"+{controller}")
        (folder / "cgroup.procs").write_text(str(sleep.pid))
        yield folder
    finally:
        sleep.kill()
        sleep.wait()
        remove_tree(mount / TEST_CGROUP_PARENT)
        if not was_on:
            with contextlib.suppress(OSError):  # busy: another user enabled it meanwhile
                (mount / "cgroup.subtree_control").write_text(f"-{controller}")


def test_the_holder_move_lets_the_unit_enable_a_domain_controller(unit_cgroup: Path) -> None:
    controller = domain_controller(unit_cgroup.parent.parent)
    # without the move the kernel refuses: no internal processes below a domain controller
    with pytest.raises(OSError):
        (unit_cgroup / "cgroup.subtree_control").write_text(f"+{controller}")
    missing = "rdma" if controller != "rdma" else "misc"
    done = prepare(unit_cgroup, (controller, missing))
    assert done.moved == 1
    assert done.enabled == (controller,)  # the one the mount lacks failed alone
    assert (unit_cgroup / "cgroup.procs").read_text() == ""
    assert (unit_cgroup / "holder" / "cgroup.procs").read_text().split() != []
    assert controller in (unit_cgroup / "cgroup.subtree_control").read_text().split()
    assert not needs_prepare(done)
    # the unit restarted: controllers off, its process back in R's own cgroup.procs
    (unit_cgroup / "cgroup.subtree_control").write_text(f"-{controller}")
    pid = (unit_cgroup / "holder" / "cgroup.procs").read_text().split()[0]
    (unit_cgroup / "cgroup.procs").write_text(pid)
    assert needs_prepare(done)
    again = prepare(unit_cgroup, (controller,))
    assert (again.moved, again.enabled) == (1, (controller,))


def test_a_supervised_job_lands_inside_the_delegated_subtree(
    unit_cgroup: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its v2 group is R/<key>/job_<id>, and its device program is attached there."""
    prepare(unit_cgroup, (domain_controller(unit_cgroup.parent.parent),))
    monkeypatch.setenv("GPUQ_DEVICE_CGROUP", "v2")  # the v2 group even on a hybrid host
    relative = f"{TEST_CGROUP_PARENT}/{UNIT}"
    spec = make_spec(
        tmp_path,
        1,
        "grep '^0::' /proc/self/cgroup\n",
        cgroup_parent=relative,
        cgroup_key="k1",
        cgroup_delegated=relative,
        device_deny=("c 1:5",),
    )
    state = tmp_path / "state"

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            end = await reports.wait(1, "ended", timeout=20)
            assert end.end_state == "completed", end

    with cleanup(state):
        asyncio.run(scenario())
    assert (tmp_path / "1.out").read_text() == f"0::/{relative}/k1/job_1\n"


def test_a_jobs_v2_group_gets_its_limits_only_inside_the_subtree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """memory.max, memory.swap.max, memory.oom.group, pids.max, the job's cpuset.cpus, and
    cgroup.subtree_control written at R and below only, in a fake v2 tree (the supervisor
    creates its files there); the end reason from its counters: an OOM kill of the whole
    job, forks refused by pids.max."""
    v2_mount()  # root
    fake = tmp_path / "cgroup"
    fake.mkdir()
    (fake / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    monkeypatch.setenv("GPUQ_TEST_CGROUP_V2", str(fake))
    relative = f"{TEST_CGROUP_PARENT}/{UNIT}"
    job = fake / relative / "k1" / "job_1"
    # the job plays the kernel: its group's counters say an OOM kill and 3 refused forks
    script = (
        f"printf 'oom_kill 1\\n' > {job}/memory.events\nprintf 'max 3\\n' > {job}/pids.events\n"
    )
    spec = make_spec(
        tmp_path,
        1,
        script,
        cgroup_parent=relative,
        cgroup_key="k1",
        cgroup_delegated=relative,
        mem_limit=1 << 30,
        job_max_pids=512,
        cpuset="0",
        mems="0",
    )
    state = tmp_path / "state"

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            end = await reports.wait(1, "ended", timeout=20)
            assert end.end_state == "out_of_memory", end
            assert end.reason == (
                "exceeded --mem 1G: the kernel's OOM killer ended the whole job "
                "(memory.oom.group); 3 forks refused: the job reached pids.max (512 processes "
                "and threads)"
            ), end

    with cleanup(state):
        asyncio.run(scenario())
    r = fake / relative
    limits = {
        name: (job / name).read_text()
        for name in ("memory.max", "memory.swap.max", "memory.oom.group", "pids.max", "cpuset.cpus")
    }
    assert limits == {
        "memory.max": str(1 << 30),
        "memory.swap.max": "0",
        "memory.oom.group": "1",
        "pids.max": "512",
        "cpuset.cpus": "0",
    }
    # controllers enabled at R and R/k1, never above R (systemd's levels)
    assert (r / "cgroup.subtree_control").exists()
    assert (r / "k1" / "cgroup.subtree_control").exists()
    assert not (fake / TEST_CGROUP_PARENT / "cgroup.subtree_control").exists()
    assert not (fake / "cgroup.subtree_control").exists()


@contextlib.contextmanager
def low_memlock(limit: int) -> Iterator[None]:
    """This process's (and so the fork server's, the supervisors' and the jobs') soft
    RLIMIT_MEMLOCK at `limit` bytes."""
    before = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, before)


def test_the_job_does_not_inherit_the_raised_memlock_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    v2_mount()
    monkeypatch.setenv("GPUQ_DEVICE_CGROUP", "v2")
    spec = make_spec(tmp_path, 1, "ulimit -l\n", device_deny=("c 1:5",))
    state = tmp_path / "state"

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            end = await reports.wait(1, "ended", timeout=20)
            assert end.end_state == "completed", end
            folder = state / "jobs" / "1"
            assert (folder / "isolation").read_text() == DEVICE_PROGRAM + "\n"

    with cleanup(state), low_memlock(64 * 1024):
        asyncio.run(scenario())
    assert (tmp_path / "1.out").read_text() == "64\n"  # KiB, as before the load


def test_a_failed_load_makes_the_nodes_claim_advisory_until_one_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job still runs, says why; the node's claim (what the agent sends in its next
    heartbeat) is advisory with that reason until a later job's program loads."""
    v2_mount()
    monkeypatch.setenv("GPUQ_DEVICE_CGROUP", "v2")
    loads = DeviceLoads()
    claims: list[str] = []

    def seen(job_id: int, isolation: str) -> None:
        if loads.seen(job_id, isolation):
            claims.append(loads.claim(DEVICE_PROGRAM))

    async def run_job(state: Path, job_id: int) -> None:
        spec = make_spec(tmp_path, job_id, "true\n", device_deny=("c 1:5",))
        async with running_hub(state, on_isolation=seen) as (hub, reports):
            await hub.launch(spec)
            end = await reports.wait(job_id, "ended", timeout=20)
            assert end.end_state == "completed", end

    with cleanup(tmp_path / "a"), cleanup(tmp_path / "b"):
        monkeypatch.setenv("GPUQ_TEST_DEVICE_PROGRAM_FAIL", "1")
        asyncio.run(run_job(tmp_path / "a", 1))
        assert len(claims) == 1
        assert claims[0].startswith("advisory: device rules failed for job 1: cannot load")
        assert "forced by GPUQ_TEST_DEVICE_PROGRAM_FAIL" in claims[0]
        monkeypatch.delenv("GPUQ_TEST_DEVICE_PROGRAM_FAIL")
        asyncio.run(run_job(tmp_path / "b", 2))
    assert claims[1:] == [DEVICE_PROGRAM]


def start_trace(tmp_path: Path, job_id: int) -> tuple[str, str]:
    """A job that prints its v2 group first thing, run in its v2 group under strace: how the
    supervisor says it made the job's process (job.pid) and the trace."""
    spec = make_spec(tmp_path, job_id, "grep '^0::' /proc/self/cgroup\n", device_deny=("c 1:5",))
    state, out = tmp_path / "state", tmp_path / "strace.out"

    async def scenario() -> str:
        async with running_hub(state) as (hub, reports):
            async with traced(hub, out):
                await hub.launch(spec)
                end = await reports.wait(job_id, "ended", timeout=20)
            assert end.end_state == "completed", end
            return (state / "jobs" / str(job_id) / "job.pid").read_text().partition("\n")[0]

    with cleanup(state):
        head = asyncio.run(scenario())
    assert (tmp_path / f"{job_id}.out").read_text() == f"0::/{TEST_CGROUP_PARENT}/job_{job_id}\n"
    return head, out.read_text()


def test_a_job_is_born_in_its_v2_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """clone3 with CLONE_INTO_CGROUP made the job's process in its v2 group: nothing wrote it
    into that group's cgroup.procs (a migration: on a host without favordynmods it waits an RCU
    grace period, 10 to 16 ms of each start)."""
    group = v2_mount() / TEST_CGROUP_PARENT / "job_1"
    monkeypatch.setenv("GPUQ_DEVICE_CGROUP", "v2")  # the v2 group even on a hybrid host
    head, trace = start_trace(tmp_path, 1)
    job_pid, _, how = head.split()
    assert how == "clone3"
    assert clone3_returned(trace, job_pid), trace
    assert f"{group}/cgroup.procs>" not in trace


def clone3_returned(trace: str, result: str) -> bool:
    """A clone3 into a cgroup that returned `result` ("1234", "-1 EBADF"), on one line, or
    split by strace into `<unfinished ...>` and `<... clone3 resumed> = result` when another
    traced process (the child) ran in between."""
    if re.search(rf"clone3\(\{{flags=CLONE_INTO_CGROUP, .*\) += {result}\b", trace, re.M):
        return True
    began = re.search(r"clone3\(\{flags=CLONE_INTO_CGROUP, .*<unfinished \.\.\.>$", trace, re.M)
    return bool(began and re.search(rf"<\.\.\. clone3 resumed>.*\) += {result}\b", trace, re.M))


def test_where_clone3_is_refused_the_job_joins_its_v2_group_by_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPUQ_TEST_CLONE3=refuse hands clone3 a folder that is no cgroup, which the kernel
    refuses (EBADF): the job still starts, vfork'd, and joins its group by writing."""
    group = v2_mount() / TEST_CGROUP_PARENT / "job_1"
    monkeypatch.setenv("GPUQ_DEVICE_CGROUP", "v2")
    monkeypatch.setenv("GPUQ_TEST_CLONE3", "refuse")
    head, trace = start_trace(tmp_path, 1)
    job_pid, _, how = head.split()
    assert how == "vfork:EBADF"
    assert clone3_returned(trace, "-1 EBADF"), trace
    assert re.search(rf"^{job_pid} +write\(\d+<{group}/cgroup.procs>, \"0\", 1\) = 1$", trace, re.M)


def test_a_required_v2_group_that_takes_no_process_fails_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a threaded cgroup a new group is "domain invalid": clone3 into it and a write
    into its cgroup.procs both fail (EOPNOTSUPP). Its device rules make the group required,
    so the start fails, saying which step, as it did before clone3."""
    threaded = v2_mount() / TEST_CGROUP_PARENT / "threaded"
    threaded.mkdir(parents=True)
    (threaded / "cgroup.type").write_text("threaded")
    monkeypatch.setenv("GPUQ_DEVICE_CGROUP", "v2")
    parent = f"{TEST_CGROUP_PARENT}/threaded"
    spec = make_spec(tmp_path, 1, "echo ran\n", cgroup_parent=parent, device_deny=("c 1:5",))
    state = tmp_path / "state"

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            end = await reports.wait(1, "ended", timeout=20)
            assert end.end_state == "failed", end
            assert end.reason.startswith(
                "launch failed: cannot join the job's cgroup: Operation not supported"
            ), end

    try:
        with cleanup(state):
            asyncio.run(scenario())
    finally:
        remove_tree(threaded)
    assert not (tmp_path / "1.out").exists()
