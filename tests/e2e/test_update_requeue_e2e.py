"""Editing queued jobs (`gpuq update`), `gpuq requeue`, and bulk verbs (`-u`, `--state`,
`--name`), against a real coordinator and agent; other users are real Unix users.

Root (who runs CI) is an admin; alice and bob are not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import unix_users
from e2e_cluster import Cluster, wait_for
from unix_users import UnixUser, run_as

pytestmark = pytest.mark.timeout(180)
user_homes = unix_users.user_homes
shared_root = unix_users.shared_root
users = unix_users.two_users


@pytest.fixture
def one_node(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path)
    try:
        cluster.start_coordinator()
        cluster.start_agent("n1", "2xA100-80GB")
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def shared_cluster(shared_root: Path) -> Iterator[Cluster]:
    cluster = Cluster(shared_root)
    try:
        cluster.start_coordinator()
        cluster.start_agent("n1", "2xA100-80GB")
        yield cluster
    finally:
        cluster.close()


def gpuq_as(user: UnixUser, home: Path, *args: str) -> tuple[int, str, str]:
    result = run_as(user, ["-m", "gpuq.cli.main", "--home", str(home), *args])
    return result.returncode, result.stdout, result.stderr


def submit_as(user: UnixUser, cluster: Cluster, *args: str) -> int:
    code, out, err = gpuq_as(user, cluster.home, "submit", "--parsable", *args)
    assert code == 0, err
    return int(out.strip())


def reasons(cluster: Cluster, job: int) -> list[str]:
    return [e.reason for e in cluster.client().detail(job)[1]]


def test_update_changes_a_pending_jobs_limit_and_it_is_enforced_at_start(
    one_node: Cluster,
) -> None:
    cluster = one_node
    job = cluster.submit("sleep 30", hold=True, time="1:00:00")
    result = cluster.gpuq("update", str(job), "--time", "0:00:03")
    assert result.returncode == 0, result.stderr
    assert f"job {job}: updated: time 01:00:00 -> 00:00:03" in result.stdout
    assert cluster.job(job).spec.resources.time_limit == 3
    assert any("updated by root: time 01:00:00 -> 00:00:03" in r for r in reasons(cluster, job))
    # the new limit is the one enforced: released, it runs and times out after ~3 s
    assert cluster.gpuq("release", str(job)).returncode == 0
    ended = cluster.wait_state(job, "timeout", "completed", "failed", timeout=40)
    assert ended.state.value == "timeout"


def test_update_nice_qos_after_name_hold_and_bad_input(one_node: Cluster) -> None:
    cluster = one_node
    first = cluster.submit("true", hold=True)
    job = cluster.submit("true", hold=True, name="before")
    result = cluster.gpuq(
        "update", str(job), "--nice", "5", "--qos", "low", "--after", str(first), "--name", "after"
    )
    assert result.returncode == 0, result.stderr
    got = cluster.job(job)
    assert (got.spec.nice, got.qos, got.spec.name) == (5, "low", "after")
    assert [d.job_id for d in got.spec.dependencies] == [first]
    # --after none clears; --release releases it too (it then waits for nothing)
    result = cluster.gpuq("update", str(job), "--after", "none", "--release")
    assert result.returncode == 0, result.stderr
    assert cluster.job(job).spec.dependencies == ()
    cluster.wait_state(job, "completed")
    # a cycle, an unknown qos, a bad time: exit 2, one line, nothing changed
    other = cluster.submit("true", hold=True, after=[str(first)])
    for args in (
        (str(first), "--after", str(other)),
        (str(first), "--qos", "nosuch"),
        (str(first), "--time", "soon"),
    ):
        result = cluster.gpuq("update", *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
    assert cluster.job(first).spec.dependencies == ()
    assert cluster.job(first).qos == "normal"


def test_a_running_job_is_not_updated_but_requeued(one_node: Cluster) -> None:
    cluster = one_node
    marker = cluster.root / "runs"
    job = cluster.submit(f"echo run >> {marker}; sleep 60")
    cluster.wait_state(job, "running")
    result = cluster.gpuq("update", str(job), "--time", "10")
    assert result.returncode == 2
    assert f"job {job} is running: only pending or held jobs can be updated" in result.stderr
    # requeue: stopped, back to the queue with the same id, and it runs again
    result = cluster.gpuq("requeue", str(job))
    assert result.returncode == 0, result.stderr
    wait_for(
        lambda: marker.exists() and marker.read_text().count("run") == 2,
        40,
        "the requeued job to run again",
    )
    got = cluster.wait_state(job, "running")
    assert got.requeue_count == 1
    assert any(r.startswith("requeued by root") for r in reasons(cluster, job))
    # --hold: stopped, and back in the queue held
    result = cluster.gpuq("requeue", str(job), "--hold")
    assert result.returncode == 0, result.stderr
    got = cluster.wait_state(job, "held")
    assert got.requeue_count == 2
    assert cluster.gpuq("cancel", str(job)).returncode == 0


def test_updating_an_array_updates_its_unstarted_tasks(one_node: Cluster) -> None:
    cluster = one_node
    array = cluster.submit("true", hold=True, array="0-99", time="1:00:00")
    assert cluster.gpuq("release", f"{array}_3").returncode == 0  # a task of its own now
    cluster.wait_state(array, "held")
    result = cluster.gpuq("update", str(array), "--time", "10:00", "--nice", "3")
    assert result.returncode == 0, result.stderr
    record = cluster.job(array)
    assert (record.spec.resources.time_limit, record.spec.nice) == (600, 3)


def test_requeue_of_a_failed_job_and_held(one_node: Cluster) -> None:
    cluster = one_node
    job = cluster.submit("exit 3")
    cluster.wait_state(job, "failed")
    result = cluster.gpuq("requeue", str(job), "--hold")
    assert result.returncode == 0, result.stderr
    got = cluster.wait_state(job, "held")
    assert got.requeue_count == 1 and got.result is None
    assert cluster.gpuq("release", str(job)).returncode == 0
    cluster.wait_state(job, "failed")
    # --no-requeue: refused, as SLURM refuses it
    never = cluster.submit("exit 1", no_requeue=True)
    cluster.wait_state(never, "failed")
    result = cluster.gpuq("requeue", str(never))
    assert result.returncode == 2 and "--no-requeue" in result.stderr


def test_bulk_cancel_by_state_and_name_is_one_request(one_node: Cluster) -> None:
    cluster = one_node
    sweep = [cluster.submit("true", hold=True, name=f"sweep-{i}") for i in range(30)]
    keep = cluster.submit("true", hold=True, name="keep")
    result = cluster.gpuq("hold", "--name", "nomatch*")
    assert result.returncode == 0 and "no jobs matched" in result.stderr
    result = cluster.gpuq("cancel", "--state", "HD", "--name", "sweep-*")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "cancelled 30 jobs: cancelled"
    assert {cluster.job(j).state.value for j in sweep} == {"cancelled"}
    assert cluster.job(keep).state.value == "held"
    result = cluster.gpuq("release", "-u", "root", "-v")
    assert result.returncode == 0 and f"job {keep}: pending" in result.stdout
    # nothing to select: usage error
    assert cluster.gpuq("cancel").returncode == 2


def test_owners_may_only_lower_and_others_jobs_are_refused_as_a_whole(
    shared_cluster: Cluster, users: tuple[UnixUser, UnixUser]
) -> None:
    cluster = shared_cluster
    alice, bob = users
    job = submit_as(alice, cluster, "--hold", "--time", "1:00:00", "--wrap", "true")
    mine = submit_as(bob, cluster, "--hold", "--time", "1:00:00", "--wrap", "true")
    # an owner cannot raise the limit: exit 2, one line, nothing changed
    code, out, err = gpuq_as(alice, cluster.home, "update", str(job), "--time", "2:00:00")
    assert code == 2 and len(err.strip().splitlines()) == 1, (out, err)
    assert "only admins may raise a time limit" in err
    # nor lower nice below its value
    code, out, err = gpuq_as(alice, cluster.home, "update", str(job), "--nice", "-5")
    assert code == 2 and "only admins may lower nice" in err, err
    assert cluster.job(job).spec.resources.time_limit == 3600
    # but may lower it
    code, out, err = gpuq_as(alice, cluster.home, "update", str(job), "--time", "30:00")
    assert code == 0, err
    assert cluster.job(job).spec.resources.time_limit == 1800
    # a request naming bob's job is refused as a whole: alice's own is not changed either
    code, out, err = gpuq_as(alice, cluster.home, "update", str(job), str(mine), "--nice", "9")
    assert code == 2 and f"belongs to {bob.name}" in err, err
    assert cluster.job(job).spec.nice == 0
    # -u other: admins only; without -u, alice's filters match only her own jobs
    code, out, err = gpuq_as(alice, cluster.home, "cancel", "-u", bob.name)
    assert code == 2 and "only admins" in err, err
    code, out, err = gpuq_as(alice, cluster.home, "cancel", "--state", "HD")
    assert code == 0, err
    assert cluster.job(job).state.value == "cancelled"
    assert cluster.job(mine).state.value == "held"
    # an admin (root) may raise it
    result = cluster.gpuq("update", str(mine), "--time", "3:00:00")
    assert result.returncode == 0, result.stderr
    assert cluster.job(mine).spec.resources.time_limit == 3 * 3600
