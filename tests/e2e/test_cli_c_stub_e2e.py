"""The installed `gpuq`, the C stub (gpuq/cli/fast/stub.c), against a running cluster and a
real CLI helper: the first call runs the Python stub beside it (which starts a helper and links
it), the next ones go through the helper without Python, with the caller's folder, umask,
stdin and signals, and say what the in-process path says. A stale helper, a verb that must own
its process and a folder that is not ours run the Python stub instead.

The C stub is built from this checkout with the Python stub beside it, as `pip install` lays
them out; that Python stub counts its runs, so each test knows which path ran."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import unix_users
from c_stub import build_c_stub, python_stub_runs
from cli_calls import call
from e2e_cluster import Cluster, pid_alive, wait_for
from unix_users import UnixUser

from gpuq.cli.fast.helper_control import stop_helpers

user_homes = unix_users.user_homes
unix_user = unix_users.unix_user
THROUGH = "gpuq: cli helper: child "
NONE_ANSWERED = "gpuq: cli helper: none answered"


@pytest.fixture
def c_gpuq(tmp_path: Path) -> Path:
    return build_c_stub(tmp_path / "bin", count=True)


def gpuq(
    c_gpuq: Path,
    cluster: Cluster,
    runtime: Path,
    *args: str,
    mode: str = "debug",
    cwd: Path | None = None,
    extra: dict[str, str] | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    return call(
        [str(c_gpuq)], cluster, runtime, *args, mode=mode, cwd=cwd, extra=extra, stdin=stdin
    )


def warm(c_gpuq: Path, cluster: Cluster, runtime: Path, **options: object) -> None:
    """A helper is up and the C stub reaches it without the Python stub."""
    gpuq(c_gpuq, cluster, runtime, "--version", **options)  # type: ignore[arg-type]

    def through() -> bool:
        runs = python_stub_runs(c_gpuq)
        result = gpuq(c_gpuq, cluster, runtime, "--version", **options)  # type: ignore[arg-type]
        return THROUGH in result.stderr and python_stub_runs(c_gpuq) == runs

    wait_for(through, timeout=60, what="the C stub to reach a CLI helper")


def without_debug(stderr: str) -> str:
    return "".join(line for line in stderr.splitlines(True) if not line.startswith(THROUGH))


def test_first_call_runs_the_python_stub_then_the_c_stub_goes_through(
    c_gpuq: Path, cluster: Cluster, runtime: Path
) -> None:
    first = gpuq(c_gpuq, cluster, runtime, "queue")
    assert first.returncode == 0, first.stderr
    assert first.stderr.startswith(NONE_ANSWERED), first.stderr
    assert python_stub_runs(c_gpuq) == 1
    warm(c_gpuq, cluster, runtime)
    runs = python_stub_runs(c_gpuq)
    cluster.submit("true")
    for args in (["queue"], ["status", "--json"], ["show", "424242"], ["nosuch"], []):
        slow = gpuq(c_gpuq, cluster, runtime, *args, mode="off")
        fast = gpuq(c_gpuq, cluster, runtime, *args)
        assert THROUGH in fast.stderr, (args, fast.stderr)
        assert (fast.returncode, fast.stdout, without_debug(fast.stderr)) == (
            slow.returncode,
            slow.stdout,
            slow.stderr,
        ), args
    assert python_stub_runs(c_gpuq) == runs + 5  # the `off` calls only


def test_caller_folder_umask_and_stdin(c_gpuq: Path, cluster: Cluster, runtime: Path) -> None:
    warm(c_gpuq, cluster, runtime)
    runs = python_stub_runs(c_gpuq)
    work = cluster.root / "work"
    work.mkdir()
    (work / "job.sh").write_text("#!/bin/sh\necho from-a-relative-script\n")
    result = gpuq(c_gpuq, cluster, runtime, "submit", "--parsable", "--wait", "job.sh", cwd=work)
    assert result.returncode == 0 and THROUGH in result.stderr, result.stderr
    job_id = int(result.stdout.split(";")[0])
    assert (work / f"gpuq-{job_id}.out").read_text() == "from-a-relative-script\n"
    env = {**cluster.env, "XDG_RUNTIME_DIR": str(runtime), "GPUQ_CLI_HELPER": "debug"}
    masked = subprocess.run(
        ["sh", "-c", 'umask 027; exec "$0" submit --parsable --hold --wrap true', str(c_gpuq)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert masked.returncode == 0 and THROUGH in masked.stderr, masked.stderr
    assert cluster.job(int(masked.stdout.split(";")[0])).spec.umask == 0o027
    piped = gpuq(
        c_gpuq,
        cluster,
        runtime,
        "submit",
        "--parsable",
        "--wait",
        "/dev/stdin",
        cwd=work,
        stdin="#!/bin/sh\necho from-stdin\n",
    )
    assert piped.returncode == 0 and THROUGH in piped.stderr, piped.stderr
    piped_id = int(piped.stdout.split(";")[0])
    assert (work / f"gpuq-{piped_id}.out").read_text() == "from-stdin\n"
    assert python_stub_runs(c_gpuq) == runs


def test_sigint_reaches_the_child(c_gpuq: Path, cluster: Cluster, runtime: Path) -> None:
    warm(c_gpuq, cluster, runtime)
    runs = python_stub_runs(c_gpuq)
    job_id = cluster.submit("echo first; sleep 60")
    cluster.wait_state(job_id, "running")
    env = {**cluster.env, "XDG_RUNTIME_DIR": str(runtime), "GPUQ_CLI_HELPER": "debug"}
    process = subprocess.Popen(
        [str(c_gpuq), "logs", "-f", str(job_id)],
        cwd=cluster.root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None and process.stdout is not None
    line = process.stderr.readline()
    assert line.startswith(THROUGH), line
    child = int(line.removeprefix(THROUGH))
    assert process.stdout.readline() == "first\n"
    process.send_signal(signal.SIGINT)
    assert process.wait(20) == 130
    assert process.stderr.read() == "\ngpuq: aborted\n"
    wait_for(lambda: not pid_alive(child), what="the interrupted child to end")
    assert python_stub_runs(c_gpuq) == runs


def test_a_stale_helper_runs_the_python_stub(
    c_gpuq: Path, cluster: Cluster, runtime: Path, tmp_path: Path
) -> None:
    """A copy of the package (PYTHONPATH: its own helper, and its own link), changed."""
    copy = tmp_path / "src"
    package = Path(stop_helpers.__code__.co_filename).parents[2]
    shutil.copytree(package, copy / "gpuq", ignore=shutil.ignore_patterns("__pycache__"))
    extra = {"PYTHONPATH": str(copy)}
    first = gpuq(c_gpuq, cluster, runtime, "queue", extra=extra)
    assert first.returncode == 0, first.stderr
    warm(c_gpuq, cluster, runtime, extra=extra)
    (lock,) = (runtime / "gpuq").glob("cli-*.lock")
    helper_pid = int(lock.read_text())
    os.utime(copy / "gpuq" / "cli" / "render.py", ns=(1, 1))
    runs = python_stub_runs(c_gpuq)
    stale = gpuq(c_gpuq, cluster, runtime, "queue", extra=extra)
    assert stale.returncode == 0, stale.stderr
    assert stale.stderr.startswith(NONE_ANSWERED), stale.stderr  # ran in-process instead
    assert stale.stdout == first.stdout
    assert python_stub_runs(c_gpuq) == runs + 1
    wait_for(lambda: not pid_alive(helper_pid), what="the stale helper to leave")


def test_a_verb_that_owns_its_process_is_declined(
    c_gpuq: Path, cluster: Cluster, runtime: Path
) -> None:
    """The C stub cannot tell `serve` from `queue`: the spare declines it, and the Python
    stub runs it in its own process (gpuq.cli.verbs.OWN_PROCESS)."""
    warm(c_gpuq, cluster, runtime)
    runs = python_stub_runs(c_gpuq)
    args = ("--home", str(cluster.root), "serve", "--help")
    slow = gpuq(c_gpuq, cluster, runtime, *args, mode="off")
    declined = gpuq(c_gpuq, cluster, runtime, *args)
    assert slow.returncode == 0 and "Usage: gpuq serve" in slow.stdout
    assert (declined.returncode, declined.stdout, declined.stderr) == (0, slow.stdout, "")
    assert python_stub_runs(c_gpuq) == runs + 2
    assert THROUGH in gpuq(c_gpuq, cluster, runtime, "--version").stderr  # the helper stays


def test_another_users_folder_is_refused(
    c_gpuq: Path, cluster: Cluster, runtime: Path, unix_user: UnixUser
) -> None:
    """The helper's folder handed to another user (a live helper's socket and the C stub's
    link inside): the C stub does not connect, and the Python stub runs the call in-process."""
    warm(c_gpuq, cluster, runtime)
    folder = runtime / "gpuq"
    (lock,) = folder.glob("cli-*.lock")
    helper_pid = int(lock.read_text())
    runs = python_stub_runs(c_gpuq)
    os.chown(folder, unix_user.uid, unix_user.gid)
    try:
        refused = gpuq(c_gpuq, cluster, runtime, "queue")
    finally:
        os.chown(folder, os.getuid(), os.getgid())
    assert refused.returncode == 0, refused.stderr
    assert THROUGH not in refused.stderr and NONE_ANSWERED not in refused.stderr
    assert python_stub_runs(c_gpuq) == runs + 1
    assert pid_alive(helper_pid)
    assert THROUGH in gpuq(c_gpuq, cluster, runtime, "queue").stderr
