"""The supervisor end to end: real fork server, real processes, signals, files and cgroups."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import pwd
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
from helpers import skip_or_fail
from supervisor_helpers import (
    alive,
    await_until,
    cleanup,
    make_spec,
    read_pid,
    remove_cgroup_parent,
    running_hub,
    spare_supervisors,
    wait_until,
)

from gpuq.agent.jobs.fork_server import ForkServer
from gpuq.errors import GpuqError

pytestmark = pytest.mark.timeout(60)


def memory_hierarchy() -> tuple[Path, int] | None:
    """(mount point, version) of the cgroup hierarchy with the memory controller, v2 first."""
    v1 = None
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, fstype, options, *_ = line.split()
        if fstype == "cgroup2":
            with contextlib.suppress(OSError):
                if "memory" in (Path(point) / "cgroup.controllers").read_text().split():
                    return Path(point), 2
        if fstype == "cgroup" and "memory" in options.split(","):
            v1 = Path(point)
    return (v1, 1) if v1 is not None else None


def cgroup_usable() -> bool:
    """Whether this test may make a memory cgroup with a limit (root and a memory hierarchy)."""
    hierarchy = memory_hierarchy()
    if os.geteuid() != 0 or hierarchy is None:
        return False
    root, version = hierarchy
    probe = root / f"gpuq-probe-{os.getpid()}"
    limit = "memory.max" if version == 2 else "memory.limit_in_bytes"
    try:
        probe.mkdir()
        (probe / limit).write_text(str(1 << 30))
        return True
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def test_exit_codes_and_folder_life(tmp_path: Path) -> None:
    state = tmp_path / "state"

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(make_spec(tmp_path, 1, "exit 0\n"))
            await hub.launch(make_spec(tmp_path, 2, "exit 3\n"))
            await hub.launch(make_spec(tmp_path, 3, "kill -SEGV $$\n"))
            ok, bad, segv = [await reports.wait(j, "ended") for j in (1, 2, 3)]
            assert (ok.end_state, ok.exit_code, ok.signal, ok.reason) == ("completed", 0, None, "")
            assert (bad.end_state, bad.exit_code, bad.reason) == ("failed", 3, "exit code 3")
            assert (segv.end_state, segv.exit_code, segv.signal) == ("failed", None, 11)
            assert segv.reason == "killed by signal SIGSEGV"
            assert [r.kind for r in reports.of(1)] == ["running", "ended"]
            job_dir = state / "jobs" / "1"
            # a root hub's job folders let the job's user pass through to the script (0711);
            # what is in them stays private
            folder_mode = "0o711" if os.geteuid() == 0 else "0o700"
            assert oct(job_dir.stat().st_mode & 0o777) == folder_mode
            assert oct((job_dir / "script").stat().st_mode & 0o777) == "0o700"
            for name in ("spec.json", "result.json", "supervisor.pid", "job.pid", "isolation"):
                assert oct((job_dir / name).stat().st_mode & 0o777) == "0o600", name
            assert hub.running_jobs() == []
            for job_id in (1, 2, 3):
                await hub.ack(job_id)
            await_gone = [state / "jobs" / str(j) for j in (1, 2, 3)]
            deadline = time.monotonic() + 10
            while any(p.exists() for p in await_gone) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert not any(p.exists() for p in await_gone)

    with cleanup(state):
        asyncio.run(scenario())


def test_a_supervisor_is_named_for_its_job(tmp_path: Path) -> None:
    """`ps -e`, `top` and `pgrep gpuq-job` show each supervisor with its job's id (comm, at
    most 15 bytes: a long id gets a shorter prefix, never a cut id); its command line stays
    the fork server's, and the job's own processes have their own names."""
    state = tmp_path / "state"

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            names = {12: "gpuq-job 12", 1234567: "gpuq 1234567", 1234567890: "gpuq 1234567890"}
            for job_id in names:
                await hub.launch(make_spec(tmp_path, job_id, "sleep 30\n"))
            for job_id, name in names.items():
                pid = read_pid(state / "jobs" / str(job_id) / "supervisor.pid")
                comm = Path(f"/proc/{pid}/comm")
                wait_until(lambda c=comm, n=name: c.read_text() == n + "\n", what=name)
                assert b"_supervise" in Path(f"/proc/{pid}/cmdline").read_bytes()
                job = read_pid(state / "jobs" / str(job_id) / "job.pid")
                assert Path(f"/proc/{job}/comm").read_text() != name + "\n"
                await hub.stop(job_id)
                await reports.wait(job_id, "ended")

    with cleanup(state):
        asyncio.run(scenario())


def test_an_idle_fork_server_forks_the_next_supervisor_ahead_of_its_job(tmp_path: Path) -> None:
    """After a quiet moment the fork server holds one supervisor forked ahead ("gpuq spare"),
    and the next launch hands it the job instead of forking: the fork is off the launch's
    path. A spare killed before it has a job costs nothing (the next launch forks, the agent
    hears of no supervisor's death), and when the agent goes the spare goes too."""
    state = tmp_path / "state"
    left: list[int] = []

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            assert hub.forks.fork_server is not None
            server = hub.forks.fork_server.process.pid
            await await_until(lambda: len(spare_supervisors(server)) == 1, what="a spare")
            [spare] = spare_supervisors(server)
            await hub.launch(make_spec(tmp_path, 1, "echo one\n"))
            assert (await reports.wait(1, "ended")).end_state == "completed"
            assert read_pid(state / "jobs" / "1" / "supervisor.pid") == spare
            assert (tmp_path / "1.out").read_text() == "one\n"

            await await_until(lambda: len(spare_supervisors(server)) == 1, what="the next spare")
            [killed] = spare_supervisors(server)
            assert killed != spare
            os.kill(killed, signal.SIGKILL)
            await await_until(lambda: not alive(killed), what="the spare's death")
            await hub.launch(make_spec(tmp_path, 2, "echo two\n"))
            assert (await reports.wait(2, "ended")).end_state == "completed"
            assert read_pid(state / "jobs" / "2" / "supervisor.pid") != killed
            assert (tmp_path / "2.out").read_text() == "two\n"
            assert killed not in hub.forks.exits  # no job's supervisor died
            await await_until(lambda: len(spare_supervisors(server)) == 1, what="a spare again")
            left.extend(spare_supervisors(server))

    with cleanup(state):
        asyncio.run(scenario())
    wait_until(lambda: not any(map(alive, left)), what="the spare to leave with the agent")


def test_output_files(tmp_path: Path) -> None:
    state = tmp_path / "state"
    body = "echo out; echo err >&2\n"

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            (tmp_path / "4.out").write_text("old\n")
            await hub.launch(make_spec(tmp_path, 1, body))
            sep = make_spec(tmp_path, 2, body, stderr_path=str(tmp_path / "2.err"))
            await hub.launch(sep)
            await hub.launch(make_spec(tmp_path, 3, "echo $1 $2 $GPUQ_X; pwd\n", args=("a", "b")))
            await hub.launch(make_spec(tmp_path, 4, body, open_mode="append"))
            for job_id in (1, 2, 3, 4):
                assert (await reports.wait(job_id, "ended")).end_state == "completed"

    with cleanup(state):
        asyncio.run(scenario())
    assert (tmp_path / "1.out").read_text() == "out\nerr\n"
    assert (tmp_path / "2.out").read_text() == "out\n"
    assert (tmp_path / "2.err").read_text() == "err\n"
    assert (tmp_path / "3.out").read_text() == f"a b\n{tmp_path}\n"
    assert (tmp_path / "4.out").read_text() == "old\nout\nerr\n"
    assert oct((tmp_path / "1.out").stat().st_mode & 0o777) == "0o600"


def test_bytes_survive_from_spec_to_job_and_back(tmp_path: Path) -> None:
    """Values that are not UTF-8 (surrogate-escaped by Python) reach the job as the original
    bytes, and a reason that quotes such a path comes back as valid text."""
    state = tmp_path / "state"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "UNI": "h\u00e9llo \u2713"}
    env["RAW"] = "\udcff"  # the byte 0xff, as os.environ would hold it

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            body = 'printf "%s|%s|%s" "$UNI" "$RAW" "$1" > env.out\n'
            await hub.launch(make_spec(tmp_path, 1, body, env=env, args=("\udcfe",)))
            await hub.launch(make_spec(tmp_path, 2, "exit 0\n", cwd="/nonexistent/\udcff"))
            assert (await reports.wait(1, "ended")).end_state == "completed"
            bad = await reports.wait(2, "ended")
            assert bad.reason == (
                "launch failed: cannot chdir to /nonexistent/\ufffd: No such file or directory"
            )

    with cleanup(state):
        asyncio.run(scenario())
    assert (tmp_path / "env.out").read_bytes() == "h\u00e9llo \u2713|".encode() + b"\xff|\xfe"


