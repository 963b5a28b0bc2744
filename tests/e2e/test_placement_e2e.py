"""Placement at the command line, with real processes and fake GPUs: `--gpus h100:1`, `-w` and
`-C` reach the coordinator, a node's features come from its agent's `[agent] features`, and
`gpuq show` and `gpuq nodes` print them; a request no node can meet exits 2. Where jobs land
and why they wait (types, --nodelist, --exclude, --constraint, --partition, MPS shares), and
what is refused at submit, is tested in process: tests/store/test_placement_coordinator.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster


@pytest.fixture
def placed(tmp_path: Path) -> Iterator[Cluster]:
    """Node `mixed`: one H100 and one A100, features nvlink and ib from its config."""
    running = Cluster(tmp_path, config='[agent]\nfeatures = ["nvlink", "ib"]\n')
    try:
        running.start_coordinator()
        running.start_agent("mixed", "1xH100-80GB,1xA100-40GB")
        yield running
    finally:
        running.close()


def test_placement_flags_reach_the_coordinator_and_are_shown(placed: Cluster) -> None:
    names = {g.uuid: g.name for n in placed.client().nodes() for g in n.gpus}
    typed = placed.gpuq("submit", "--gpus", "h100:1", "--parsable", "--wrap", "true")
    assert typed.returncode == 0, typed.stderr
    job = placed.wait_state(int(typed.stdout), "completed")
    assert [names[u] for u in job.gpus] == ["NVIDIA H100 80GB HBM3"]

    result = placed.gpuq("submit", "-w", "mixed", "-C", "ib", "--parsable", "--wrap", "true")
    assert result.returncode == 0, result.stderr
    assert placed.wait_state(int(result.stdout), "completed").node == "mixed"
    shown = placed.gpuq("show", result.stdout.strip())
    assert "Placement: nodelist mixed; constraint ib" in shown.stdout, shown.stdout
    listing = placed.gpuq("nodes")
    assert "mixed: types a100,h100, features nvlink,ib" in listing.stdout, listing.stdout
    features = {n.name: list(n.features) for n in placed.client().nodes()}
    assert features == {"mixed": ["nvlink", "ib"]}

    # without [partitions.NAME], -p is a node feature, as it always was (issue 25)
    result = placed.gpuq("submit", "-p", "nope", "--wrap", "true")
    assert result.returncode == 2 and "no node has nope" in result.stderr, result.stderr
    result = placed.gpuq("submit", "-p", "ib", "--parsable", "--wrap", "true")
    assert placed.wait_state(int(result.stdout), "completed").node == "mixed"
    assert "PARTITION" not in placed.gpuq("nodes").stdout
    assert "PARTITION" not in placed.gpuq("queue").stdout
