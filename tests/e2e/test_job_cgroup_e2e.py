"""Every job gets cgroups of its own, --mem or not (issue 9): nothing a job started outlives it.

One group per hierarchy gpuq uses (memory, devices, cpuset on cgroup v1; one group on v2), all
at the same relative path; job.pid lists them all and every one is removed at the end.

Real fork server, real supervisors, real processes; skipped where this test cannot make a
cgroup (not root, or no hierarchy with the memory controller).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import skip_or_fail
from supervisor_helpers import (
    alive,
    await_until,
    cgroup_mounts,
    cleanup,
    make_spec,
    remove_cgroup_parent,
    running_hub,
    traced,
)

pytestmark = pytest.mark.timeout(60)

# the main process double-forks a `setsid sleep 300` (its own session and group, re-parented)
ESCAPE = """sh -c 'setsid sleep 300 & echo $! > escaped.pid' &
wait
while [ ! -s escaped.pid ]; do :; done
echo $$ > main.pid
"""


def memory_hierarchy() -> Path | None:
    """The mount point of the hierarchy the supervisor uses: cgroup v2 with the memory
    controller, else cgroup v1's memory controller."""
    v1 = None
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, fstype, options, *_ = line.split()
        if fstype == "cgroup2":
            with contextlib.suppress(OSError):
                if "memory" in (Path(point) / "cgroup.controllers").read_text().split():
                    return Path(point)
        if fstype == "cgroup" and "memory" in options.split(","):
            v1 = Path(point)
    return v1


def usable_hierarchy() -> Path:
    root = memory_hierarchy()
    if os.geteuid() != 0 or root is None:
        skip_or_fail("needs root and a cgroup hierarchy with the memory controller")
    probe = root / f"gpuq-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError as error:
        skip_or_fail(f"cannot make a cgroup here: {error}")
    probe.rmdir()
    return root


def recorded_groups(job_dir: Path) -> list[Path]:
    """The cgroup folders the supervisor recorded in job.pid, the memory group first."""
    text = (job_dir / "job.pid").read_text()
    return [Path(line) for line in text.partition("\n")[2].splitlines() if line.strip()]


def expected_groups(root: Path, parent: str, job: str) -> list[Path]:
    """The job's groups: the memory group, then (v1) the devices and cpuset groups."""
    groups = [root / parent / job]
    for controller in ("devices", "cpuset"):
        mount = controller_mount(controller)
        if mount is not None and mount != root:
            groups.append(mount / parent / job)
    return groups


def controller_mount(controller: str) -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, fstype, options, *_ = line.split()
        if fstype == "cgroup" and controller in options.split(","):
            return Path(point)
    return None


def leftovers(parent: str, job: str) -> list[Path]:
    return [mount / parent / job for mount in cgroup_mounts() if (mount / parent / job).exists()]


def pid_in(path: Path) -> int:
    return int(path.read_text().split()[0])


@pytest.fixture
def group_parent() -> Iterator[tuple[Path, str]]:
    root = usable_hierarchy()
    parent = f"gpuq-test-{os.getpid()}"
    yield root, parent
    remove_cgroup_parent(parent)


def test_job_without_mem_leaves_nothing_after_its_main_process_exits(
    tmp_path: Path, group_parent: tuple[Path, str]
) -> None:
    root, parent = group_parent
    state = tmp_path / "state"
    script = "cat /proc/self/cgroup > cgroup.txt\n" + ESCAPE + "exit 3\n"
    spec = make_spec(tmp_path, 1, script, cgroup_parent=parent)

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            end = await reports.wait(1, "ended", timeout=20)
            assert end.end_state == "failed" and end.exit_code == 3
            assert end.reason == "exit code 3; 1 leftover process killed"
            escaped = pid_in(tmp_path / "escaped.pid")
            await await_until(lambda: not alive(escaped), 10, "the escaped sleep gone")
            await hub.ack(1)

    with cleanup(state, tmp_path / "escaped.pid"):
        asyncio.run(scenario())
    joined = (tmp_path / "cgroup.txt").read_text()
    assert f"{parent}/job_1" in joined
    for group in expected_groups(root, parent, "job_1")[1:]:  # v1: one line per controller
        assert f"{group.parent.parent.name}:/{parent}/job_1" in joined
    assert leftovers(parent, "job_1") == []


