"""`--signal SIG@S` with a time limit, and the submitter's umask, with real processes.

SLURM's order at a time limit: SIG S seconds before it, SIGTERM at it, SIGKILL after the kill
grace. Output files are created 0666 less the submitter's umask, and the job runs with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import stat
import time
from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for
from supervisor_helpers import cleanup, make_spec, running_hub, wait_until

from gpuq.agent.jobs.launch_spec import LaunchOrder, NodePolicy, build_launch
from gpuq.domain.states import JobState
from gpuq.submission import build_spec

pytestmark = pytest.mark.timeout(60)

# logs each signal with a wall-clock time; the TERM handler ends the job
TRAPS = """echo "start $(date +%s.%N)" >> sig.log
trap 'echo "USR1 $(date +%s.%N)" >> sig.log' USR1
trap 'echo "TERM $(date +%s.%N)" >> sig.log; exit 0' TERM
while :; do sleep 0.05; done
"""


def signal_log(work: Path) -> list[tuple[str, float]]:
    """(what, seconds since the script started) for each line of sig.log."""
    lines = [line.split() for line in (work / "sig.log").read_text().splitlines()]
    start = float(lines[0][1])
    return [(what, float(at) - start) for what, at in lines[1:]]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def inherited_umask() -> int:
    """This process's umask, read without changing it (os.umask would, for all threads)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise AssertionError("no Umask in /proc/self/status")


def test_warning_before_the_limit_then_term_at_it(tmp_path: Path) -> None:
    """USR1 1.5 s before a 3 s limit, SIGTERM at the limit: the job's TERM handler runs, and
    the job ends as timeout even though it exited 0 from that handler."""
    state = tmp_path / "state"
    spec = make_spec(
        tmp_path,
        1,
        TRAPS,
        time_limit=3.0,
        warning_signal=signal.SIGUSR1,
        warning_seconds=1.5,
        kill_grace=5.0,
    )

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            end = await reports.wait(1, "ended", timeout=15)
            assert (end.end_state, end.reason) == ("timeout", "time limit 00:00:03 reached")
            assert (end.exit_code, end.signal) == (0, None)  # its TERM handler ended it

    with cleanup(state):
        asyncio.run(scenario())
    log = signal_log(tmp_path)
    assert [what for what, _ in log] == ["USR1", "TERM"], log
    (_, usr1), (_, term) = log
    assert 1.3 <= usr1 < 2.2, log  # limit - S, measured from the script's own start
    assert 2.8 <= term < 3.7, log  # the limit (the trap runs once `sleep 0.05` returns)
    assert 1.2 <= term - usr1 < 2.0, log


def test_warning_not_shorter_than_the_limit_goes_soon_after_start(tmp_path: Path) -> None:
    """S >= the limit: the warning goes as soon as possible (1 s after start, once the job has
    had a moment to set its traps), SIGTERM still at the limit."""
    state = tmp_path / "state"
    spec = make_spec(
        tmp_path,
        1,
        TRAPS,
        time_limit=2.0,
        warning_signal=signal.SIGUSR1,
        warning_seconds=10.0,
        kill_grace=5.0,
    )

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            end = await reports.wait(1, "ended", timeout=15)
            assert end.end_state == "timeout"

    with cleanup(state):
        asyncio.run(scenario())
    log = signal_log(tmp_path)
    assert [what for what, _ in log] == ["USR1", "TERM"], log
    assert 0.8 <= log[0][1] < 1.7 and 1.8 <= log[1][1] < 2.7, log


def test_out_of_range_numbers_fall_back_to_defaults(tmp_path: Path) -> None:
    """Numbers the supervisor cannot use as they are (too big for an int, fractional) are
    treated as absent, never cast: the default warning signal (SIGTERM) goes, an unusable umask
    keeps the 0600 default, a stop with an unusable signal and grace sends SIGTERM and the spec's
    grace, and an unusable signal command is ignored."""
    state = tmp_path / "state"
    script = """trap 'echo USR1 >> cmd.log' USR1
trap 'echo USR2 >> cmd.log' USR2
trap 'echo TERM >> cmd.log' TERM
echo $$ > main.pid
while :; do sleep 0.05; done
"""
    warned = make_spec(
        tmp_path,
        1,
        "echo $$ > warned.pid\nwhile :; do sleep 0.05; done\n",
        time_limit=30.0,
        warning_seconds=29.5,
        warning_signal=float(2**40),
        umask=1e300,
    )
    stopped = make_spec(tmp_path, 2, script, kill_grace=0.3, umask=0.5)

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(warned)
            await hub.launch(stopped)
            end = await reports.wait(1, "ended", timeout=15)
            # SIGTERM 0.5 s after start instead of a signal number cast from 2**40
            assert (end.end_state, end.signal) == ("failed", signal.SIGTERM)
            assert end.reason == "killed by signal SIGTERM"
            await reports.wait(2, "running")
            await asyncio.to_thread(wait_until, (tmp_path / "main.pid").exists, 10, "main.pid")
            assert await hub.signal(2, 2**32 + signal.SIGUSR1)  # ignored
            assert await hub.signal(2, signal.SIGUSR2)
            log = tmp_path / "cmd.log"
            await asyncio.to_thread(
                wait_until, lambda: log.exists() and "USR2" in log.read_text(), 10, "USR2"
            )
            stopped_at = time.time()
            assert await hub.stop(2, "cancelled", "", 2**40, 1e300)
            end = await reports.wait(2, "ended", timeout=15)
            assert (end.end_state, end.signal) == ("cancelled", signal.SIGKILL)
            assert 0.25 <= end.at - stopped_at < 5  # the spec's kill_grace (0.3 s)

    with cleanup(state, tmp_path / "warned.pid", tmp_path / "main.pid"):
        asyncio.run(scenario())
    assert (tmp_path / "cmd.log").read_text() == "USR2\nTERM\n"
    assert mode(tmp_path / "1.out") == 0o600 and mode(tmp_path / "2.out") == 0o600


