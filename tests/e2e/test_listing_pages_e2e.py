"""Listings in pages with real processes (issue 23): a coordinator whose largest page is 3
([coordinator] list_page_size), so that a handful of jobs takes several pages. ListJobs over
gRPC gives every job once and at most 3 a reply; `gpuq queue`, `gpuq status` and `gpuq
history` still show everything asked for (they page to the end); the dashboard's /api/jobs
gives a page, its token and every live job's count; bad paging input is one clear error."""

from __future__ import annotations

import getpass
import json
import urllib.parse
from collections.abc import Iterator

import pytest
from e2e_cluster import Cluster
from test_web_e2e import Web, ticket_of, web_address

from gpuq.errors import InvalidInput
from gpuq.v1 import queue_pb2

pytestmark = pytest.mark.timeout(180)
PAGE = 3


@pytest.fixture(scope="module")
def paged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, list[int]]]:
    """No agent: 8 held jobs (three named sweep-*), a held array of 20 tasks, 4 cancelled."""
    config = f'web_listen = "127.0.0.1:0"\nlist_page_size = {PAGE}\n'
    cluster = Cluster(tmp_path_factory.mktemp("pages"), config)
    try:
        cluster.start_coordinator()
        jobs = [
            cluster.submit("true", name=f"sweep-{i}" if i < 3 else f"job-{i}", hold=True)
            for i in range(12)
        ]
        jobs.append(cluster.submit("true", name="arr", hold=True, array="0-19"))
        cluster.client().cancel(*jobs[8:12])
        yield cluster, jobs
    finally:
        cluster.close()


def test_list_jobs_pages_give_each_job_once(paged: tuple[Cluster, list[int]]) -> None:
    cluster, jobs = paged
    live = [*jobs[:8], jobs[12]]
    client = cluster.client()
    request = queue_pb2.ListJobsRequest(page_size=1000)  # more than the largest: 3
    seen: list[int] = []
    while True:
        reply = client._call("ListJobs", request)
        assert len(reply.jobs) <= PAGE
        seen += [j.id for j in reply.jobs]
        if not reply.next_page_token:
            break
        request.page_token = reply.next_page_token
    assert seen == live
    assert [j.id for j in client.list_raw()] == live
    assert [j.id for j in client.list_raw(page_size=2)] == live
    assert [j.id for j in client.list_raw(names=["sweep*"])] == jobs[:3]
    assert [j.id for j in client.list_raw(finished=True)] == jobs[11:7:-1]
    assert [j.id for j in client.list_raw(finished=True, limit=2)] == jobs[11:9:-1]
    first = client._call("ListJobs", queue_pb2.ListJobsRequest())
    for bad in (
        queue_pb2.ListJobsRequest(page_token="not-a-token"),
        queue_pb2.ListJobsRequest(names=["sweep*"], page_token=first.next_page_token),
    ):
        with pytest.raises(InvalidInput, match="page_token"):
            client._call("ListJobs", bad)
    with pytest.raises(InvalidInput, match="page_size"):
        client.list_raw(page_size=-1)


def test_the_command_line_shows_every_job(paged: tuple[Cluster, list[int]]) -> None:
    cluster, jobs = paged
    result = cluster.gpuq("queue", "--json")
    assert result.returncode == 0, result.stderr
    assert [j["id"] for j in json.loads(result.stdout)] == [*jobs[:8], jobs[12]]
    table = cluster.gpuq("queue", "--noheader", "--format", "%i")
    assert table.stdout.split() == [*map(str, jobs[:8]), f"{jobs[12]}_[0-19]"]
    history = cluster.gpuq("history", "--json", "-n", "4")
    assert [j["id"] for j in json.loads(history.stdout)] == jobs[11:7:-1]
    status = cluster.gpuq("status", "--json")
    assert len(json.loads(status.stdout)["jobs"]) == 9


def test_the_dashboard_api_pages(paged: tuple[Cluster, list[int]]) -> None:
    cluster, jobs = paged
    login = cluster.gpuq("web")
    assert login.returncode == 0, login.stderr
    web = Web(web_address(cluster))
    web.login(ticket=ticket_of(login.stdout.strip()))
    seen: list[int] = []
    path = "/api/jobs?page_size=2"
    while True:
        status, _, answer = web.call("GET", path)
        assert status == 200 and len(answer.get("jobs", [])) <= 2, answer
        assert answer["counts"] == {"running": 0, "pending": 0, "held": 28}
        seen += [int(j["id"]) for j in answer.get("jobs", [])]
        if not answer.get("next_page_token"):
            break
        token = urllib.parse.quote(answer["next_page_token"])
        path = f"/api/jobs?page_size=2&page_token={token}"
    assert seen == [*jobs[:8], jobs[12]]
    status, _, answer = web.call("GET", "/api/jobs?page_size=99999999999")
    assert status == 200 and len(answer["jobs"]) == PAGE
    for bad in ("page_size=-1", "page_size=x", "page_token=garbage", "state=nonsense"):
        status, _, answer = web.call("GET", f"/api/jobs?{bad}")
        assert status == 400 and answer["error"], bad
    status, _, answer = web.call("GET", f"/api/users/{getpass.getuser()}")
    assert status == 200 and len(answer["jobs"]) == PAGE and answer["more"] is True