def test_a_job_joins_its_v1_groups_through_their_tasks_files(
    tmp_path: Path, group_parent: tuple[Path, str]
) -> None:
    """The job's process (single-threaded: vfork's child) writes "0" into each v1 group's
    tasks file, which moves its one thread: the kernel then skips the global lock that a write
    into cgroup.procs takes, whose every taking waits out an RCU grace period (7.3 ms a start
    on Linux 6.18, issue 27). Its children are still born in every group."""
    root, parent = group_parent
    groups = expected_groups(root, parent, "job_1")
    if controller_mount("memory") != root:
        skip_or_fail("the memory controller is on cgroup v2 here: the job is born in its group")
    state, out = tmp_path / "state", tmp_path / "strace.out"
    spec = make_spec(
        tmp_path, 1, "sh -c 'cat /proc/self/cgroup' > cgroup.txt\n", cgroup_parent=parent
    )

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            async with traced(hub, out):
                await hub.launch(spec)
                end = await reports.wait(1, "ended", timeout=20)
            assert end.end_state == "completed", end
            await hub.ack(1)

    with cleanup(state):
        asyncio.run(scenario())
    trace = out.read_text()
    for group in groups:
        assert re.search(rf'write\(\d+<{re.escape(str(group))}/tasks>, "0", 1\) = 1$', trace, re.M)
        assert f"{group}/cgroup.procs>" not in trace
    joined = (tmp_path / "cgroup.txt").read_text()  # a child of the job's
    for group in groups:  # <mount>/<parent>/job_1: a line per controller's mount
        assert f"{group.parent.parent.name}:/{parent}/job_1" in joined


def test_cancelled_job_without_mem_leaves_nothing(
    tmp_path: Path, group_parent: tuple[Path, str]
) -> None:
    root, parent = group_parent
    state = tmp_path / "state"
    spec = make_spec(tmp_path, 2, ESCAPE + "sleep 300\n", cgroup_parent=parent, kill_grace=5.0)
    job_dir = state / "jobs" / "2"

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            await reports.wait(2, "running", timeout=20)
            await await_until(lambda: (tmp_path / "main.pid").exists(), 10, "main.pid")
            main, escaped = pid_in(tmp_path / "main.pid"), pid_in(tmp_path / "escaped.pid")
            groups = recorded_groups(job_dir)
            assert groups == expected_groups(root, parent, "job_2")
            for group in groups:
                members = {int(p) for p in (group / "cgroup.procs").read_text().split()}
                assert {main, escaped} <= members, group
            assert await hub.stop(2, "cancelled", "cancelled by alice", signal.SIGTERM, 5.0)
            end = await reports.wait(2, "ended", timeout=20)
            assert end.end_state == "cancelled"
            await await_until(lambda: not alive(main) and not alive(escaped), 10, "the tree gone")
            await await_until(
                lambda: not any(g.exists() for g in groups), 10, "the job's cgroups removed"
            )
            await hub.ack(2)

    with cleanup(state, tmp_path / "main.pid", tmp_path / "escaped.pid"):
        asyncio.run(scenario())
    assert leftovers(parent, "job_2") == []


def test_hub_stops_an_escaped_process_by_cgroup_when_the_supervisor_dies(
    tmp_path: Path, group_parent: tuple[Path, str]
) -> None:
    """No GPUQ_NODE in the job's environment, so no marker: only the cgroup finds the escaped
    `setsid sleep`, which left the job's process group."""
    root, parent = group_parent
    state = tmp_path / "state"
    spec = make_spec(tmp_path, 3, ESCAPE + "sleep 300\n", cgroup_parent=parent, kill_grace=1.0)
    job_dir = state / "jobs" / "3"
    groups = expected_groups(root, parent, "job_3")

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            await reports.wait(3, "running", timeout=20)
            await await_until(lambda: (tmp_path / "main.pid").exists(), 10, "main.pid")
            main, escaped = pid_in(tmp_path / "main.pid"), pid_in(tmp_path / "escaped.pid")
            assert recorded_groups(job_dir) == groups
            os.kill(pid_in(job_dir / "supervisor.pid"), signal.SIGKILL)
            end = await reports.wait(3, "ended", timeout=30)
            assert end.end_state == "failed"
            assert end.reason.startswith("supervisor lost before the job ended"), end.reason
            assert not alive(main) and not alive(escaped)
            assert leftovers(parent, "job_3") == [], "the hub removes the dead job's cgroups"

    with cleanup(state, tmp_path / "main.pid", tmp_path / "escaped.pid"):
        asyncio.run(scenario())


