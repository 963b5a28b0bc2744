"""What a SLURM user relies on, at the command line against real processes: `40_3` meaning
array 40 task 3 everywhere, a held array listed as one line, SLURM's state codes, bad input
refused with one line, a job the scheduler had to set aside still listed, output files that
follow the submitter's umask. What the coordinator does with these (order among equals,
dependencies, arrays across a restart, setting a bad job aside, limits) is tested in process:
tests/store/test_queue_order_coordinator.py, test_dependencies_coordinator.py,
test_queue_semantics_coordinator.py and test_limits_coordinator.py."""

from __future__ import annotations

import json
import sqlite3
import stat
import subprocess
import sys

import pytest
from e2e_cluster import Cluster

from gpuq.client import listing_request
from gpuq.domain.limits import MAX_JOB_ID
from gpuq.errors import InvalidInput
from gpuq.v1 import queue_pb2


def test_array_task_ids_mean_the_task_everywhere(cluster: Cluster) -> None:
    # and as a script written for SLURM reads it
    slurm = "$SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID: $SLURM_ARRAY_TASK_COUNT tasks"
    array = cluster.submit(
        f"echo task $GPUQ_ARRAY_TASK_ID, {slurm}", array="0-11", output="t-%A_%a.out"
    )
    cluster.client().wait(array, timeout=60)
    result = cluster.gpuq("logs", f"{array}_10")
    assert (result.returncode, result.stdout) == (0, f"task 10, 10 of {array}: 12 tasks\n")
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


def test_a_held_array_is_one_line_and_listings_take_state_codes(lone_coordinator: Cluster) -> None:
    cluster = lone_coordinator
    array = cluster.submit("echo $GPUQ_ARRAY_TASK_ID", array="0-999%3", hold=True)
    queue = cluster.gpuq("queue")
    assert f"{array}_[0-999%3]" in queue.stdout, queue.stdout
    assert queue.stdout.count("\n") == 2  # the header and the array's one line
    cancelled = cluster.gpuq("cancel", f"{array}_5")
    assert cancelled.returncode == 0 and f"job {array}_5: cancelled" in cancelled.stdout
    assert f"{array}_[0-4,6-999%3]" in cluster.gpuq("queue").stdout
    held = cluster.submit("true", hold=True)
    for codes in ("PD,HD", "r,held"):
        result = cluster.gpuq("queue", "-s", codes, "--json")
        assert result.returncode == 0, result
        assert {j["id"] for j in json.loads(result.stdout)} == {array, held}
    for args in (["queue", "-s", "XX"], ["history", "-n", "-1"], ["history", "-n", "0"]):
        result = cluster.gpuq(*args)
        assert result.returncode == 2, result
        assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


def test_status_asks_its_listings_together_and_reads_every_page(
    lone_coordinator: Cluster,
) -> None:
    """`gpuq status` sends its four calls at once (Client.nodes_and_listings): a listing
    longer than a page still comes whole, and a refused call is the one error it raises."""
    cluster = lone_coordinator
    held = [cluster.submit("true", hold=True) for _ in range(3)]
    client = cluster.client()
    nodes, (mine, by_two) = client.nodes_and_listings(
        listing_request(user="root", page_size=1),
        listing_request(states=["held"], page_size=2),
    )
    assert nodes == [] and [j.id for j in mine] == held and [j.id for j in by_two] == held
    with pytest.raises(InvalidInput, match="job ids go from 1"):
        client.nodes_and_listings(queue_pb2.ListJobsRequest(job_ids=[MAX_JOB_ID + 1]))
    status = cluster.gpuq("status")
    assert status.returncode == 0 and "My jobs (root): 3 held" in status.stdout, status


def test_a_stored_job_that_breaks_scheduling_is_listed(lone_coordinator: Cluster) -> None:
    """A job stored before today's checks (a begin time in year 33658): once the pass has set
    it aside (held, the error its reason), every listing still shows it."""
    cluster = lone_coordinator
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
    held = cluster.wait_state(bad, "held")
    assert "scheduling failed on this job" in held.reason
    for args in (["queue"], ["status"], ["show", str(bad)], ["history"]):
        result = cluster.gpuq(*args)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result


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
