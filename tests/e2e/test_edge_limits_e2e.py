"""Limits at the edge: the largest valid job (a 4 MiB script, a 1 MiB environment) travels
from the CLI to the coordinator to an agent and runs; several of them dispatched at once
reach the agent (split over messages). (That listings never carry scripts, so one user's
large scripts cannot make `gpuq queue` large for everyone, is tested at the front door in
process: tests/store/test_queue_semantics_coordinator.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster

from gpuq.domain.limits import MAX_ENV_BYTES, MAX_SCRIPT_BYTES


@pytest.fixture
def one_node(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path)
    try:
        running.start_coordinator()
        running.start_agent("a", "8xA100-80GB")
        yield running
    finally:
        running.close()


def big_script(folder: Path) -> Path:
    """A script of exactly MAX_SCRIPT_BYTES that prints the sizes of what it got."""
    body = 'echo "ok $GPUQ_JOB_ID ${#BIG0} ${#BIG7} $1"\n'
    head = "#!/bin/sh\n" + body
    padding = MAX_SCRIPT_BYTES - len(head)
    lines = "#" * 1023 + "\n"
    text = head + lines * (padding // 1024) + "#" * (padding % 1024)
    assert len(text.encode()) == MAX_SCRIPT_BYTES
    path = folder / "big.sh"
    path.write_text(text)
    return path


def big_environ(cluster: Cluster) -> dict[str, str]:
    """The cluster's environment and eight variables of 120 KiB: just under 1 MiB in all."""
    environ = dict(cluster.env)
    used = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in environ.items())
    room = MAX_ENV_BYTES - used - 8 * 8
    for i in range(8):
        environ[f"BIG{i}"] = "v" * min(120 << 10, room // 8)
    return environ


def test_the_largest_valid_jobs_run_and_several_reach_the_agent_at_once(
    one_node: Cluster,
) -> None:
    cluster = one_node
    script = big_script(cluster.root)
    environ = big_environ(cluster)
    first = cluster.client().submit(script, "x", environ=environ, chdir=str(cluster.root))
    assert cluster.wait_state(first, "completed", timeout=60).state.value == "completed"
    size = len(environ["BIG0"])
    assert (cluster.root / f"gpuq-{first}.out").read_text() == f"ok {first} {size} {size} x\n"
    # five at once (about 26 MiB of launches): one pass dispatches them all to one agent
    held = [
        cluster.client().submit(script, str(i), environ=environ, chdir=str(cluster.root), hold=True)
        for i in range(5)
    ]
    outcomes = cluster.client().release(*held)
    assert all(o.done for o in outcomes), outcomes
    for i, job_id in enumerate(held):
        assert cluster.wait_state(job_id, "completed", timeout=60).state.value == "completed"
        out = (cluster.root / f"gpuq-{job_id}.out").read_text()
        assert out == f"ok {job_id} {size} {size} {i}\n"
    assert cluster.agents["a"].poll() is None  # the agent's stream survived all of it