def test_a_process_that_names_the_job_in_its_environment_is_not_taken_for_it(
    tmp_path: Path, group_parent: tuple[Path, str]
) -> None:
    """Where the job has cgroups, its environment proves nothing: a process elsewhere that
    sets GPUQ_JOB_ID and GPUQ_NODE to the job's is not stopped with it."""
    import subprocess

    _, parent = group_parent
    state = tmp_path / "state"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GPUQ_JOB_ID": "4"}
    env["GPUQ_NODE"] = "n1"
    spec = make_spec(tmp_path, 4, "echo $$ > main.pid\nsleep 300\n", cgroup_parent=parent)
    spec = type(spec).from_dict({**spec.to_dict(), "env": {**spec.env, **env}, "kill_grace": 1.0})
    job_dir = state / "jobs" / "4"
    impostor = subprocess.Popen(["sleep", "300"], env=env)

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            await reports.wait(4, "running", timeout=20)
            await await_until(lambda: (tmp_path / "main.pid").exists(), 10, "main.pid")
            main = pid_in(tmp_path / "main.pid")
            os.kill(pid_in(job_dir / "supervisor.pid"), signal.SIGKILL)
            await reports.wait(4, "ended", timeout=30)
            assert not alive(main)
            assert impostor.poll() is None, "a process outside the job was stopped with it"

    try:
        with cleanup(state, tmp_path / "main.pid"):
            asyncio.run(scenario())
    finally:
        impostor.kill()
        impostor.wait()
    assert leftovers(parent, "job_4") == []


def test_two_installations_never_share_a_job_group(
    tmp_path: Path, group_parent: tuple[Path, str]
) -> None:
    """Each installation's jobs live below its own key (<parent>/<key>/job_<id>): the same job
    id on two installations of one host gets two groups, the end of one leaves the other's
    running, and a process is attributed only to its own installation's job."""
    from gpuq.agent.jobs.attribution import job_of_cgroup_text
    from gpuq.agent.jobs.launch_spec import cgroup_key

    root, parent = group_parent
    keys = [cgroup_key(str(tmp_path / name), "n1") for name in ("one", "two")]
    states = [tmp_path / "one", tmp_path / "two"]
    gate = tmp_path / "gate"
    works = [tmp_path / "w1", tmp_path / "w2"]
    for work in works:
        work.mkdir()
    long_job = f"cat /proc/self/cgroup > cgroup.txt\nwhile [ ! -e {gate} ]; do sleep 0.05; done\n"
    specs = [
        make_spec(
            works[0],
            5,
            "cat /proc/self/cgroup > cgroup.txt\n",
            cgroup_parent=parent,
            cgroup_key=keys[0],
        ),
        make_spec(works[1], 5, long_job, cgroup_parent=parent, cgroup_key=keys[1]),
    ]

    async def scenario() -> None:
        async with (
            running_hub(states[0]) as (hub1, reports1),
            running_hub(states[1]) as (hub2, reports2),
        ):
            await hub2.launch(specs[1])
            await reports2.wait(5, "running")
            await await_until(lambda: (works[1] / "cgroup.txt").exists(), 10, "job 2 up")
            await hub1.launch(specs[0])
            end = await reports1.wait(5, "ended", timeout=20)
            assert end.end_state == "completed" and "leftover" not in end.reason
            assert reports2.of(5)[-1].kind == "running"  # the other's job 5 lives on
            group2 = root / parent / keys[1] / "job_5"
            assert group2.is_dir() and (group2 / "cgroup.procs").read_text().strip()
            gate.touch()
            assert (await reports2.wait(5, "ended", timeout=20)).end_state == "completed"

    with cleanup(states[0]), cleanup(states[1]):
        asyncio.run(scenario())
    texts = [(work / "cgroup.txt").read_text() for work in works]
    for key, text in zip(keys, texts, strict=True):
        assert f"/{parent}/{key}/job_5" in text
        assert job_of_cgroup_text(text, f"{parent}/{key}") == 5
    assert job_of_cgroup_text(texts[1], f"{parent}/{keys[0]}") is None
    assert job_of_cgroup_text(texts[0], f"{parent}/{keys[1]}") is None
    assert leftovers(f"{parent}/{keys[0]}", "job_5") == []
    assert leftovers(f"{parent}/{keys[1]}", "job_5") == []
