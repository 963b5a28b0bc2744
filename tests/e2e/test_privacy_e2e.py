"""One privacy rule (`[coordinator] private_data`) for the CLI, the dashboard and metrics.

Two throwaway Unix users (tests/e2e/unix_users.py) run the real `gpuq` over the Unix socket of
a root coordinator with the dashboard and metrics on. Under a lab server's default everyone
sees which user's job holds each GPU and what it is named; with `private_data = ["names",
"usage"]` others see `(hidden)` for names and nothing of others' usage, while root (an admin)
sees everything. Root only; CI runs as root.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
import unix_users
from e2e_cluster import Cluster, wait_for
from test_web_e2e import Web, gpuq_as, signed_in, submit_as, web_address
from unix_users import UnixUser

pytestmark = pytest.mark.timeout(180)
user_homes = unix_users.user_homes
shared_root = unix_users.shared_root
users = unix_users.two_users

PORTS = 'web_listen = "127.0.0.1:0"\nmetrics_listen = "127.0.0.1:0"\n'


def started(root: Path, config: str) -> Cluster:
    cluster = Cluster(root, PORTS + config)
    cluster.start_coordinator()
    cluster.start_agent("n1", "2xA100-80GB")
    return cluster


def running_job(cluster: Cluster, owner: UnixUser, name: str) -> str:
    job = submit_as(owner, cluster.home, "--gpus", "1", "--name", name, "--wrap", "sleep 60")
    wait_for(
        lambda: cluster.client().get(int(job)).state.value == "running",
        what=f"job {job} running",
    )
    return job


def gpu_line(text: str, job: str) -> str:
    """The `gpuq status` line of the GPU that `job` holds."""
    lines = [line for line in text.splitlines() if f"job {job} " in line and "GPU " in line]
    assert len(lines) == 1, text
    return lines[0]


def user_metrics(cluster: Cluster) -> list[str]:
    address = json.loads((cluster.home / "coordinator.json").read_text())["metrics"]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        text: str = answer.read().decode()
    return [line for line in text.splitlines() if line.startswith("gpuq_user_")]


def test_by_default_everyone_sees_who_holds_each_gpu_and_the_job_name(
    shared_root: Path, users: tuple[UnixUser, UnixUser]
) -> None:
    alice, bob = users
    cluster = started(shared_root, "")
    try:
        job = running_job(cluster, alice, "thesis-v2")
        code, out, err = gpuq_as(bob, cluster.home, "status")
        assert code == 0, err
        assert f"{alice.name}: job {job} (thesis-v2)" in gpu_line(out, job), out
        code, out, err = gpuq_as(bob, cluster.home, "queue")
        assert code == 0 and "thesis-v2" in out and alice.name in out, out
        # the dashboard says the same to bob, usage included
        web = signed_in(cluster, bob)
        status, _, answer = web.call("GET", "/api/jobs")
        assert status == 200, answer
        shown = {str(j["id"]): j for j in answer["jobs"]}
        assert shown[job]["user"] == alice.name and shown[job]["spec"]["name"] == "thesis-v2"
        status, _, page = web.call("GET", f"/api/users/{alice.name}")
        assert status == 200 and page["running_gpus"] == 1, page
        assert any(alice.name in line for line in user_metrics(cluster))
    finally:
        cluster.close()


def test_private_names_and_usage_hide_them_from_other_users_alike(
    shared_root: Path, users: tuple[UnixUser, UnixUser]
) -> None:
    alice, bob = users
    cluster = started(shared_root, 'private_data = ["names", "usage"]\n')
    try:
        job = running_job(cluster, alice, "thesis-v2")
        # bob: who holds the GPU, not what the job is named
        code, out, err = gpuq_as(bob, cluster.home, "status")
        assert code == 0, err
        line = gpu_line(out, job)
        assert f"{alice.name}: job {job} ((hidden))" in line and "thesis" not in out, out
        for args in (("queue",), ("show", job), ("status", "--json")):
            code, out, err = gpuq_as(bob, cluster.home, *args)
            assert code == 0 and "thesis" not in out and "(hidden)" in out, (args, out, err)
        # alice sees her own, root (an admin) everyone's
        code, out, err = gpuq_as(alice, cluster.home, "status")
        assert f"{alice.name}: job {job} (thesis-v2)" in gpu_line(out, job), out
        assert "(thesis-v2)" in gpu_line(cluster.gpuq("status").stdout, job)
        # the dashboard follows the same rule: names hidden, alice's usage private to bob
        web = signed_in(cluster, bob)
        status, _, answer = web.call("GET", "/api/jobs")
        assert status == 200 and "thesis" not in json.dumps(answer), answer
        status, _, page = web.call("GET", f"/api/users/{alice.name}")
        assert status == 200 and page["running_gpus"] is None and page["fairshare"] is None
        status, _, page = signed_in(cluster, alice).call("GET", f"/api/users/{alice.name}")
        assert status == 200 and page["running_gpus"] == 1, page
        assert Web(web_address(cluster)).call("GET", "/api/jobs")[0] == 401
        # metrics, read by nobody in particular, carry no user's usage
        assert user_metrics(cluster) == [], user_metrics(cluster)
    finally:
        cluster.close()
