"""Placement requests end to end, with real processes and fake GPUs: `--gpus h100:1` lands only
on an H100 of a mixed node (and waits, saying why, while it is busy, rather than take the
A100), --nodelist / --exclude, --constraint over `[agent] features` and GPU types, --partition,
and requests no node can ever meet refused at submit time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for

from gpuq.errors import Unsatisfiable


@pytest.fixture
def placed(tmp_path: Path) -> Iterator[Cluster]:
    """Node `mixed` (one H100 and one A100, features nvlink and ib) and node `plain` (two L4,
    feature debug, from its own config file)."""
    running = Cluster(tmp_path, config='[agent]\nfeatures = ["nvlink", "ib"]\n')
    try:
        running.start_coordinator()
        running.start_agent("mixed", "1xH100-80GB,1xA100-40GB")
        other = tmp_path / "plain.toml"
        text = (running.home / "config.toml").read_text()
        other.write_text(text.replace('features = ["nvlink", "ib"]', 'features = ["debug"]'))
        running.agents["plain"] = running._spawn(
            ["--config", str(other), "agent", "--node-name", "plain", "--fake-gpus", "2xL4-24GB"],
            "agent-plain",
        )
        running.wait_node("plain", "up")
        yield running
    finally:
        running.close()


def units_by_type(cluster: Cluster) -> dict[str, str]:
    """uuid -> NVML name, over every node."""
    return {g.uuid: g.name for n in cluster.client().nodes() for g in n.gpus}


def reasons(cluster: Cluster, job_id: int) -> str:
    job, _ = cluster.client().detail(job_id)
    return "; ".join(job.pending.reasons)


def test_a_typed_job_lands_only_on_its_type_and_waits_for_it(placed: Cluster) -> None:
    names = units_by_type(placed)
    first = placed.submit("sleep 30", gpus="h100:1")
    job = placed.wait_state(first, "running")
    assert job.node == "mixed"
    assert [names[u] for u in job.gpus] == ["NVIDIA H100 80GB HBM3"]

    second = placed.submit("true", gpus="h100:1")
    text = wait_for(lambda: reasons(placed, second), what="a pending reason")
    assert "needs 1 h100 GPU on one node" in text, text
    assert placed.job(second).state.value == "pending"  # the free A100 is not taken

    a100 = placed.wait_state(placed.submit("true", gpus="a100:1"), "completed")
    assert [names[u] for u in a100.gpus] == ["NVIDIA A100-SXM4-40GB"]

    placed.client().cancel(str(first))
    done = placed.wait_state(second, "completed")
    assert [names[u] for u in done.gpus] == ["NVIDIA H100 80GB HBM3"]


def test_nodelist_exclude_constraint_and_partition(placed: Cluster) -> None:
    def node_of(**options: str) -> str | None:
        return placed.wait_state(placed.submit("true", **options), "completed").node

    assert node_of(nodelist="plain") == "plain"
    assert node_of(nodelist="mixed,plain", exclude="mixed") == "plain"
    assert node_of(exclude="plain") == "mixed"
    assert node_of(constraint="nvlink&ib") == "mixed"
    assert node_of(constraint="debug|nope") == "plain"
    assert node_of(constraint="l4", gpus="1") == "plain"  # a GPU type is a feature
    assert node_of(partition="debug") == "plain"

    result = placed.gpuq("submit", "-w", "mixed", "-C", "ib", "--parsable", "--wrap", "true")
    assert result.returncode == 0, result.stderr
    assert placed.wait_state(int(result.stdout), "completed").node == "mixed"

    shown = placed.gpuq("show", result.stdout.strip())
    assert "Placement: nodelist mixed; constraint ib" in shown.stdout, shown.stdout
    listing = placed.gpuq("nodes")
    assert "mixed: types a100,h100, features nvlink,ib" in listing.stdout, listing.stdout
    assert "plain: types l4, features debug" in listing.stdout, listing.stdout
    features = {n.name: list(n.features) for n in placed.client().nodes()}
    assert features == {"mixed": ["nvlink", "ib"], "plain": ["debug"]}


def test_requests_no_node_can_meet_are_refused(placed: Cluster) -> None:
    with pytest.raises(Unsatisfiable, match="no node has v100 GPUs"):
        placed.submit("true", gpus="v100:1")
    with pytest.raises(Unsatisfiable, match="a100:2 can never run"):
        placed.submit("true", gpus="a100:2")
    with pytest.raises(Unsatisfiable, match="nodelist: n9 is not known"):
        placed.submit("true", nodelist="n9")
    with pytest.raises(Unsatisfiable, match="constraint: no node has nvlink&debug"):
        placed.submit("true", constraint="nvlink&debug")
    result = placed.gpuq("submit", "-p", "nope", "--wrap", "true")
    assert result.returncode == 2 and "no node has nope" in result.stderr, result.stderr