def test_unusable_spec_ends_the_job_failed(tmp_path: Path) -> None:
    """A spec the supervisor cannot carry out starts nothing and still reports an end."""
    state = tmp_path / "state"

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(make_spec(tmp_path, 1, "touch ran\n", args=("a\0b",)))
            # a user id out of range is refused, never cast (nor run as the supervisor's user)
            await hub.launch(make_spec(tmp_path, 2, "touch ran\n", uid=float(2**40)))
            end = await reports.wait(1, "ended")
            assert (end.end_state, end.exit_code) == ("failed", None)
            assert end.reason == "supervisor error: spec.json: field args is missing or unusable"
            end = await reports.wait(2, "ended")
            assert (end.end_state, end.exit_code) == ("failed", None)
            assert end.reason == "supervisor error: spec.json: field uid is missing or unusable"
            # a number that is there but out of range (or of another type) refuses the spec:
            # never a silent "no limit", never a cast of it; a uid that is not a number never
            # means "run as the supervisor's user"
            for job_id, (name, value) in enumerate(BAD_FIELDS, 3):
                await hub.launch(make_spec(tmp_path, job_id, "touch ran\n", **{name: value}))
            for job_id, (name, _) in enumerate(BAD_FIELDS, 3):
                end = await reports.wait(job_id, "ended")
                assert (end.end_state, end.exit_code) == ("failed", None)
                assert f"field {name}" in end.reason and "unusable" in end.reason, end.reason

    with cleanup(state):
        asyncio.run(scenario())
    assert not (tmp_path / "ran").exists()


