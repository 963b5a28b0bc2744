"""What a SLURM user relies on, end to end: `40_3` meaning array 40 task 3 everywhere, compact
arrays across a restart, one bad stored job never stopping the queue, and listings that take
SLURM's state codes and refuse bad input with one line. (Submission order among equals and
dependencies on whole arrays and on single tasks: tests/store/test_queue_order_coordinator.py
and test_dependencies_coordinator.py, in process.)"""

from __future__ import annotations

import json
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for

import gpuq
from gpuq.domain.states import JobState


def test_array_task_ids_mean_the_task_everywhere(cluster: Cluster) -> None:
    array = cluster.submit("echo task $GPUQ_ARRAY_TASK_ID", array="0-11", output="t-%A_%a.out")
    cluster.client().wait(array, timeout=60)
    result = cluster.gpuq("logs", f"{array}_10")
    assert (result.returncode, result.stdout) == (0, "task 10\n"), result
    shown = cluster.gpuq("show", f"{array}_10")
    assert shown.returncode == 0, shown
    assert f"Job: {array}_10 (wrap)" in shown.stdout
    whole = cluster.gpuq("show", str(array), "--json")
    assert json.loads(whole.stdout)["array_states"] == {"completed": 12}
    for bad in (f"{array}_x", "1_2_3", "+5", "5 0", "99999999999999999999", "\u0665"):
        refused = cluster.gpuq("show", bad)
        assert refused.returncode == 2, refused
        assert "Traceback" not in refused.stderr and len(refused.stderr.splitlines()) == 1
    missing = cluster.gpuq("show", f"{array}_12")
    assert missing.returncode == 2 and f"no job {array}_12" in missing.stderr


def test_held_array_is_one_record_that_survives_a_restart(cluster: Cluster) -> None:
    array = cluster.submit("echo $GPUQ_ARRAY_TASK_ID", array="0-999%3", hold=True)
    queue = cluster.gpuq("queue")
    assert f"{array}_[0-999%3]" in queue.stdout, queue.stdout
    assert queue.stdout.count("\n") == 2  # the header and the array's one line
    cancelled = cluster.gpuq("cancel", f"{array}_5")
    assert cancelled.returncode == 0 and f"job {array}_5: cancelled" in cancelled.stdout
    assert f"{array}_[0-4,6-999%3]" in cluster.gpuq("queue").stdout
    cluster.kill(cluster.coordinator)
    cluster.start_coordinator()
    assert cluster.client().array_states(array) == {"held": 999, "cancelled": 1}
    cluster.client().release(array)
    wait_for(
        lambda: cluster.client().array_states(array).get("completed", 0) >= 6,
        timeout=60,
        what="tasks to run after the release",
    )
    cluster.client().cancel(array)
    states = wait_for(
        lambda: (s := cluster.client().array_states(array)).get("running", 0) == 0 and s,
        what="the array to end",
    )
    assert states.get("pending", 0) == states.get("held", 0) == 0
    assert sum(states.values()) == 1000


def test_a_stored_job_that_breaks_scheduling_is_set_aside(bare_cluster: Cluster) -> None:
    """A job stored before today's checks (a begin time in year 33658) cannot stop the
    queue: the pass holds it with the error as its reason and everyone else runs."""
    cluster = bare_cluster
    cluster.start_coordinator()
    bad = cluster.submit("true", hold=True)
    cluster.kill(cluster.coordinator)
    with sqlite3.connect(cluster.home / "gpuq.db") as db:
        [spec_text] = db.execute("SELECT spec FROM jobs WHERE id = ?", (bad,)).fetchone()
        spec = json.loads(spec_text)
        spec["begin_time"] = 1e15
        db.execute(
            "UPDATE jobs SET spec = ?, state = 'pending' WHERE id = ?", (json.dumps(spec), bad)
        )
    cluster.start_coordinator()
    cluster.start_agent("a", "2xA100-80GB")
    good = cluster.submit("true", gpus=1)
    assert cluster.wait_state(good, "completed").state is JobState.COMPLETED
    held = cluster.wait_state(bad, "held")
    assert "scheduling failed on this job" in held.reason
    for args in (["queue"], ["status"], ["show", str(bad)], ["history"]):
        result = cluster.gpuq(*args)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result


def test_listings_take_slurm_state_codes_and_refuse_bad_values(cluster: Cluster) -> None:
    gate = cluster.root / "gate"
    running = cluster.submit(f"while [ ! -e {gate} ]; do sleep 0.05; done")
    held = cluster.submit("true", hold=True)
    cluster.wait_state(running, "running")
    for codes, expected in (("R", {running}), ("PD,HD", {held}), ("r,held", {running, held})):
        result = cluster.gpuq("queue", "-s", codes, "--json")
        assert result.returncode == 0, result
        assert {j["id"] for j in json.loads(result.stdout)} == expected
    for args in (["queue", "-s", "XX"], ["history", "-n", "-1"], ["history", "-n", "0"]):
        result = cluster.gpuq(*args)
        assert result.returncode == 2, result
        assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
    client = cluster.client()
    with pytest.raises(gpuq.InvalidInput, match="at most 10000 in one request"):
        client.cancel(*range(1, 10_002))
    with pytest.raises(gpuq.InvalidInput, match="at most 10000 in one request"):
        client.list_raw(job_ids=range(1, 10_002))
    with pytest.raises(gpuq.InvalidInput, match="--reason"):
        client.cancel(held, reason="x" * 5000)
    assert cluster.job(held).state is JobState.HELD  # a refused request changes nothing
    gate.touch()
    cluster.wait_state(running, "completed")


def test_output_files_follow_the_submitters_umask(cluster: Cluster) -> None:
    """The umask of the shell that ran `gpuq submit` (read, never changed, at submit time)."""
    for umask, mode in (("027", 0o640), ("077", 0o600)):
        result = subprocess.run(
            [
                "sh",
                "-c",
                f'umask {umask}; exec "$0" -m gpuq.cli.main submit --parsable '
                f'--wrap "touch made-{umask}" -o out-{umask}.txt',
                sys.executable,
            ],
            cwd=cluster.root,
            env=cluster.env,
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result
        cluster.wait_state(int(result.stdout), "completed")
        for name in (f"out-{umask}.txt", f"made-{umask}"):
            assert stat.S_IMODE((cluster.root / name).stat().st_mode) == mode, name


def test_a_user_cannot_queue_more_tasks_than_the_limit(tmp_path: Path) -> None:
    """Arrays are cheap, not free: `max_queued_per_user` bounds what one person keeps in the
    coordinator's memory, counting every task of an array."""
    cluster = Cluster(tmp_path, "max_queued_per_user = 10\n")
    try:
        cluster.start_coordinator()
        first = cluster.gpuq("submit", "-H", "-a", "0-7", "--wrap", "true")
        assert first.returncode == 0, first
        refused = cluster.gpuq("submit", "-H", "-a", "0-2", "--wrap", "true")
        assert refused.returncode == 2, refused
        assert "at most 10 queued or running jobs and array tasks per user" in refused.stderr
        assert "has 8 and this adds 3" in refused.stderr
        assert cluster.gpuq("submit", "-H", "-a", "0-1", "--wrap", "true").returncode == 0
    finally:
        cluster.close()
