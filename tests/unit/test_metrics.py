"""Prometheus metrics of a coordinator in memory (a real SQLite store, a fake clock, no
agents): the event counters and histograms move with job events, the scrape-time gauges read
the coordinator's memory, pending reasons fall in bounded categories, and the Grafana
dashboard in the repository uses only metrics the coordinator exports."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Clock, record_ends, save_node, submit, until
from helpers import Samples, make_spec, metric_samples
from helpers import metric_value as value

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.memory.node_table import NodeEntry
from gpuq.coordinator.metrics import REASONS, Metrics, main_reason, reason_category
from gpuq.coordinator.nodes.agent_session import AgentSession
from gpuq.coordinator.server import assemble
from gpuq.coordinator.serving import attach_metrics, metric_sources
from gpuq.coordinator.workload.idle_rules import Track
from gpuq.domain.array_specs import ArraySpec
from gpuq.domain.model import GpuUnit, JobResult, Node, NodeState
from gpuq.domain.states import JobState
from gpuq.scheduler.snapshot import Waiting
from gpuq.store.api import Store
from gpuq.v1 import types_pb2 as pb
from gpuq.web.http_types import Request

GiB = 1 << 30
DASHBOARD = Path(__file__).resolve().parents[2] / "grafana" / "gpuq.json"
UNITS = (
    GpuUnit("GPU-a-0", 0, "NVIDIA H100", 80 * GiB, "0:1b"),
    GpuUnit("GPU-a-1", 1, "NVIDIA H100", 80 * GiB, "0:1e"),
    GpuUnit("MIG-a-2-0", 2, "NVIDIA H100 MIG 3g.40gb", 40 * GiB, "0:21", "GPU-a-2", "3g.40gb"),
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(f"sqlite:///{tmp_path / 'gpuq.db'}")
    try:
        yield opened
    finally:
        opened.close()


def scrape(metrics: Metrics) -> Samples:
    text = metrics.exposition().decode()
    return metric_samples(text)


def test_counters_histograms_and_gauges_follow_the_coordinator(store: Store) -> None:
    clock = Clock()

    async def main() -> None:
        co = assemble(store, CoordinatorSettings(), clock)
        metrics = attach_metrics(co)
        await co.start()
        try:
            node = Node("a", UNITS, 16, 64 * GiB, NodeState.UP)
            await save_node(co, node)
            entry = NodeEntry(node, clock(), AgentSession("a"), heard=True, heard_at=co.steady())
            entry.usage = (
                pb.GpuUsage(uuid="GPU-a-0", memory_used=10 * GiB, utilization=50),
                pb.GpuUsage(uuid="GPU-a-1", memory_used=2 * GiB, health="dirty"),
                pb.GpuUsage(uuid="MIG-a-2-0", memory_used=0),  # utilisation unknown
            )
            co.nodes.nodes["a"] = entry
            before = scrape(metrics)
            assert value(before, "gpuq_jobs_submitted_total") == 0
            assert value(before, "gpuq_jobs", state="pending", qos="normal") == 0

            [first] = await submit(co, make_spec(gpus=1), "alice")
            await until(lambda: co.jobs.jobs[first].state is JobState.RUNNING)
            clock.now += 30  # the second waits 30 s behind it (GPU 1 is dirty)
            [second] = await submit(co, make_spec(gpus=1), "bob")
            await submit(co, make_spec(begin_time=clock.now + 3600), "bob")
            await submit(co, make_spec(hold=True), "bob")
            await submit(co, make_spec(array=ArraySpec(tuple(range(5)))), "carol")
            co.idle.tracks[first] = Track(start=1, flags={"idle": "idle since 12:00"})
            running = co.jobs.in_state(JobState.RUNNING)
            await until(lambda: len(running) == 6)  # the array's tasks too

            during = scrape(metrics)
            assert value(during, "gpuq_jobs_submitted_total") == 1 + 1 + 1 + 1 + 5
            assert value(during, "gpuq_jobs_started_total") == 1 + 5  # the array's tasks ran
            assert value(during, "gpuq_job_queue_wait_seconds_count") == 6
            assert value(during, "gpuq_jobs", state="running", qos="normal") == 6
            assert value(during, "gpuq_jobs", state="held", qos="normal") == 1
            assert value(during, "gpuq_jobs", state="pending", qos="normal") == 2
            assert value(during, "gpuq_pending_jobs", reason="resources") == 1
            assert value(during, "gpuq_pending_jobs", reason="begin_time") == 1
            assert value(during, "gpuq_node_gpus", node="a") == 3
            assert value(during, "gpuq_node_gpus_allocated", node="a") == 1
            assert value(during, "gpuq_node_gpus_idle_allocated", node="a") == 1
            assert value(during, "gpuq_node_gpus_dirty", node="a") == 1
            assert value(during, "gpuq_node_gpus_unhealthy", node="a") == 0
            assert value(during, "gpuq_nodes", state="up") == 1
            whole = {"node": "a", "gpu": "0", "uuid": "GPU-a-0", "model": "NVIDIA H100"}
            assert value(during, "gpuq_gpu_utilization_ratio", **whole) == 0.5
            assert value(during, "gpuq_gpu_memory_used_bytes", **whole) == 10 * GiB
            assert value(during, "gpuq_gpu_memory_total_bytes", **whole) == 80 * GiB
            mig = {"node": "a", "gpu": "2/3g.40gb", "uuid": "MIG-a-2-0"}
            mig["model"] = "NVIDIA H100 MIG 3g.40gb"
            assert value(during, "gpuq_gpu_memory_total_bytes", **mig) == 40 * GiB
            assert ("gpuq_gpu_utilization_ratio", frozenset(mig.items())) not in during
            assert value(during, "gpuq_user_running_gpus", user="alice") == 1
            assert value(during, "gpuq_scheduling_pass_seconds_count") > 0
            assert value(during, "gpuq_store_write_seconds_count") >= 5

            clock.now += 60  # the first ran 90 s
            await record_ends(co, "a", [(first, JobState.COMPLETED, JobResult(exit_code=0), None)])
            await until(lambda: co.jobs.jobs[second].state is JobState.RUNNING)
            after = scrape(metrics)
            assert value(after, "gpuq_jobs_ended_total", state="completed") == 1
            assert value(after, "gpuq_jobs_ended_total", state="failed") == 0
            assert value(after, "gpuq_job_run_seconds_count", state="completed") == 1
            assert value(after, "gpuq_job_run_seconds_sum", state="completed") == 90
            # the second waited from its submission to now: 60 s
            assert value(after, "gpuq_job_queue_wait_seconds_count") == 7
            assert value(after, "gpuq_job_queue_wait_seconds_bucket", le="60.0") == 7
            assert value(after, "gpuq_job_queue_wait_seconds_bucket", le="30.0") == 6
            assert value(after, "gpuq_user_fairshare_usage_gpu_seconds", user="alice") == 90
            assert value(after, "gpuq_user_running_gpus", user="bob") == 1
            assert value(after, "gpuq_node_gpus_idle_allocated", node="a") == 0
        finally:
            await co.close()

    asyncio.run(main())


def test_pending_reasons_fall_in_bounded_categories() -> None:
    assert reason_category("begin time 2030-01-01 00:00:00 not reached") == "begin_time"
    assert reason_category("dependency: waiting for job 4 (afterok)") == "dependency"
    assert reason_category("dependency can never be met: job 4 failed (afterok)") == (
        "dependency_never_met"
    )
    assert reason_category("qos normal limit: at most 2 running jobs per user") == "qos_limit"
    assert reason_category("array limit: at most 2 tasks of array 7 run at once") == "array_limit"
    assert reason_category("constraint: no node has ib (features: none)") == "placement"
    assert reason_category("node b is down; node c has no agent connected") == ("nodes_unavailable")
    assert reason_category("needs 4 GPUs on one node; largest free block is 3") == "resources"
    behind = Waiting(("needs 4 GPUs on one node", "priority: 2 jobs of higher priority are"))
    assert main_reason(behind) == "priority"
    blocked = Waiting(("dependency: waiting for job 4 (afterok)", "needs 4 GPUs"))
    assert main_reason(blocked) == "dependency"
    assert main_reason(Waiting(("needs 4 GPUs",))) == "resources"
    assert main_reason(None) == "unknown"
    assert set(REASONS) >= {"resources", "priority", "dependency", "unknown"}


def test_only_get_and_head_of_slash_metrics_are_served(store: Store) -> None:
    async def main() -> None:
        metrics = Metrics(metric_sources(assemble(store, CoordinatorSettings())))
        for method, path, status in [
            ("GET", "/metrics", 200),
            ("HEAD", "/metrics", 200),
            ("POST", "/metrics", 405),
            ("GET", "/", 404),
            ("GET", "/metrics/x", 404),
        ]:
            answer = await metrics.handle(Request(method, path, {}, {}, b"", "p", False))
            assert answer.status == status, (method, path)
        answer = await metrics.handle(Request("GET", "/metrics", {}, {}, b"", "p", False))
        assert answer.content_type.startswith("text/plain; version=0.0.4")
        assert b"# HELP gpuq_jobs_submitted_total" in answer.body
        openmetrics = Request(
            "GET", "/metrics", {}, {"accept": "application/openmetrics-text"}, b"", "p", False
        )
        answer = await metrics.handle(openmetrics)
        assert answer.content_type.startswith("application/openmetrics-text")
        assert answer.body.endswith(b"# EOF\n")

    asyncio.run(main())


def exported_names(store: Store) -> set[str]:
    """Every series name a coordinator exports (with a node, a GPU and a user, so that the
    families that list them are there), as the registry names them."""

    async def main() -> set[str]:
        co = assemble(store, CoordinatorSettings())
        node = Node("a", UNITS[:1], 16, 64 * GiB, NodeState.UP)
        entry = NodeEntry(node, co.clock(), AgentSession("a"), heard=True, heard_at=co.steady())
        entry.usage = (pb.GpuUsage(uuid="GPU-a-0", memory_used=GiB, utilization=5),)
        co.nodes.nodes["a"] = entry
        co.inputs.usage = {"alice": (10.0, co.clock())}
        co.inputs.shares = {"alice": 0.5}
        metrics = Metrics(metric_sources(co))
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
        names: set[str] = set()
        for family in metrics.registry.collect():
            names |= {family.name, *(family.name + s for s in suffixes.get(family.type, []))}
        return names

    return asyncio.run(main())


def test_the_grafana_dashboard_uses_only_exported_metrics(store: Store) -> None:
    exported = exported_names(store)
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    expressions += [
        v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        for v in dashboard["templating"]["list"]
        if v.get("type") == "query"
    ]
    assert len(expressions) >= 12
    used = {name for expr in expressions for name in re.findall(r"\bgpuq_[a-z0-9_]+", expr)}
    assert used, expressions
    assert used <= exported, sorted(used - exported)
    # and every family exported is on it (a new metric gets a panel)
    families = {re.sub(r"_(bucket|sum|count|total|created)$", "", n) for n in exported}
    shown = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in used}
    assert families <= shown, sorted(families - shown)
    assert dashboard["__inputs"][0]["name"] == "DS_PROMETHEUS"