BAD_FIELDS = [
    ("time_limit", 1e300),
    ("time_limit", -1.0),
    ("time_limit", "60"),
    ("mem_limit", 2.5),
    ("mem_limit", float(2**70)),
    ("kill_grace", -1.0),
    ("warning_seconds", 1e13),
    ("uid", "0"),
    ("gid", -1),
    ("cgroup_key", "../escape"),
    ("cgroup_key", ".."),
]


@pytest.mark.parametrize("with_cgroup", [False, True], ids=["plain", "cgroup"])
def test_launch_failure(tmp_path: Path, with_cgroup: bool) -> None:
    if with_cgroup and not cgroup_usable():
        skip_or_fail("needs root and a memory cgroup")
    state = tmp_path / "state"
    extra = {"mem_limit": 1 << 30, "mem_enforcement": "cgroup"} if with_cgroup else {}
    extra["cgroup_parent"] = f"gpuq-test-{os.getpid()}"

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(make_spec(tmp_path, 1, "exit 0\n", cwd="/nonexistent/x", **extra))
            no_out = make_spec(tmp_path, 2, "", stdout_path="/nonexistent/o", **extra)
            await hub.launch(no_out)
            bad_cwd, bad_out = [await reports.wait(j, "ended") for j in (1, 2)]
            assert bad_cwd.end_state == "failed" and bad_cwd.exit_code is None
            assert bad_cwd.reason == (
                "launch failed: cannot chdir to /nonexistent/x: No such file or directory"
            )
            assert bad_out.reason == (
                "launch failed: cannot open /nonexistent/o: No such file or directory"
            )

    with cleanup(state):
        asyncio.run(scenario())


TREE = """trap '' TERM
echo $$ > main.pid
sleep 1000 & echo $! > child.pid
setsid sh -c 'sleep 1000 & echo $! > daemon.pid'
"""


def tree_pids(work: Path) -> list[int]:
    return [read_pid(work / name) for name in ("main.pid", "child.pid", "daemon.pid")]


def test_stop_kills_trapping_tree_after_grace(tmp_path: Path) -> None:
    state = tmp_path / "state"
    grace = 1.0

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(make_spec(tmp_path, 1, TREE + "wait\n"))
            await reports.wait(1, "running")
            pids = await asyncio.to_thread(tree_pids, tmp_path)
            assert all(alive(pid) for pid in pids)
            stopped_at = time.time()
            assert await hub.stop(1, "cancelled", "cancelled by alice", 0, grace)
            end = await reports.wait(1, "ended")
            assert end.end_state == "cancelled" and end.signal == signal.SIGKILL
            assert end.reason.startswith("cancelled by alice")
            # SIGTERM was ignored: SIGKILL after the grace, not before and not much after (a
            # grace four times too long fails; the rest is room for a loaded machine)
            assert grace - 0.05 <= end.at - stopped_at < 3.5 * grace
            assert [pid for pid in pids if alive(pid)] == []

    with cleanup(state, *(tmp_path / n for n in ("main.pid", "child.pid", "daemon.pid"))):
        asyncio.run(scenario())


