"""How multi-node jobs look (issue 22): `gpuq queue`, `status`, `history`, `show` and their
--json, for a job built by hand and sent through the wire's conversion, as the CLI gets it.
A one-node job prints as it always did."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

from gpuq.cli import listings, render
from gpuq.cli.job_verbs import show
from gpuq.convert import job_to_proto
from gpuq.domain.model import Job, JobSpec, Resources
from gpuq.domain.states import JobState
from gpuq.v1 import queue_pb2

G = 1 << 30


def wire_job(job_id: int, res: Resources, nodes: tuple[str, ...] = (), node: str = "gpu01") -> Any:
    job = Job(
        id=job_id,
        spec=JobSpec(name=f"j{job_id}", script="#!/bin/sh\ntrue\n", workdir="/w", resources=res),
        user="alice",
        state=JobState.RUNNING,
        qos="normal",
        priority=1,
        submit_time=1.0,
        start_time=2.0,
        node=node,
        nodes=nodes,
        gpus=tuple(f"GPU-{job_id}-{i}" for i in range(res.total_gpus)),
    )
    return job_to_proto(job, "/w/out", "/w/out")


MULTI = Resources(
    gpus=4,
    gpu_type="a100",
    cpus=24,
    nodes=2,
    tasks_per_node=4,
    gpus_per_task=1,
    mem_all=True,
    exclusive=True,
    explicit_tasks=True,
)
ONE = Resources(gpus=2, cpus=4, mem=40 * G)


class FakeClient:
    def __init__(self, jobs: list[Any]) -> None:
        self.jobs = jobs

    def list_raw(self, **_: Any) -> list[Any]:
        return self.jobs

    def nodes(self) -> list[Any]:
        return []

    def detail_reply(self, job_id: str, diagnose: bool = False) -> Any:
        return queue_pb2.JobDetail(job=next(j for j in self.jobs if str(j.id) == job_id))

    def detail_from(self, reply: Any) -> tuple[Any, list[Any]]:
        return reply.job, []


class Obj:
    def __init__(self, jobs: list[Any]) -> None:
        self._client = FakeClient(jobs)

    def client(self) -> FakeClient:
        return self._client


def run(command: Any, args: list[str], jobs: list[Any]) -> str:
    result = CliRunner().invoke(command, args, obj=Obj(jobs), env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_queue_shows_the_compressed_node_list_and_all_the_gpus() -> None:
    jobs = [wire_job(7, MULTI, ("gpu01", "gpu02")), wire_job(8, ONE, node="gpu03")]
    out = run(listings.queue, [], jobs).splitlines()
    multi = next(line for line in out if line.lstrip().startswith("7 "))
    one = next(line for line in out if line.lstrip().startswith("8 "))
    assert multi.split()[-1] == "gpu[01-02]" and "a100:8" in multi.split()
    assert one.split()[-1] == "gpu03" and "2" in one.split()
    fields = run(listings.queue, ["--format", "%i %D %N %C %b"], jobs).splitlines()
    assert fields[1].split() == ["7", "2", "gpu[01-02]", "48", "gpu:a100:4"]
    assert fields[2].split() == ["8", "1", "gpu03", "4", "gpu:2"]


def test_queue_and_show_json_carry_the_layout() -> None:
    jobs = [wire_job(7, MULTI, ("gpu01", "gpu02")), wire_job(8, ONE, node="gpu03")]
    multi, one = json.loads(run(listings.queue, ["--json"], jobs))
    assert {k: multi[k] for k in LAYOUT_KEYS} == {
        "gpus": 8,
        "nodes": ["gpu01", "gpu02"],
        "num_nodes": 2,
        "tasks_per_node": 4,
        "gpus_per_node": 4,
        "gpus_per_task": 1,
        "cpus_per_task": 6,
        "exclusive": True,
        "mem_all": True,
        "node": "gpu01",
    }
    assert {k: one[k] for k in LAYOUT_KEYS} == {
        "gpus": 2,
        "nodes": ["gpu03"],
        "num_nodes": 1,
        "tasks_per_node": 1,
        "gpus_per_node": 2,
        "gpus_per_task": None,
        "cpus_per_task": 4,
        "exclusive": False,
        "mem_all": False,
        "node": "gpu03",
    }
    shown = json.loads(run(show, ["7", "--json"], jobs))
    assert shown["nodes"] == ["gpu01", "gpu02"] and shown["gpus"] == 8
    assert shown["spec"]["resources"]["nodes"] == 2


LAYOUT_KEYS = (
    "gpus",
    "nodes",
    "num_nodes",
    "tasks_per_node",
    "gpus_per_node",
    "gpus_per_task",
    "cpus_per_task",
    "exclusive",
    "mem_all",
    "node",
)


def test_show_says_where_and_what_each_node_gives() -> None:
    jobs = [wire_job(7, MULTI, ("gpu01", "gpu02")), wire_job(8, ONE, node="gpu03")]
    text = run(show, ["7"], jobs)
    lines = {
        k.strip(): v.strip()
        for k, _, v in (line.partition(": ") for line in text.splitlines())
        if v
    }
    assert lines["Nodes"] == "gpu[01-02], 2 nodes; the script runs on gpu01"
    assert lines["Per node"] == (
        "4 tasks (8 in all), 4 a100 GPUs (1 per task), 8 in all, 6 CPUs per task (24 in all), "
        "all of its memory, the whole node (exclusive)"
    )
    assert lines["Resources"].startswith("per node: a100: 4 GPUs, 24 CPUs, mem all")
    assert lines["Node"] == "gpu[01-02]"
    assert "8 GPUs" in lines["Efficiency"]
    one = run(show, ["8"], jobs)
    assert "Nodes" not in one and "Per node" not in one and "Layout" not in one
    assert "     Resources: 2 GPUs, 4 CPUs, mem 40G, time qos default" in one
    assert "          Node: gpu03" in one


def test_one_node_tasks_get_a_layout_line() -> None:
    res = Resources(gpus=8, cpus=32, tasks_per_node=8, gpus_per_task=1, explicit_tasks=True)
    text = run(show, ["9"], [wire_job(9, res)])
    assert "Layout: 8 tasks, 8 GPUs (1 per task), 4 CPUs per task (32 in all), mem -" in text


def test_history_and_status_name_every_node() -> None:
    ended = wire_job(7, MULTI, ("gpu01", "gpu02"))
    ended.state, ended.end_time = "completed", 3.0
    assert "gpu[01-02]" in run(listings.history, [], [ended])
    running = wire_job(7, MULTI, ("gpu01", "gpu02"))
    assert render.job_reason(running) == "gpu[01-02]"
    pending = wire_job(7, MULTI)
    pending.state, pending.node = "pending", ""
    assert render.node_text(pending) == "" and render.job_dict(pending)["nodes"] == []
