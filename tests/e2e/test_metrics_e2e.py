"""Prometheus metrics end to end: a real coordinator with [coordinator] metrics_listen, an
agent with fake GPUs, /metrics scraped over real HTTP before, during and after jobs run; the
counters and histograms move by the right amounts (values, not just names). Metrics are off by
default, and plaintext on an address other than loopback is refused at start."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for
from helpers import Samples, metric_samples
from helpers import metric_value as value


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, 'metrics_listen = "127.0.0.1:0"\n')
    try:
        running.start_coordinator()
        running.start_agent("a", "2xA100-80GB")
        yield running
    finally:
        running.close()


def address_file(cluster: Cluster) -> dict[str, object]:
    return dict(json.loads((cluster.home / "coordinator.json").read_text()))


def scrape(cluster: Cluster) -> Samples:
    url = f"http://{address_file(cluster)['metrics']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["content-type"].startswith("text/plain")
        text = answer.read().decode()
    return metric_samples(text)


def test_counters_and_histograms_move_as_jobs_run(cluster: Cluster) -> None:
    before = scrape(cluster)
    assert value(before, "gpuq_jobs_submitted_total") == 0
    assert value(before, "gpuq_jobs_started_total") == 0
    assert value(before, "gpuq_jobs_ended_total", state="completed") == 0
    assert value(before, "gpuq_node_gpus", node="a") == 2
    assert value(before, "gpuq_node_gpus_allocated", node="a") == 0
    assert value(before, "gpuq_nodes", state="up") == 1
    gpus = [k for k in before if k[0] == "gpuq_gpu_memory_total_bytes"]
    assert len(gpus) == 2 and all(dict(labels)["node"] == "a" for _, labels in gpus)

    long = cluster.submit("sleep 3", gpus=1)
    cluster.wait_state(long, "running")
    during = scrape(cluster)
    assert value(during, "gpuq_jobs_submitted_total") == 1
    assert value(during, "gpuq_jobs_started_total") == 1
    assert value(during, "gpuq_jobs", state="running", qos="normal") == 1
    assert value(during, "gpuq_node_gpus_allocated", node="a") == 1
    assert value(during, "gpuq_job_queue_wait_seconds_count") == 1
    user = next(dict(k[1])["user"] for k in during if k[0] == "gpuq_user_running_gpus")
    assert value(during, "gpuq_user_running_gpus", user=user) == 1

    quick = cluster.submit("true")
    failing = cluster.submit("exit 3")
    cluster.wait_state(quick, "completed")
    cluster.wait_state(failing, "failed")
    cluster.wait_state(long, "completed")
    # the coordinator counts an end as it records it: by now it has
    after = wait_for(
        lambda: (
            (s := scrape(cluster))
            and value(s, "gpuq_jobs_ended_total", state="completed") == 2
            and s
        ),
        what="two completed jobs counted",
    )
    assert value(after, "gpuq_jobs_submitted_total") == 3
    assert value(after, "gpuq_jobs_started_total") == 3
    assert value(after, "gpuq_jobs_ended_total", state="failed") == 1
    assert value(after, "gpuq_jobs_ended_total", state="cancelled") == 0
    assert value(after, "gpuq_job_queue_wait_seconds_count") == 3
    assert value(after, "gpuq_job_queue_wait_seconds_sum") >= 0
    assert value(after, "gpuq_job_run_seconds_count", state="completed") == 2
    assert value(after, "gpuq_job_run_seconds_count", state="failed") == 1
    # the long job ran its 3 s (the supervisor's clock, as the coordinator recorded it)
    assert value(after, "gpuq_job_run_seconds_sum", state="completed") >= 2.5
    assert value(after, "gpuq_job_run_seconds_bucket", state="completed", le="1.0") <= 1
    assert value(after, "gpuq_jobs", state="running", qos="normal") == 0
    assert value(after, "gpuq_node_gpus_allocated", node="a") == 0
    assert value(after, "gpuq_scheduling_pass_seconds_count") > value(
        before, "gpuq_scheduling_pass_seconds_count"
    )
    assert value(after, "gpuq_store_write_seconds_count") > value(
        before, "gpuq_store_write_seconds_count"
    )
    # the long job's GPU-seconds are charged to its user's fair share
    assert value(after, "gpuq_user_fairshare_usage_gpu_seconds", user=user) >= 2.5

    # nothing but GET/HEAD /metrics
    base = f"http://{address_file(cluster)['metrics']}"
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{base}/", timeout=10)
    assert missing.value.code == 404
    post = urllib.request.Request(f"{base}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(post, timeout=10)
    assert refused.value.code == 405


def test_metrics_are_off_by_default(bare_cluster: Cluster) -> None:
    bare_cluster.start_coordinator()
    assert "metrics" not in address_file(bare_cluster)


def test_plaintext_metrics_on_a_public_address_are_refused_at_start(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 'metrics_listen = "0.0.0.0:0"\n')
    try:
        started = cluster.gpuq("coordinator", timeout=60)
    finally:
        cluster.close()
    assert started.returncode != 0
    assert "refusing to listen on 0.0.0.0:0 without TLS (the metrics would" in started.stderr
    assert started.stderr.count("refusing") == 1, started.stderr
    assert not (cluster.home / "coordinator.json").exists()


def test_gpuq_serve_takes_the_ports_from_its_command_line(tmp_path: Path) -> None:
    """`gpuq serve --web HOST:PORT --metrics HOST:PORT`: no config file needed to try them."""
    cluster = Cluster(tmp_path)
    try:
        cluster.coordinator = cluster._spawn(
            ["serve", "--fake-gpus", "1", "--web", "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
            "serve",
        )
        found = wait_for(
            lambda: (cluster.home / "coordinator.json").exists() and address_file(cluster),
            what="gpuq serve to start",
        )
        assert {"web", "metrics"} <= set(found)
        wait_for(
            lambda: (
                [v for (name, _), v in scrape(cluster).items() if name == "gpuq_node_gpus"] == [1]
            ),
            what="the local agent's GPU in the metrics",
        )
        link = cluster.gpuq("web")
        assert link.returncode == 0 and link.stdout.startswith(f"http://{found['web']}/login#")
        refused = cluster.gpuq("serve", "--web", "nonsense")
        assert refused.returncode == 2 and "--web" in refused.stderr
    finally:
        cluster.close()