def test_leftovers_killed_after_normal_end(tmp_path: Path) -> None:
    state = tmp_path / "state"

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            script = TREE + "while [ ! -s daemon.pid ]; do sleep 0.01; done\nexit 0\n"
            await hub.launch(make_spec(tmp_path, 1, script))
            end = await reports.wait(1, "ended")
            assert end.end_state == "completed" and end.exit_code == 0
            assert end.leftovers_killed == 2
            assert end.reason == "2 leftover processes killed"
            pids = tree_pids(tmp_path)
            assert [pid for pid in pids if alive(pid)] == []

    with cleanup(state, tmp_path / "child.pid", tmp_path / "daemon.pid"):
        asyncio.run(scenario())


def test_signal_and_stop_before_connect(tmp_path: Path) -> None:
    state = tmp_path / "state"
    script = "trap 'exit 5' USR1\necho $$ > main.pid\nwhile :; do sleep 0.05; done\n"

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(make_spec(tmp_path, 1, script))
            await asyncio.to_thread(read_pid, tmp_path / "main.pid")
            assert await hub.signal(1, signal.SIGUSR1)
            end = await reports.wait(1, "ended")
            assert (end.end_state, end.exit_code) == ("failed", 5)
            # a stop sent right after launch, most likely before the supervisor's hello
            task = asyncio.ensure_future(hub.launch(make_spec(tmp_path, 2, "sleep 1000\n")))
            await asyncio.sleep(0)
            assert await hub.stop(2, "preempted", "preempted by job 9", signal.SIGTERM, 5.0)
            await task
            end = await reports.wait(2, "ended")
            assert (end.end_state, end.reason) == ("preempted", "preempted by job 9")
            assert not await hub.stop(77, "cancelled", "", 0, 1.0)

    with cleanup(state, tmp_path / "main.pid"):
        asyncio.run(scenario())


def test_time_limit(tmp_path: Path) -> None:
    """The warning signal once before the limit, SIGTERM at it (ignored here), SIGKILL after
    the grace period: 2 s after the start, where a limit or a grace four times too long (or
    short) is out of bounds."""
    state = tmp_path / "state"
    script = "trap 'echo warned >> warn.log' USR1\ntrap '' TERM\nwhile :; do sleep 0.05; done\n"
    spec = make_spec(
        tmp_path,
        1,
        script,
        time_limit=1.0,
        warning_seconds=0.5,
        kill_grace=1.0,
        warning_signal=signal.SIGUSR1,
    )

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            running = await reports.wait(1, "running")
            end = await reports.wait(1, "ended")
            assert (end.end_state, end.reason) == ("timeout", "time limit 00:00:01 reached")
            assert end.signal == signal.SIGKILL  # it ignored SIGTERM
            assert 1.95 <= end.at - running.at < 3.9
            assert (tmp_path / "warn.log").read_text() == "warned\n"

    with cleanup(state):
        asyncio.run(scenario())


HOG = '"$PY" -c "import time; x = bytes(8) * (200 << 17); time.sleep(30)"\n'


def test_memory_limit_cgroup(tmp_path: Path) -> None:
    if not cgroup_usable():
        skip_or_fail("needs root and a memory cgroup")
    state = tmp_path / "state"
    parent = f"gpuq-test-{os.getpid()}"
    script = "cat /proc/self/cgroup > cgroup.txt\n" + HOG
    spec = make_spec(tmp_path, 1, script, mem_limit=64 << 20, cgroup_parent=parent)

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            end = await reports.wait(1, "ended", timeout=20)
            assert (end.end_state, end.reason) == ("out_of_memory", "exceeded --mem 64M")
            assert 32 << 20 < end.peak_mem <= 64 << 20

    with cleanup(state):
        asyncio.run(scenario())
    assert f"{parent}/job_1" in (tmp_path / "cgroup.txt").read_text()
    hierarchy = memory_hierarchy()
    assert hierarchy is not None
    group_parent = hierarchy[0] / parent
    assert not (group_parent / "job_1").exists()
    remove_cgroup_parent(parent)  # other tests of this session may have used it too


