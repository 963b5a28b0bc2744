"""A job runs as its submitter, and nothing a user names fools the root processes that start it.

Real Unix users (tests/e2e/unix_users.py), a real fork server and supervisors run by a root hub,
launch specs built as the agent builds them (gpuq.agent.jobs.launch_spec.build_launch from the
user's passwd entry). Root only; CI runs as root.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import unix_users
from supervisor_helpers import TEST_CGROUP_PARENT, cleanup, running_hub
from unix_users import UnixUser, needs_root, run_as

from gpuq.agent.jobs.job_account import lookup_account
from gpuq.agent.jobs.launch_spec import LaunchOrder, LaunchSpec, NodePolicy, build_launch
from gpuq.domain.model import JobSpec

pytestmark = pytest.mark.timeout(60)
user_homes = unix_users.user_homes  # fixtures: throwaway Unix users
unix_user = unix_users.unix_user


@pytest.fixture
def state() -> Iterator[Path]:
    """A hub folder on a path every user may pass through (as a root agent's run folder is):
    the job's user execs its script by its path."""
    needs_root()
    folder = Path(tempfile.mkdtemp(prefix="gpuqt-run-"))
    folder.chmod(0o711)
    try:
        yield folder / "node"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def job_spec(user: UnixUser, job_id: int, script: str, workdir: Path, **fields: Any) -> LaunchSpec:
    """The launch spec the agent would build for `user`'s job (run as the submitter)."""
    sent_env = {"PATH": "/usr/bin:/bin", "HOME": "/root", "USER": "root", "SHELL": "/bin/false"}
    spec = JobSpec(name="j", script="#!/bin/sh\n" + script, workdir=str(workdir), env=sent_env)
    spec = dataclasses.replace(spec, **fields)
    order = LaunchOrder(job_id=job_id, spec=spec, gpus=(), user=user.name)
    policy = NodePolicy("n1", {}, cgroup_parent=TEST_CGROUP_PARENT, switch_user=True)
    account = lookup_account(user.name)
    assert account is not None
    return build_launch(order, policy, account=account)


def launch_all(state: Path, *specs: LaunchSpec) -> dict[int, Any]:
    """Run the specs in a root hub; each job's end report, by id."""
    ends: dict[int, Any] = {}

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            for spec in specs:
                await hub.launch(spec)
            for spec in specs:
                ends[spec.job_id] = await reports.wait(spec.job_id, "ended", timeout=20)

    with cleanup(state):
        asyncio.run(scenario())
    return ends


def workdir_of(user: UnixUser) -> Path:
    work = user.home / "work"
    made = run_as(user, ["-c", f"import os; os.mkdir({str(work)!r}, 0o755)"])
    assert made.returncode == 0, made.stderr
    return work


def test_a_job_runs_as_its_submitter(state: Path, unix_user: UnixUser) -> None:
    """uid, gid, supplementary groups (initgroups), HOME/USER/LOGNAME/SHELL from passwd, the
    submitter's umask; its files are the user's; its script runs by its path."""
    work = workdir_of(unix_user)
    script = (
        'id -u; id -g; id -G; echo "$HOME|$USER|$LOGNAME|$SHELL"; umask; echo "$0"\ntouch made\n'
    )
    spec = job_spec(unix_user, 1, script, work, umask=0o027)
    end = launch_all(state, spec)[1]
    assert end.end_state == "completed", end.reason
    output = work / "gpuq-1.out"
    uid, gid, groups, env, umask, argv0 = output.read_text().splitlines()
    assert (int(uid), int(gid)) == (unix_user.uid, unix_user.gid)
    assert sorted(map(int, groups.split())) == sorted({unix_user.gid, unix_user.extra_gid})
    assert env == f"{unix_user.home}|{unix_user.name}|{unix_user.name}|/bin/sh"
    assert umask == "0027"
    assert argv0 == f"{state}/jobs/1/script"
    for made in (output, work / "made"):
        info = made.stat()
        assert (info.st_uid, info.st_gid) == (unix_user.uid, unix_user.gid), made
        assert stat.S_IMODE(info.st_mode) == 0o640, made


def test_a_job_folder_the_user_cannot_reach_still_runs_the_script(
    tmp_path: Path, unix_user: UnixUser
) -> None:
    """A root agent whose run folder the user cannot pass through (e.g. its state folder):
    the script runs from the supervisor's open file instead."""
    work = workdir_of(unix_user)
    spec = job_spec(unix_user, 1, "id -u\n", work)
    end = launch_all(tmp_path / "state", spec)[1]  # tmp_path's parents are root-only
    assert end.end_state == "completed", end.reason
    assert (work / "gpuq-1.out").read_text() == f"{unix_user.uid}\n"


def test_the_user_cannot_read_the_job_folder(state: Path, unix_user: UnixUser) -> None:
    """0711 folders: the user passes through to its script; it lists nothing and reads no
    spec.json (which holds the job's environment) or result."""
    work = workdir_of(unix_user)
    gate = work / "gate"
    spec = job_spec(unix_user, 1, f"while [ ! -e {gate} ]; do sleep 0.05; done\n", work)
    probe = (
        "import os, sys\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        os.listdir(path) if os.path.isdir(path) else open(path).read()\n"
        "        print('read', path)\n"
        "    except PermissionError:\n"
        "        print('denied', path)\n"
    )
    job_dir = state / "jobs" / "1"
    seen: list[str] = []

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            await reports.wait(1, "running")
            paths = [state, state / "jobs", job_dir, job_dir / "spec.json"]
            done = await asyncio.to_thread(run_as, unix_user, ["-c", probe, *map(str, paths)])
            seen.extend(done.stdout.splitlines())
            gate.touch()
            assert (await reports.wait(1, "ended")).end_state == "completed"

    with cleanup(state):
        asyncio.run(scenario())
    assert seen == [f"denied {path}" for path in (state, state / "jobs", job_dir)] + [
        f"denied {job_dir / 'spec.json'}"
    ]


def test_a_planted_link_does_not_write_through_as_root(
    state: Path, unix_user: UnixUser, tmp_path: Path
) -> None:
    """The user links gpuq-<id>.out to a root file: the job never follows a final symlink
    (and opens as the user, who may not write it), so it fails and the root file is unchanged."""
    victim_dir = Path(tempfile.mkdtemp(prefix="gpuqt-victim-"))
    victim_dir.chmod(0o755)
    victim = victim_dir / "root-file"
    victim.write_text("root's\n")
    victim.chmod(0o644)
    try:
        work = workdir_of(unix_user)
        plant = f"import os; os.symlink({str(victim)!r}, {str(work / 'gpuq-1.out')!r})"
        assert run_as(unix_user, ["-c", plant]).returncode == 0
        end = launch_all(state, job_spec(unix_user, 1, "echo pwned\n", work))[1]
        assert end.end_state == "failed"
        assert end.reason == (
            f"launch failed: output file {work}/gpuq-1.out is a symbolic link; "
            "refusing to write through it"
        )
        assert victim.read_text() == "root's\n"
        assert victim.stat().st_uid == 0
    finally:
        shutil.rmtree(victim_dir, ignore_errors=True)


def test_a_swapped_working_folder_is_entered_as_the_user(state: Path, unix_user: UnixUser) -> None:
    """The workdir replaced by a link to a root-only folder: the job cannot enter it, ends
    failed with the reason, and nothing is written there."""
    secret = Path(tempfile.mkdtemp(prefix="gpuqt-secret-"))  # 0700 root's
    try:
        work = unix_user.home / "work"
        swap = f"import os; os.symlink({str(secret)!r}, {str(work)!r})"
        assert run_as(unix_user, ["-c", swap]).returncode == 0
        spec = job_spec(unix_user, 1, "echo pwned > inside\n", work)
        end = launch_all(state, spec)[1]
        assert end.end_state == "failed"
        assert end.reason == f"launch failed: cannot chdir to {work}: Permission denied"
        assert list(secret.iterdir()) == []
    finally:
        os.rmdir(secret)


def test_a_user_without_an_account_here_never_runs(state: Path, unix_user: UnixUser) -> None:
    """The supervisor looks the user up again: a name that is not (or no longer) the uid's,
    or gone, starts nothing."""
    work = workdir_of(unix_user)
    gone = dataclasses.replace(job_spec(unix_user, 1, "touch ran\n", work), user="gpuqt_nosuchuser")
    other = dataclasses.replace(job_spec(unix_user, 2, "touch ran\n", work), user="root")
    ends = launch_all(state, gone, other)
    assert "user gpuqt_nosuchuser has no passwd entry on this node" in ends[1].reason
    assert f"user root is uid 0 here, not {unix_user.uid}" in ends[2].reason
    assert not (work / "ran").exists()


# ---- the agent: who it runs jobs for ---------------------------------------------------------


def agent_for(tmp_path: Path, address: str, *, allow_root_jobs: bool = False) -> Any:
    """An agent (not connected) whose launches go through its real checks and supervisors."""
    from gpuq.agent.fake.gpu_backend import FakeGpuBackend
    from gpuq.agent.node_agent import Agent, AgentOptions
    from gpuq.config.settings import AgentSettings

    settings = AgentSettings(
        node_name="n1", allow_root_jobs=allow_root_jobs, cgroup_parent=TEST_CGROUP_PARENT
    )
    run_dir = tmp_path / "run"
    values: dict[str, Any] = {"settings": settings, "address": address, "run_dir": run_dir}
    for option in dataclasses.fields(AgentOptions):  # its credential, whatever it is called
        if option.name not in values and option.default is dataclasses.MISSING:
            values[option.name] = "unused"
    backend = FakeGpuBackend("1xL4-24GB", "n1", state_dir=tmp_path / "fake")
    return Agent(AgentOptions(**values), backend, None)  # type: ignore[arg-type]


def launch_message(job_id: int, user: str, workdir: Path) -> Any:
    from gpuq.convert import spec_to_proto
    from gpuq.v1 import agent_pb2 as apb

    spec = JobSpec(name="j", script="#!/bin/sh\nid -u\n", workdir=str(workdir), env={})
    return apb.JobLaunch(job_id=job_id, spec=spec_to_proto(spec), user=user, attempt=1)


def socket_owned_by(path: Path, uid: int) -> str:
    import socket

    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()
    os.chown(path, uid, -1)
    return f"unix:{path}"


def test_an_agent_refuses_root_jobs_unless_allowed(tmp_path: Path) -> None:
    needs_root()
    address = socket_owned_by(tmp_path / "coordinator.sock", 0)

    async def scenario() -> None:
        agent = agent_for(tmp_path, address)
        await agent.launcher.launch(launch_message(1, "root", tmp_path))
        await agent.launcher.launch(launch_message(2, "gpuqt_nosuchuser", tmp_path))
        ends = {job_id: agent.reports.unacked[job_id] for job_id in (1, 2)}
        assert (ends[1].end_state, ends[1].reason) == (
            "failed",
            "node n1 does not run jobs as root ([agent] allow_root_jobs is false there; "
            "root's jobs need it and [coordinator] allow_root_jobs)",
        )
        assert ends[2].reason == "user 'gpuqt_nosuchuser' has no account on node n1"

    asyncio.run(scenario())


def test_a_root_agent_of_a_users_coordinator_runs_only_that_users_jobs(
    tmp_path: Path, unix_user: UnixUser
) -> None:
    """Its coordinator's socket is the user's (a private coordinator): the user's jobs run,
    root's never (even where root jobs are allowed), nor anyone else's."""
    from unix_users import make_user, remove_user

    address = socket_owned_by(tmp_path / "coordinator.sock", unix_user.uid)
    work = workdir_of(unix_user)
    other = make_user(unix_user.home.parent)

    async def scenario() -> None:
        agent = agent_for(tmp_path, address, allow_root_jobs=True)
        await agent.supervisors.start()
        try:
            await agent.launcher.launch(launch_message(1, "root", tmp_path))
            await agent.launcher.launch(launch_message(2, other.name, tmp_path))
            await agent.launcher.launch(launch_message(3, unix_user.name, work))
            for _ in range(2000):
                if 3 in agent.reports.unacked:
                    break
                await asyncio.sleep(0.01)
        finally:
            await agent.supervisors.close()
        assert "private coordinator of uid" in agent.reports.unacked[1].reason
        assert "private coordinator of uid" in agent.reports.unacked[2].reason
        assert agent.reports.unacked[3].end_state == "completed", agent.reports.unacked[3].reason

    try:
        with cleanup(tmp_path / "run"):
            asyncio.run(scenario())
    finally:
        remove_user(other)
    assert (work / "gpuq-3.out").read_text() == f"{unix_user.uid}\n"
