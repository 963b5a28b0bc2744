"""Output with bounds, end to end (issue 23, deliverable 4): a real agent ends a job over its
max_output (the node's, or its QOS's), a job's output file deleted while it runs is written
in its events, `gpuq logs` says the file is gone and exits non-zero, and `gpuq logs -f` exits
with the job's end as `submit --wait` does."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for

# the node allows 1 MiB of output; QOS roomy allows 64 MiB
CONFIG = """
[agent]
max_output = "1M"

[qos.normal]
priority = 1000
default_time = 3600

[qos.roomy]
priority = 1000
default_time = 3600
max_output = "64M"
"""

# writes 4 MiB to stdout, 256 KiB every 0.05 s
WRITER = (
    "import sys, time\n"
    "for _ in range(16):\n"
    "    sys.stdout.write('x' * 262144); sys.stdout.flush(); time.sleep(0.05)\n"
)


@pytest.fixture
def bounded(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, CONFIG)
    try:
        running.start_coordinator()
        running.start_agent("a", "2xA100-80GB")
        yield running
    finally:
        running.close()


def test_a_job_over_max_output_ends_failed_with_the_reason(bounded: Cluster) -> None:
    cluster = bounded
    script = cluster.root / "writer.py"
    script.write_text(WRITER + "time.sleep(30)\n")
    job = cluster.submit(f"{sys.executable} {script}")
    ended = cluster.wait_state(job, "failed", "completed", timeout=30)
    assert ended.state.value == "failed", ended
    assert ended.result is not None
    assert ended.result.reason.startswith(f"output limit: gpuq-{job}.out is "), ended
    assert ended.result.reason.endswith("over [agent] max_output 1M"), ended
    # its QOS's max_output wins over the node's: 4 MiB is within 64 MiB
    roomy = cluster.submit(f"{sys.executable} {script.with_name('short.py')}", qos="roomy")
    script.with_name("short.py").write_text(WRITER)
    done = cluster.wait_state(roomy, "completed", "failed", timeout=30)
    assert done.state.value == "completed", done
    assert (cluster.root / f"gpuq-{roomy}.out").stat().st_size == 4 << 20


def _history(cluster: Cluster, job: int) -> str:
    return cluster.gpuq("show", str(job)).stdout


def test_a_deleted_output_file_is_in_the_events_and_logs_says_it_is_gone(
    bounded: Cluster,
) -> None:
    cluster = bounded
    gate = cluster.root / "gate"
    folder = cluster.root / "logs"
    folder.mkdir()
    command = f"echo started; while [ ! -e {gate} ]; do sleep 0.05; done; echo last"
    job = cluster.submit(command, output=str(folder / "%j.out"))
    cluster.wait_state(job, "running")
    out = folder / f"{job}.out"
    wait_for(lambda: out.exists() and out.read_text() == "started\n", what="its first line")
    out.unlink()
    note = f"output file {out} was removed while the job ran"
    wait_for(lambda: note in _history(cluster, job), what="the note in its events")
    result = cluster.gpuq("logs", str(job))
    assert result.returncode == 1, result
    assert f"job {job}'s output file {out} is gone" in result.stderr, result.stderr
    # its folder, while another job runs
    other = cluster.submit(command, output=str(folder / "%j.out"))
    cluster.wait_state(other, "running")
    wait_for(lambda: (folder / f"{other}.out").exists(), what="its output file")
    shutil.rmtree(folder)
    folder_note = f"output file {folder / f'{other}.out'} was removed while the job ran"
    wait_for(lambda: folder_note in _history(cluster, other), what="the folder's note")
    assert "(its folder is gone)" in _history(cluster, other)
    gate.touch()
    assert cluster.wait_state(job, "completed").state.value == "completed"
    assert _history(cluster, job).count(note) == 1  # noted once
    follow = cluster.gpuq("logs", "-f", str(job))  # ended completed, but its file is gone
    assert follow.returncode == 1 and "is gone" in follow.stderr, follow


def test_logs_follow_exits_with_the_jobs_end(bounded: Cluster) -> None:
    cluster = bounded
    failed = cluster.submit("echo bye; exit 3")
    result = cluster.gpuq("logs", "-f", str(failed))
    assert result.returncode == 3, result
    assert result.stdout == "bye\n"
    assert f"job {failed} failed: exit code 3" in result.stderr, result.stderr
    done = cluster.submit("echo fine")
    result = cluster.gpuq("logs", "-f", str(done))
    assert result.returncode == 0 and result.stdout == "fine\n", result
    killed = cluster.submit("kill -9 $$")
    result = cluster.gpuq("logs", "-f", str(killed))
    assert result.returncode == 128 + 9, result
