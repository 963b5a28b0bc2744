"""The CLI helper (gpuq.cli.fast) against a running cluster: a call through the helper says
and does what the same call does in-process (GPUQ_CLI_HELPER=off), as its caller (folder,
umask, environment, stdin, signals), and only for its own user.

Each test has a runtime folder of its own (XDG_RUNTIME_DIR), so it starts from no helper, and
stops what it started. `GPUQ_CLI_HELPER=debug` makes the stub say on stderr which path ran."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import unix_users
from cli_calls import call
from e2e_cluster import Cluster, pid_alive, wait_for
from unix_users import UnixUser, run_as

from gpuq.cli.fast.helper_control import stop_helpers

user_homes = unix_users.user_homes
unix_user = unix_users.unix_user
THROUGH = "gpuq: cli helper: child "
NONE_ANSWERED = "gpuq: cli helper: none answered"


def gpuq(
    cluster: Cluster,
    runtime: Path,
    *args: str,
    mode: str = "",
    cwd: Path | None = None,
    extra: dict[str, str] | None = None,
    stdin: str | None = None,
    stdout: int = subprocess.PIPE,
) -> subprocess.CompletedProcess[str]:
    return call(
        [sys.executable, "-m", "gpuq.cli.main"],
        cluster,
        runtime,
        *args,
        mode=mode,
        cwd=cwd,
        extra=extra,
        stdin=stdin,
        stdout=stdout,
    )


def sockets(runtime: Path) -> list[Path]:
    return sorted((runtime / "gpuq").glob("cli-*.sock")) if (runtime / "gpuq").exists() else []


def warm(cluster: Cluster, runtime: Path) -> None:
    """A helper is up: the first call starts one; wait until a call goes through it."""
    gpuq(cluster, runtime, "--version")
    wait_for(
        lambda: THROUGH in gpuq(cluster, runtime, "--version", mode="debug").stderr,
        timeout=60,
        what="a CLI helper to answer",
    )


def without_debug(stderr: str) -> str:
    return "".join(line for line in stderr.splitlines(True) if not line.startswith(THROUGH))


def test_first_call_starts_a_helper_and_the_next_goes_through_it(
    cluster: Cluster, runtime: Path
) -> None:
    first = gpuq(cluster, runtime, "queue", mode="debug")
    assert first.returncode == 0, first.stderr
    assert first.stderr.startswith(NONE_ANSWERED), first.stderr
    wait_for(lambda: sockets(runtime), timeout=60, what="the helper's socket")
    second = gpuq(cluster, runtime, "queue", mode="debug")
    assert second.returncode == 0 and second.stderr.startswith(THROUGH), second.stderr
    assert second.stdout == first.stdout
    assert (runtime / "gpuq").stat().st_mode & 0o777 == 0o700


def test_a_first_call_into_a_closed_pipe_starts_a_helper_too(
    cluster: Cluster, runtime: Path
) -> None:
    """`gpuq queue | head -1` as the first call: its output meets a closed pipe, which ends the
    command early; the next calls are still fast."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        first = gpuq(cluster, runtime, "queue", mode="debug", stdout=write_end)
    finally:
        os.close(write_end)
    assert first.stderr.startswith(NONE_ANSWERED), first.stderr
    wait_for(lambda: sockets(runtime), timeout=30, what="the helper's socket")
    second = gpuq(cluster, runtime, "queue", mode="debug")
    assert second.returncode == 0 and second.stderr.startswith(THROUGH), second.stderr


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def test_calls_back_to_back_each_find_a_spare_waiting(cluster: Cluster, runtime: Path) -> None:
    """The helper keeps two spares forked ahead, so that a call that follows another at once
    (a shell loop) finds one warm while the other warms up; every call goes through it, each
    in a child of its own (for a call after which a child may serve again, see
    test_cli_serve_again_e2e)."""
    warm(cluster, runtime)
    (lock,) = (runtime / "gpuq").glob("cli-*.lock")
    helper_pid = int(lock.read_text())
    wait_for(lambda: len(children(helper_pid)) == 2, what="two spares waiting")
    calls = [gpuq(cluster, runtime, "--version", mode="debug") for _ in range(6)]
    assert [c.returncode for c in calls] == [0] * 6, [c.stderr for c in calls]
    ran_in = [int(c.stderr.split(THROUGH, 1)[1].split()[0]) for c in calls if THROUGH in c.stderr]
    assert len(set(ran_in)) == 6, [c.stderr for c in calls]
    wait_for(lambda: len(children(helper_pid)) == 2, what="two spares again")


