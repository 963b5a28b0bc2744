"""An admin drains a GPU and resumes it with the real command line; `gpuq nodes` shows each
unit's kind and health; a drained GPU is never given out and the pending reason names it;
a drain survives a coordinator restart; MIG slices go only to jobs that ask for one."""

from __future__ import annotations

import json

import pytest
from e2e_cluster import Cluster, wait_for

pytestmark = pytest.mark.timeout(120)


def test_drain_resume_and_nodes_on_the_command_line(bare_cluster: Cluster) -> None:
    cluster = bare_cluster
    cluster.start_coordinator()
    cluster.start_agent("a", "2xA100-80GB")
    cluster.start_agent("m", "1xA100-80GB:mig=3g.40gb+3g.40gb")

    done = cluster.gpuq("drain", "a:1", "--reason", "fan")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "node a GPU 1 drained: fan"

    for args in (("drain", "nope", "--reason", "x"), ("drain", "a:7", "--reason", "x")):
        refused = cluster.gpuq(*args)
        assert refused.returncode == 2, (args, refused.stdout, refused.stderr)
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "no node nope" in cluster.gpuq("resume", "nope").stderr
    assert "node a has no GPU 7" in cluster.gpuq("drain", "a:7", "--reason", "x").stderr

    nodes = {n["name"]: n for n in json.loads(cluster.gpuq("nodes", "--json").stdout)}
    a, m = nodes["a"], nodes["m"]
    assert [(g["index"], g["kind"], g["health"]) for g in a["gpus"]] == [
        (0, "GPU", "ok"),
        (1, "GPU", "drained"),
    ]
    assert a["gpus"][1]["health_reason"] == "drained by admin: fan"
    assert a["gpus"][1]["drained_by"]
    assert [g["kind"] for g in m["gpus"]] == ["MIG 3g.40gb", "MIG 3g.40gb"]
    for node in (a, m):
        for unit in node["gpus"]:
            assert unit["utilization"] is None or isinstance(unit["utilization"], int)
    text = cluster.gpuq("nodes").stdout
    assert "drained by admin: fan (" in text, text
    assert "MIG 3g.40gb" in text, text

    # --gpus 2: never the slices of m, never the drained GPU of a: it waits, naming the drain
    pair = cluster.submit("echo pair", gpus=2)

    def reasons() -> list[str]:
        (job,) = cluster.client().list_raw(job_ids=[pair])
        assert job.state == "pending", (job.state, job.reason)
        return list(job.pending.reasons)

    named = wait_for(lambda: [r for r in reasons() if "GPU 1 drained by admin: fan" in r], 15)
    assert named, reasons()
    status = cluster.gpuq("status").stdout
    assert "drained by admin: fan" in status, status

    # the drain is in the store: a restarted coordinator keeps it
    cluster.kill(cluster.coordinator)
    cluster.start_coordinator()
    cluster.wait_node("a", "up", timeout=40)
    (node_a,) = [n for n in cluster.client().nodes() if n.name == "a"]
    assert [h.health for h in node_a.health] == ["ok", "drained"]
    assert cluster.job(pair).state.value == "pending"

    resumed = cluster.gpuq("resume", "a:1")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "node a GPU 1 resumed"
    job = cluster.wait_state(pair, "completed")
    assert job.node == "a" and len(job.gpus) == 2

    # one MIG slice: only for a job that asks for it, and it gets exactly one
    sliced = cluster.submit("echo slice", mig="3g.40gb")
    job = cluster.wait_state(sliced, "completed")
    assert job.node == "m" and len(job.gpus) == 1
    shown = cluster.gpuq("show", str(sliced)).stdout
    assert "1 MIG 3g.40gb slice" in shown, shown
    refused = cluster.gpuq("submit", "--mig", "3g.40gb", "--gpus", "2", "--wrap", "true")
    assert refused.returncode == 2
    assert "a job sees one MIG slice" in refused.stderr
    never = cluster.gpuq("submit", "--mig", "7g.80gb", "--wrap", "true")
    assert never.returncode == 2 and "no node has a MIG 7g.80gb slice" in never.stderr
