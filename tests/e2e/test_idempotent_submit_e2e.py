"""Idempotent submission with real processes: a request key names one job, across a retry and
a coordinator killed and started again."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from e2e_cluster import Cluster

import gpuq
import gpuq.client_submit
from gpuq.domain.states import JobState


def all_jobs(cluster: Cluster) -> list[int]:
    client = cluster.client()
    return sorted(j.id for j in [*client.list(), *client.list(finished=True)])


def test_a_repeated_request_key_is_one_job(bare_cluster: Cluster) -> None:
    cluster = bare_cluster
    cluster.start_coordinator()
    first = cluster.submit("true", hold=True, request_key="K-1")
    again = cluster.submit("echo other", hold=True, request_key="K-1")
    other = cluster.submit("true", hold=True, request_key="K-2")
    plain = [cluster.submit("true", hold=True) for _ in range(2)]  # a random key each
    assert again == first
    assert len({first, other, *plain}) == 4
    assert all_jobs(cluster) == sorted({first, other, *plain})
    assert cluster.job(first).spec.script.endswith("true\n")
    with pytest.raises(gpuq.InvalidInput, match="request key"):
        cluster.submit("true", hold=True, request_key="x" * 65)
    with pytest.raises(gpuq.InvalidInput, match="request key"):
        cluster.submit("true", hold=True, request_key="tab\there")


def test_a_retry_after_a_coordinator_restart_gets_the_first_id(tmp_path: Path) -> None:
    # one queued job per user: the retry must not be refused for the first request's own job
    cluster = Cluster(tmp_path, config="max_queued_per_user = 1\n")
    try:
        cluster.start_coordinator()
        first = cluster.submit("true", hold=True, request_key="retry-me")
        cluster.kill(cluster.coordinator)  # as if it died before its answer left
        cluster.start_coordinator()
        assert cluster.submit("true", hold=True, request_key="retry-me") == first
        assert all_jobs(cluster) == [first]
        assert cluster.job(first).state is JobState.HELD
        with pytest.raises(gpuq.Unsatisfiable, match="at most 1 queued"):
            cluster.submit("true", hold=True, request_key="a new one")
        assert all_jobs(cluster) == [first]
    finally:
        cluster.close()


def test_a_submission_waits_out_a_coordinator_restart(
    bare_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sent while no coordinator listens: the client tries again until one answers."""
    monkeypatch.setattr(gpuq.client_submit, "SUBMIT_RETRY_DELAYS", (0.2, 0.5, 1.0, 2.0, 4.0, 8.0))
    cluster = bare_cluster
    cluster.start_coordinator()
    client = cluster.client()
    before = cluster.submit("true", hold=True)
    cluster.kill(cluster.coordinator)
    restart = threading.Timer(0.3, cluster.start_coordinator)
    restart.start()
    try:
        started = time.monotonic()
        job_id = cluster.submit("true", hold=True)
        assert 0.2 <= time.monotonic() - started < 30  # it failed at first, and tried again
    finally:
        restart.join()
    assert all_jobs(cluster) == [before, job_id]
    assert client.get(job_id).state is JobState.HELD