@pytest.mark.parametrize(
    "args",
    [
        ["queue"],
        ["status", "--json"],
        ["show", "424242"],
        ["submit", "--gpuz", "2", "--wrap", "true"],
        ["submit", "--gpus", "5", "--wrap", "true"],
        ["nosuch"],
        ["--version"],
        [],
    ],
)
def test_same_output_and_exit_code_as_in_process(
    cluster: Cluster, runtime: Path, args: list[str]
) -> None:
    warm(cluster, runtime)
    slow = gpuq(cluster, runtime, *args, mode="off")
    fast = gpuq(cluster, runtime, *args, mode="debug")
    assert THROUGH in fast.stderr
    assert (fast.returncode, fast.stdout, without_debug(fast.stderr)) == (
        slow.returncode,
        slow.stdout,
        slow.stderr,
    )


def test_no_coordinator_is_exit_3_the_same_way(bare_cluster: Cluster, runtime: Path) -> None:
    gpuq(bare_cluster, runtime, "--version")
    wait_for(lambda: sockets(runtime), timeout=60, what="the helper's socket")
    slow = gpuq(bare_cluster, runtime, "status", mode="off")
    fast = gpuq(bare_cluster, runtime, "status", mode="debug")
    assert slow.returncode == 3 and "gpuq serve" in slow.stderr
    assert THROUGH in fast.stderr
    assert (fast.returncode, fast.stdout, without_debug(fast.stderr)) == (3, "", slow.stderr)