UMASK_BODY = "umask > umask.$GPUQ_X\ntouch made.$GPUQ_X\necho err >&2\n"


@pytest.mark.parametrize(
    ("umask", "file_mode"), [(0o022, 0o644), (0o077, 0o600), (0o027, 0o640), (0, 0o666)]
)
def test_output_files_and_job_follow_the_umask(tmp_path: Path, umask: int, file_mode: int) -> None:
    state = tmp_path / "state"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GPUQ_X": "1"}
    spec = make_spec(tmp_path, 1, UMASK_BODY, env=env, umask=umask)
    err = str(tmp_path / "2.err")
    separate = make_spec(
        tmp_path, 2, UMASK_BODY, env=env | {"GPUQ_X": "2"}, umask=umask, stderr_path=err
    )

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(spec)
            await hub.launch(separate)
            for job_id in (1, 2):
                assert (await reports.wait(job_id, "ended")).end_state == "completed"

    with cleanup(state):
        asyncio.run(scenario())
    for name in ("1.out", "made.1", "2.out", "2.err", "made.2"):
        assert oct(mode(tmp_path / name)) == oct(file_mode), name
    assert (tmp_path / "umask.1").read_text().strip() == f"{umask:04o}"
    assert (tmp_path / "2.err").read_text() == "err\n"


def test_existing_output_keeps_its_mode_and_no_umask_keeps_the_old_ways(tmp_path: Path) -> None:
    """An output file that exists (appended after a requeue, or truncated) is never chmodded;
    without a umask in the spec, new output files are 0600 and the job inherits the umask."""
    state = tmp_path / "state"
    for name, file_mode in (("1.out", 0o640), ("2.out", 0o604)):
        (tmp_path / name).write_text("old\n")
        (tmp_path / name).chmod(file_mode)
    appended = make_spec(tmp_path, 1, "echo new\n", umask=0o077, open_mode="append")
    truncated = make_spec(tmp_path, 2, "echo new\n", umask=0o022)
    plain = make_spec(tmp_path, 3, "umask\n")

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            for spec in (appended, truncated, plain):
                await hub.launch(spec)
            for job_id in (1, 2, 3):
                assert (await reports.wait(job_id, "ended")).end_state == "completed"

    with cleanup(state):
        asyncio.run(scenario())
    assert (tmp_path / "1.out").read_text() == "old\nnew\n" and mode(tmp_path / "1.out") == 0o640
    assert (tmp_path / "2.out").read_text() == "new\n" and mode(tmp_path / "2.out") == 0o604
    assert mode(tmp_path / "3.out") == 0o600
    assert (tmp_path / "3.out").read_text().strip() == f"{inherited_umask():04o}"


def test_launch_spec_carries_umask_and_signal(tmp_path: Path) -> None:
    """The agent's pure step: the submitter's umask and --signal reach spec.json's fields."""
    spec = build_spec(wrap="true", signal="USR1@90", environ={}, chdir=str(tmp_path))
    order = LaunchOrder(1, dataclasses.replace(spec, umask=0o027), (), "alice", time_limit=600)
    launch = build_launch(order, NodePolicy("n1", {})).to_dict()
    assert (launch["umask"], launch["time_limit"]) == (0o027, 600.0)
    assert (launch["warning_signal"], launch["warning_seconds"]) == (signal.SIGUSR1, 90.0)
    unset = dataclasses.replace(spec, umask=None)
    assert build_launch(dataclasses.replace(order, spec=unset), NodePolicy("n1", {})).umask is None


def test_signal_and_umask_through_the_queue(bare_cluster: Cluster) -> None:
    """The whole path: a JobSpec with --signal USR1@1, --time 0:03 and umask 027 submitted to a
    coordinator, launched by an agent: USR1 before the limit, TERM at it, state timeout, and
    the output file and a file the job made are 0640."""
    cluster = bare_cluster
    cluster.start_coordinator()
    cluster.start_agent("a", "1xL4-24GB")
    body = "touch made; echo ready\n" + TRAPS
    spec = build_spec(
        wrap=body,
        time=3,  # seconds: an int is exact (text is whole minutes, as sbatch)
        signal="USR1@1",
        output="job-%j.out",
        environ=cluster.env,
        chdir=str(cluster.root),
    )
    job_id = cluster.client().submit_spec(dataclasses.replace(spec, umask=0o027))[0]
    job = cluster.wait_state(job_id, "timeout", timeout=30)
    assert job.state is JobState.TIMEOUT
    out = cluster.root / f"job-{job_id}.out"
    wait_for(lambda: out.exists() and "ready" in out.read_text(), what="the job's output")
    assert oct(mode(out)) == oct(0o640) and oct(mode(cluster.root / "made")) == oct(0o640)
    log = signal_log(cluster.root)
    assert [what for what, _ in log] == ["USR1", "TERM"], log
    assert 1.8 <= log[0][1] < 2.7 and 2.8 <= log[1][1] < 3.7, log
