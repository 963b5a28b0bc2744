"""A CLI helper's child that serves another call after the one it ran (gpuq.cli.fast.serve_again,
for the verbs in gpuq.cli.verbs.PROCESS_REUSABLE): calls back to back go through children that
stay, and no call sees anything of the call before it (folder, umask, environment, ignored
signals, fds), nor gets a signal meant for it; an interrupted call's child leaves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from e2e_cluster import Cluster, pid_alive, wait_for
from test_cli_helper_e2e import THROUGH, children, gpuq, warm


def child_of(result: subprocess.CompletedProcess[str]) -> int:
    """The pid of the helper's child that ran the call."""
    assert result.returncode == 0 and THROUGH in result.stderr, result.stderr
    return int(result.stderr.split(THROUGH, 1)[1].split()[0])


def helper_pid(runtime: Path) -> int:
    (lock,) = (runtime / "gpuq").glob("cli-*.lock")
    return int(lock.read_text())


def job_id(result: subprocess.CompletedProcess[str]) -> int:
    return int(result.stdout.split(";")[0])


def test_calls_back_to_back_are_served_by_children_that_stay(
    cluster: Cluster, runtime: Path
) -> None:
    """A listing or a submission leaves nothing running: its child serves the next call too.
    `logs` is not such a verb (it may follow a job for hours): each call gets a child of its
    own, which ends with it."""
    warm(cluster, runtime)
    helper = helper_pid(runtime)
    wait_for(lambda: len(children(helper)) == 2, what="two spares waiting")
    served = [child_of(gpuq(cluster, runtime, "queue", mode="debug")) for _ in range(6)]
    served += [
        child_of(gpuq(cluster, runtime, "submit", "--hold", "--wrap", "true", mode="debug"))
        for _ in range(4)
    ]
    assert Counter(served).most_common(1)[0][1] >= 3, served
    # the children that served them wait for the next call (a one-shot child would be gone)
    assert set(served) & set(children(helper)), (served, children(helper))
    done = cluster.submit("echo done")
    cluster.wait_state(done, "completed")
    own = [child_of(gpuq(cluster, runtime, "logs", str(done), mode="debug")) for _ in range(3)]
    assert len(set(own)) == 3, own
    wait_for(lambda: not any(pid_alive(pid) for pid in own), what="the logs calls' children")
    wait_for(lambda: len(children(helper)) == 2, what="two spares again")


def submit_as(
    cluster: Cluster, runtime: Path, folder: Path, shell: str, extra: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """`gpuq submit --parsable --hold --wrap true` from `folder`, after the shell lines `shell`."""
    env = {**cluster.env, "XDG_RUNTIME_DIR": str(runtime), "GPUQ_CLI_HELPER": "debug", **extra}
    line = f'{shell}; exec "$0" -m gpuq.cli.main submit --parsable --hold --wrap true'
    return subprocess.run(
        ["sh", "-c", line, sys.executable],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def ignored_signals(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigIgn line")


def test_a_child_that_serves_again_keeps_nothing_of_the_call_before(
    cluster: Cluster, runtime: Path, tmp_path: Path
) -> None:
    warm(cluster, runtime)
    first_folder, second_folder = tmp_path / "first", tmp_path / "second"
    first_folder.mkdir()
    second_folder.mkdir()
    # a caller with a secret in its environment, umask 077 and SIGHUP ignored (nohup)
    first = submit_as(
        cluster, runtime, first_folder, "umask 077; trap '' HUP", {"FIRST_SECRET": "s3cret"}
    )
    pid = child_of(first)
    for _ in range(10):  # the next calls alternate between the two children that wait
        second = submit_as(cluster, runtime, second_folder, "umask 022", {})
        if child_of(second) == pid:
            break
    else:
        pytest.fail("no later call was served by the first call's child")
    one, two = cluster.job(job_id(first)).spec, cluster.job(job_id(second)).spec
    assert (one.workdir, one.umask, one.env.get("FIRST_SECRET")) == (
        str(first_folder),
        0o077,
        "s3cret",
    )
    assert (two.workdir, two.umask) == (str(second_folder), 0o022)
    assert "FIRST_SECRET" not in two.env
    # waiting for the next call, the child is the spare again: its folder, fds and signals
    assert Path(f"/proc/{pid}/cwd").resolve() == Path("/")
    assert {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (0, 1, 2)} == {os.devnull}
    assert not ignored_signals(pid) & (1 << (signal.SIGHUP - 1))


def submit_and_wait(
    cluster: Cluster, runtime: Path, command: str
) -> tuple[subprocess.Popen[str], int]:
    """`gpuq submit --wait --wrap COMMAND` through the helper, started; and the pid of the
    helper's child that runs it."""
    env = {**cluster.env, "XDG_RUNTIME_DIR": str(runtime), "GPUQ_CLI_HELPER": "debug"}
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuq.cli.main", "submit", "--wait", "--wrap", command],
        cwd=cluster.root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    line = process.stderr.readline()
    assert line.startswith(THROUGH), line
    return process, int(line.removeprefix(THROUGH))


def test_an_interrupted_call_is_not_served_again(cluster: Cluster, runtime: Path) -> None:
    """Ctrl-C during `submit --wait`: the call ends with 130, as in-process, and its child
    leaves instead of taking the next call."""
    warm(cluster, runtime)
    process, child = submit_and_wait(cluster, runtime, "sleep 60")
    wait_for(lambda: [j for j in cluster.client().list() if j.state == "running"], what="the job")
    process.send_signal(signal.SIGINT)
    assert process.wait(20) == 130
    wait_for(lambda: not pid_alive(child), what="the interrupted call's child to leave")
    assert child_of(gpuq(cluster, runtime, "queue", mode="debug")) != child


def test_calls_from_several_shells_at_once_each_get_their_own(
    cluster: Cluster, runtime: Path, tmp_path: Path
) -> None:
    """Three shells submitting at once: every call lands with its own caller's name, folder and
    environment, whichever child served it and whatever it served before."""
    warm(cluster, runtime)

    def shell(number: int) -> list[tuple[int, int, str, Path]]:
        folder = tmp_path / f"shell{number}"
        folder.mkdir()
        landed = []
        for i in range(8):
            name = f"s{number}-{i}"
            result = gpuq(
                cluster,
                runtime,
                *("submit", "--parsable", "--hold", "--name", name, "--wrap", "true"),
                mode="debug",
                cwd=folder,
                extra={"SHELL_NUMBER": str(number)},
            )
            landed.append((job_id(result), number, name, folder))
            assert THROUGH in result.stderr, result.stderr
        return landed

    with ThreadPoolExecutor(3) as pool:
        results = [row for rows in pool.map(shell, range(3)) for row in rows]
    assert len(results) == 24
    for job, number, name, folder in results:
        spec = cluster.job(job).spec
        assert (spec.name, spec.workdir, spec.env["SHELL_NUMBER"]) == (
            name,
            str(folder),
            str(number),
        )


def test_a_call_outlives_a_killed_helper_and_says_its_exit_code(
    cluster: Cluster, runtime: Path
) -> None:
    """kill -9 of the helper during `submit --wait` in a child that would serve again: the
    call goes on, its exit code still reaches the stub, and the child then leaves."""
    warm(cluster, runtime)
    process, child = submit_and_wait(cluster, runtime, "sleep 1; exit 7")
    helper = helper_pid(runtime)
    os.kill(helper, signal.SIGKILL)
    wait_for(lambda: not pid_alive(helper), what="the helper to die")
    assert process.wait(30) == 7
    assert "status is unknown" not in process.stderr.read()
    wait_for(lambda: not pid_alive(child), what="the child to leave")
