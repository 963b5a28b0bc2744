"""`gpuq update`, `gpuq requeue` and the bulk verbs (`-u`, `--state`, `--name`) at the command
line, against a real coordinator: what it prints of the coordinator's answers (a line per job,
a summary for a bulk request) and its exit codes. What the coordinator does with these
requests (the rules, the stops, the requeues, who may do what) is tested in process, in
tests/store/test_update_requeue_coordinator.py; who a caller is across processes, in
test_identity_e2e.py."""

from __future__ import annotations

from e2e_cluster import Cluster


def test_update_requeue_and_bulk_verbs_print_their_answers(lone_coordinator: Cluster) -> None:
    cluster = lone_coordinator
    job = cluster.submit("true", hold=True, time="1:00:00")
    result = cluster.gpuq("update", str(job), "--time", "0:00:03")
    assert result.returncode == 0, result.stderr
    assert f"job {job}: updated: time 01:00:00 -> 00:00:03" in result.stdout
    # a cycle (the request refused), an unknown qos (the job refused), a bad time (refused by
    # the command line): exit 2, one line
    other = cluster.submit("true", hold=True, after=[str(job)])
    for args in (
        (str(job), "--after", str(other)),
        (str(job), "--qos", "nosuch"),
        (str(job), "--time", "soon"),
    ):
        result = cluster.gpuq("update", *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
    # --no-requeue: refused, exit 2
    never = cluster.submit("true", hold=True, no_requeue=True)
    cluster.client().cancel(never)
    result = cluster.gpuq("requeue", str(never))
    assert result.returncode == 2 and "--no-requeue" in result.stderr

    # bulk: one request, a summary line
    sweep = [cluster.submit("true", hold=True, name=f"sweep-{i}") for i in range(30)]
    keep = cluster.submit("true", hold=True, name="keep")
    result = cluster.gpuq("hold", "--name", "nomatch*")
    assert result.returncode == 0 and "no jobs matched" in result.stderr
    result = cluster.gpuq("cancel", "--state", "HD", "--name", "sweep-*")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "cancelled 30 jobs: cancelled"
    assert {cluster.job(j).state.value for j in sweep} == {"cancelled"}
    result = cluster.gpuq("release", "-u", "root", "-v")
    assert result.returncode == 0 and f"job {keep}: pending" in result.stdout
    # nothing to select: usage error
    assert cluster.gpuq("cancel").returncode == 2