def test_caller_folder_umask_and_stdin(cluster: Cluster, runtime: Path) -> None:
    warm(cluster, runtime)
    work = cluster.root / "work"
    work.mkdir()
    (work / "job.sh").write_text("#!/bin/sh\necho from-a-relative-script\n")
    result = gpuq(
        cluster, runtime, "submit", "--parsable", "--wait", "job.sh", mode="debug", cwd=work
    )
    assert result.returncode == 0 and THROUGH in result.stderr, result.stderr
    job_id = int(result.stdout.split(";")[0])
    assert (work / f"gpuq-{job_id}.out").read_text() == "from-a-relative-script\n"
    # the umask: the caller's, recorded with the job
    env = {**cluster.env, "XDG_RUNTIME_DIR": str(runtime), "GPUQ_CLI_HELPER": "debug"}
    masked = subprocess.run(
        [
            "sh",
            "-c",
            'umask 027; exec "$0" -m gpuq.cli.main submit --parsable --hold --wrap true',
            sys.executable,
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert masked.returncode == 0 and THROUGH in masked.stderr, masked.stderr
    assert cluster.job(int(masked.stdout.split(";")[0])).spec.umask == 0o027
    # stdin: the caller's pipe (a script read from /dev/stdin)
    piped = gpuq(
        cluster,
        runtime,
        "submit",
        "--parsable",
        "--wait",
        "/dev/stdin",
        mode="debug",
        cwd=work,
        stdin="#!/bin/sh\necho from-stdin\n",
    )
    assert piped.returncode == 0 and THROUGH in piped.stderr, piped.stderr
    piped_id = int(piped.stdout.split(";")[0])
    assert (work / f"gpuq-{piped_id}.out").read_text() == "from-stdin\n"


def test_environment_changes_between_calls_take_effect(
    cluster: Cluster, runtime: Path, tmp_path: Path
) -> None:
    warm(cluster, runtime)
    here = gpuq(cluster, runtime, "queue", mode="debug")
    assert here.returncode == 0 and THROUGH in here.stderr
    elsewhere = tmp_path / "elsewhere"
    there = gpuq(cluster, runtime, "queue", mode="debug", extra={"GPUQ_HOME": str(elsewhere)})
    assert there.returncode == 3 and THROUGH in there.stderr
    assert f"unix:{elsewhere}/gpuq.sock" in there.stderr
    again = gpuq(cluster, runtime, "queue", mode="debug")
    assert again.returncode == 0 and again.stdout == here.stdout


def test_changed_code_makes_the_helper_refuse_and_leave(
    cluster: Cluster, runtime: Path, tmp_path: Path
) -> None:
    """A copy of the package (its own helper: the socket's key names the package's path)."""
    copy = tmp_path / "src"
    package = Path(stop_helpers.__code__.co_filename).parents[2]
    shutil.copytree(package, copy / "gpuq", ignore=shutil.ignore_patterns("__pycache__"))
    extra = {"PYTHONPATH": str(copy)}
    first = gpuq(cluster, runtime, "queue", mode="debug", extra=extra)
    assert first.returncode == 0, first.stderr
    wait_for(
        lambda: THROUGH in gpuq(cluster, runtime, "queue", mode="debug", extra=extra).stderr,
        timeout=60,
        what="the copy's helper",
    )
    (lock,) = (runtime / "gpuq").glob("cli-*.lock")
    helper_pid = int(lock.read_text())
    os.utime(copy / "gpuq" / "cli" / "render.py", ns=(1, 1))
    stale = gpuq(cluster, runtime, "queue", mode="debug", extra=extra)
    assert stale.returncode == 0, stale.stderr
    assert stale.stderr.startswith(NONE_ANSWERED), stale.stderr  # ran in-process instead
    assert stale.stdout == first.stdout
    wait_for(lambda: not pid_alive(helper_pid), what="the stale helper to leave")


def follow_logs(cluster: Cluster, runtime: Path, job_id: int) -> tuple[subprocess.Popen[str], int]:
    """`gpuq logs -f JOB` through the helper, once its first line ("first") is out; and the
    pid of the helper's child that runs it."""
    env = {**cluster.env, "XDG_RUNTIME_DIR": str(runtime), "GPUQ_CLI_HELPER": "debug"}
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuq.cli.main", "logs", "-f", str(job_id)],
        cwd=cluster.root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None and process.stdout is not None
    line = process.stderr.readline()
    assert line.startswith(THROUGH), line
    assert process.stdout.readline() == "first\n"
    return process, int(line.removeprefix(THROUGH))


def test_sigint_reaches_the_child_and_sigkill_of_the_stub_ends_it(
    cluster: Cluster, runtime: Path
) -> None:
    warm(cluster, runtime)
    job_id = cluster.submit("echo first; sleep 60")
    cluster.wait_state(job_id, "running")

    interrupted, child = follow_logs(cluster, runtime, job_id)
    interrupted.send_signal(signal.SIGINT)
    assert interrupted.wait(20) == 130
    assert interrupted.stderr is not None
    assert interrupted.stderr.read() == "\ngpuq: aborted\n"
    wait_for(lambda: not pid_alive(child), what="the interrupted child to end")
    killed, child = follow_logs(cluster, runtime, job_id)
    killed.kill()
    killed.wait(20)
    wait_for(lambda: not pid_alive(child), what="the child of a killed stub to end")


def test_a_command_outlives_a_killed_helper(cluster: Cluster, runtime: Path) -> None:
    """kill -9 of the helper must not take a running command (a `gpuq run` session, a
    `gpuq logs -f`) with it: the command goes on and its exit status still reaches the stub."""
    warm(cluster, runtime)
    job_id = cluster.submit("echo first; sleep 60")
    cluster.wait_state(job_id, "running")
    process, child = follow_logs(cluster, runtime, job_id)
    helper = _parent_of(child)
    os.kill(helper, signal.SIGKILL)
    wait_for(lambda: not pid_alive(helper), what="the helper to die")
    assert pid_alive(child)
    cluster.client().cancel(job_id)
    code = process.wait(30)
    # logs -f ends when the job does, with its ending's code, as without a helper (and as
    # submit --wait): a cancelled job killed by SIGTERM is 128 + 15
    job = cluster.wait_state(job_id, "cancelled")
    assert job.result is not None
    assert code == (128 + job.result.signal if job.result.signal else job.result.exit_code or 1)
    assert process.stderr is not None
    assert f"job {job_id} cancelled" in process.stderr.read()
    assert not pid_alive(child)


def _parent_of(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1])


def test_another_user_cannot_use_the_helper(cluster: Cluster, unix_user: UnixUser) -> None:
    """Even with the folder opened to them, another uid's connection is closed unanswered."""
    above = Path(tempfile.mkdtemp(prefix="gpuq-rt-"))  # pytest's folders are 0700 above
    above.chmod(0o711)
    runtime = above / "run"
    runtime.mkdir(mode=0o700)
    try:
        warm(cluster, runtime)
        (path,) = sockets(runtime)
        (lock,) = (runtime / "gpuq").glob("cli-*.lock")
        helper_pid = int(lock.read_text())
        folders = [runtime, runtime / "gpuq"]
        try:  # let the other user reach the socket: only the helper's own check stands
            for folder in folders:
                folder.chmod(0o755)
            path.chmod(0o777)
            probe = (
                "import socket, sys\n"
                "from gpuq.cli.fast import protocol\n"
                "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                "s.connect(sys.argv[1])\n"
                "s.settimeout(10)\n"
                "try:\n"
                "    protocol.send_request(s, ['submit', '--wrap', 'true'])\n"
                "    print(repr(s.recv(5)))\n"
                "except (BrokenPipeError, ConnectionResetError):\n"
                "    print(repr(b''))  # closed before it was all sent\n"
            )
            result = run_as(unix_user, ["-c", probe, str(path)], cwd=Path("/"))
        finally:
            for folder in folders:
                folder.chmod(0o700)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "b''"  # closed without a word
        assert pid_alive(helper_pid)
        assert THROUGH in gpuq(cluster, runtime, "queue", mode="debug").stderr
        assert cluster.client().list() == []  # nothing was submitted
    finally:
        stop_helpers(runtime / "gpuq")
        shutil.rmtree(above, ignore_errors=True)


def test_someone_elses_folder_is_refused_in_silence(cluster: Cluster, unix_user: UnixUser) -> None:
    """/tmp/gpuq-cli-UID made by another user first: the CLI runs in-process, says nothing of
    it, and neither uses nor changes the folder."""
    folder = Path(f"/tmp/gpuq-cli-{unix_user.uid}")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700)  # root's, not the user's
    try:
        home = unix_user.home / "gpuq-home"
        result = run_as(
            unix_user,
            ["-m", "gpuq.cli.main", "--home", str(home), "status"],
            env={"GPUQ_CLI_HELPER": "debug"},
        )
        assert result.returncode == 3, result.stderr
        assert result.stderr.count("\n") == 1 and "gpuq serve" in result.stderr
        assert list(folder.iterdir()) == []
        assert folder.stat().st_uid == 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_dead_helpers_socket_is_replaced(cluster: Cluster, runtime: Path) -> None:
    warm(cluster, runtime)
    (lock,) = (runtime / "gpuq").glob("cli-*.lock")
    helper_pid = int(lock.read_text())
    os.kill(helper_pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(helper_pid), what="the helper to die")
    (path,) = sockets(runtime)

    def refused() -> bool:  # once its spare died with it (PR_SET_PDEATHSIG)
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(path))
            except ConnectionRefusedError:
                return True
        return False

    wait_for(refused, what="the dead helper's socket to refuse")
    refused = gpuq(cluster, runtime, "queue", mode="debug")
    assert refused.returncode == 0 and refused.stderr.startswith(NONE_ANSWERED)
    wait_for(
        lambda: THROUGH in gpuq(cluster, runtime, "queue", mode="debug").stderr,
        timeout=60,
        what="a new helper",
    )