def test_memory_limit_poll(tmp_path: Path) -> None:
    state = tmp_path / "state"
    spec = make_spec(tmp_path, 1, HOG, mem_limit=64 << 20, mem_enforcement="poll")

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            end = await reports.wait(1, "ended", timeout=20)
            assert (end.end_state, end.reason) == ("out_of_memory", "exceeded --mem 64M")
            assert end.signal == signal.SIGKILL and end.peak_mem > 64 << 20

    with cleanup(state):
        asyncio.run(scenario())


def test_runs_as_another_user(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        skip_or_fail("needs root")
    state = tmp_path / "state"
    shared = Path(tempfile.mkdtemp(prefix="gpuq-user-"))  # tmp_path's parents are root-only
    shared.chmod(0o777)
    spec = make_spec(
        shared, 1, "id -u; id -g\n", uid=65534, gid=65534, env={"PATH": "/usr/bin:/bin"}
    )

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            assert (await reports.wait(1, "ended")).end_state == "completed"

    try:
        with cleanup(state):
            asyncio.run(scenario())
        output = shared / "1.out"
        assert output.read_text() == "65534\n65534\n" and output.stat().st_uid == 65534
    finally:
        shutil.rmtree(shared)


def test_a_uid_without_gid_runs_with_the_users_primary_group(tmp_path: Path) -> None:
    """Never root's group 0: the passwd entry's group; a uid without an entry never runs (even
    with a gid given), nor a gid that is not one of the user's groups, nor a name that is not
    the uid's."""
    if os.geteuid() != 0:
        skip_or_fail("needs root")
    nobody = pwd.getpwnam("nobody")
    unknown = next(uid for uid in range(61000, 65000) if not _has_passwd_entry(uid))
    state = tmp_path / "state"
    shared = Path(tempfile.mkdtemp(prefix="gpuq-user-"))
    shared.chmod(0o777)
    env = {"PATH": "/usr/bin:/bin"}
    spec = make_spec(shared, 1, "id -u; id -g; id -G\n", uid=nobody.pw_uid, env=env)
    refused = {
        2: (
            make_spec(shared, 2, "touch ran\n", uid=unknown, gid=unknown, env=env),
            "no passwd entry",
        ),
        3: (
            make_spec(shared, 3, "touch ran\n", uid=nobody.pw_uid, gid=0, env=env),
            "gid 0 is not a group of user nobody",
        ),
        4: (
            make_spec(shared, 4, "touch ran\n", uid=nobody.pw_uid, user="root", env=env),
            f"user root is uid 0 here, not {nobody.pw_uid}",
        ),
    }

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            for job_spec, _ in refused.values():
                await hub.launch(job_spec)
            assert (await reports.wait(1, "ended")).end_state == "completed"
            for job_id, (_, reason) in refused.items():
                end = await reports.wait(job_id, "ended")
                assert end.end_state == "failed" and reason in end.reason, end.reason
        assert not (shared / "ran").exists()

    try:
        with cleanup(state):
            asyncio.run(scenario())
        uid, gid, groups = (shared / "1.out").read_text().splitlines()
        assert (int(uid), int(gid)) == (nobody.pw_uid, nobody.pw_gid)
        assert "0" not in groups.split()
    finally:
        shutil.rmtree(shared)


def _has_passwd_entry(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def test_fork_server_runs_the_c_loop_without_grpc() -> None:
    """It forks every supervisor, so it must stay free of gRPC's threads (DESIGN.md), and it
    answers a malformed request with an error in its place."""
    server = ForkServer.start(ack_wait=1.0)
    try:
        server.sock.sendall(b"not json\n")
        server.sock.settimeout(10)
        assert json.loads(server.sock.recv(4096)) == {"job_dir": None, "error": "malformed request"}
        maps = Path(f"/proc/{server.process.pid}/maps").read_text()
        assert "_supervise" in maps and "grpc" not in maps
    finally:
        server.close()
        server.process.wait(10)


def test_missing_compiled_part_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """An install without the C extension (no compiler, a source tree never built) fails at
    agent start, not at every job's launch."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gpuq.agent._supervise" else real(name, *a),
    )
    with pytest.raises(GpuqError, match=r"compiled part \(gpuq.agent._supervise\) is missing"):
        ForkServer.start()
