"""Helpers for the supervisor and hub tests: specs, a report collector, deadlines, cleanup.

Everything waits on a condition with a deadline; nothing sleeps and hopes.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from gpuq.agent.jobs import process_tree
from gpuq.agent.jobs.launch_spec import LaunchSpec
from gpuq.agent.jobs.supervisor_reports import SupervisorReport
from gpuq.agent.jobs.supervisors import Supervisors

PY = sys.executable
TEST_ACK_WAIT = 20.0  # supervisors of a failed test do not linger for 10 minutes
# the tests' jobs make their cgroups under this parent, removed when the tests end (in every
# hierarchy), so that a test run leaves no gpuq group behind on the machine
TEST_CGROUP_PARENT = f"gpuq-test-{os.getpid()}"


def cgroup_mounts() -> list[Path]:
    """Every cgroup hierarchy's mount point (v1 and v2)."""
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, fstype, *_ = line.split()
        if fstype in ("cgroup", "cgroup2"):
            mounts.append(Path(point))
    return mounts


def remove_cgroup_parent(parent: str = TEST_CGROUP_PARENT) -> None:
    """Remove a tests' cgroup parent (and any empty job group left below it) everywhere."""
    for mount in cgroup_mounts():
        folder = mount / parent
        if not folder.is_dir():
            continue
        # deepest first: <parent>/<installation key>/job_<id>
        for below, _, _ in sorted(os.walk(folder), key=lambda e: -len(e[0])):
            with contextlib.suppress(OSError):
                os.rmdir(below)


atexit.register(remove_cgroup_parent)


def make_spec(work: Path, job_id: int, script: str, **fields: Any) -> LaunchSpec:
    """A spec that runs `script` (a #!/bin/sh body) in `work`, output to `work/<id>.out`."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PY": PY, "HOME": str(work)}
    values: dict[str, Any] = {
        "job_id": job_id,
        "script": "#!/bin/sh\n" + script,
        "args": (),
        "env": env,
        "cwd": str(work),
        "stdout_path": str(work / f"{job_id}.out"),
        "stderr_path": str(work / f"{job_id}.out"),
        "cgroup_parent": TEST_CGROUP_PARENT,
    }
    values.update(fields)
    return LaunchSpec(**values)


class Reports:
    """Collects hub reports and lets a test wait for one with a deadline."""

    def __init__(self) -> None:
        self.items: list[SupervisorReport] = []
        self.changed = asyncio.Event()

    def __call__(self, report: SupervisorReport) -> None:
        self.items.append(report)
        self.changed.set()

    def of(self, job_id: int) -> list[SupervisorReport]:
        return [r for r in self.items if r.job_id == job_id]

    async def wait(self, job_id: int, kind: str, timeout: float = 10.0) -> SupervisorReport:
        deadline = time.monotonic() + timeout
        while True:
            for report in self.of(job_id):
                if report.kind == kind:
                    return report
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {kind} report for job {job_id}: {self.items}")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)


@contextlib.asynccontextmanager
async def running_hub(state: Path, **options: Any) -> AsyncIterator[tuple[Supervisors, Reports]]:
    reports = Reports()
    options.setdefault("ack_wait", TEST_ACK_WAIT)
    hub = Supervisors(state, reports, **options)
    await hub.start()
    try:
        yield hub, reports
    finally:
        await hub.close()


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)


async def await_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.01)


def alive(pid: int) -> bool:
    """os.kill(pid, 0) succeeds and the process is not a zombie (whose parent may be an init
    that does not reap, in a container)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = process_tree.read_proc(f"/proc/{pid}/stat")
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"")


def spare_supervisors(fork_server: int) -> list[int]:
    """The fork server's children that wait for a job (forked ahead, named "gpuq spare")."""
    children = Path(f"/proc/{fork_server}/task/{fork_server}/children").read_text().split()
    spares = []
    for child in children:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{child}/comm").read_text() == "gpuq spare\n":
                spares.append(int(child))
    return spares


def read_pid(path: Path, timeout: float = 10.0) -> int:
    wait_until(lambda: path.exists() and path.read_text().strip() != "", timeout, str(path))
    return int(path.read_text().split()[0])


def kill_supervisors(state: Path) -> None:
    """SIGKILL every supervisor and job process group a test left behind."""
    for pid_file in state.glob("jobs/*/supervisor.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text().split()[0])
            for child in process_tree.descendants(pid):  # the job first: it must not outlive it
                with contextlib.suppress(OSError):
                    os.kill(child, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def cleanup(state: Path, *pid_files: Path) -> Iterator[None]:
    """On the way out, kill what a failing test may have left running."""
    try:
        yield
    finally:
        for pid_file in pid_files:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        kill_supervisors(state)


@contextlib.asynccontextmanager
async def traced(hub: Supervisors, out: Path) -> AsyncIterator[None]:
    """strace on the hub's fork server and what it forks from now on (supervisors, jobs): their
    clone3 calls and writes, each fd named by its path (-y), into `out`."""
    if shutil.which("strace") is None:
        from helpers import skip_or_fail  # tests/: the benchmarks import this module without it

        skip_or_fail("strace is not installed")
    assert hub.forks.fork_server is not None
    pid = hub.forks.fork_server.process.pid
    trace = "trace=clone3,write"
    # a supervisor forked ahead of its job (a spare) was forked before strace came: gone, a
    # launch either forks one or takes the spare the server forks next, both under the trace
    # (the spare is killed only once strace follows the server's forks)
    spares_before = spare_supervisors(pid)
    tracer = await asyncio.create_subprocess_exec(
        *("strace", "-f", "-y", "-e", trace, "-e", "signal=none", "-o", str(out), "-p", str(pid)),
        stderr=asyncio.subprocess.PIPE,
    )
    assert tracer.stderr is not None
    try:
        attached = await asyncio.wait_for(tracer.stderr.readline(), 10)
        assert b"attached" in attached, attached
        for spare in spares_before:
            with contextlib.suppress(ProcessLookupError):
                os.kill(spare, signal.SIGKILL)
        await await_until(lambda: not any(map(alive, spares_before)), what="old spares gone")
        yield
    finally:
        tracer.terminate()
        await tracer.wait()