NEW_VERB = '''"""`gpuq hello NAME`: a verb as a newcomer writes it."""

import click


@click.command()
@click.argument("name")
def hello(name: str) -> None:
    """Say hello."""
    click.echo(f"hello {name}")
'''


def test_a_new_verb_is_one_line_in_verbs_and_goes_through_the_helper(
    runtime: Path, tmp_path: Path
) -> None:
    """A verb defined as any click command, in a module of its own, and named by one line in
    gpuq/cli/verbs.py, runs through the CLI helper as in-process: nothing in gpuq/cli/fast/
    learns of it. (A copy of the package with the verb added: its own helper.)"""
    copy = tmp_path / "src"
    package = Path(stop_helpers.__code__.co_filename).parents[2]
    shutil.copytree(package, copy / "gpuq", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "gpuq" / "cli" / "hello.py").write_text(NEW_VERB)
    verbs = copy / "gpuq" / "cli" / "verbs.py"
    table = verbs.read_text()
    assert "VERBS = {\n" in table
    verbs.write_text(table.replace("VERBS = {\n", 'VERBS = {\n    "hello": "gpuq.cli.hello",\n'))
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "PYTHONPATH": str(copy)}

    def hello(mode: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuq.cli.main", "hello", "you"],
            cwd=tmp_path,
            env={**env, "GPUQ_CLI_HELPER": mode},
            capture_output=True,
            text=True,
            timeout=30,
        )

    slow = hello("off")
    assert (slow.returncode, slow.stdout, slow.stderr) == (0, "hello you\n", "")
    first = hello("debug")
    assert first.stderr.startswith(NONE_ANSWERED) and first.stdout == "hello you\n"
    wait_for(lambda: THROUGH in hello("debug").stderr, timeout=60, what="the copy's helper")
    fast = hello("debug")
    assert THROUGH in fast.stderr, fast.stderr
    assert (fast.returncode, fast.stdout, without_debug(fast.stderr)) == (0, "hello you\n", "")
