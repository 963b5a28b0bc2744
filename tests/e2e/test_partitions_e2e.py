"""Partitions at the command line (issue 25), with real processes and fake GPUs: a config
with `[partitions.debug]` (one node) and `[partitions.gpu]` runs `#SBATCH -p debug` on the
debug node, refuses `-p nope` with the line naming the partitions, `--time` over a
partition's max_time and a partition for groups the user is not in (exit 2), runs `-p
debug,gpu` on either, and shows partitions in `gpuq show`, `gpuq queue`, `gpuq nodes` and
their --json. Without partitions, `-p` is the node feature it always was:
tests/e2e/test_placement_e2e.py. Where jobs wait and why, and restarts:
tests/store/test_partitions_coordinator.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster

CONFIG = """
[partitions.debug]
nodes = ["dbg1"]
max_time = "1:00:00"
default_time = "10"

[partitions.gpu]
nodes = ["gpu[01-02]"]
default = true

[partitions.closed]
nodes = ["gpu*"]
allow_groups = ["no-such-group-gpuq"]
"""


@pytest.fixture
def parted(tmp_path: Path) -> Iterator[Cluster]:
    """Nodes dbg1 (partition debug) and gpu01 (gpu, the default, and closed)."""
    running = Cluster(tmp_path, config=CONFIG)
    try:
        running.start_coordinator()
        running.start_agent("dbg1", "1xL4-24GB")
        running.start_agent("gpu01", "1xL4-24GB")
        yield running
    finally:
        running.close()


def test_partitions_place_refuse_and_show(parted: Cluster, tmp_path: Path) -> None:
    script = tmp_path / "debug.sh"
    script.write_text("#!/bin/sh\n#SBATCH -p debug\ntrue\n")
    submitted = parted.gpuq("submit", "--parsable", str(script))
    assert submitted.returncode == 0, submitted.stderr
    job = parted.wait_state(int(submitted.stdout), "completed")
    assert job.node == "dbg1" and job.spec.resources.time_limit == 600  # its default_time
    shown = parted.gpuq("show", submitted.stdout.strip())
    assert "Placement: partition debug" in shown.stdout, shown.stdout

    plain = parted.gpuq("submit", "--parsable", "--wrap", "true")  # the default partition
    assert parted.wait_state(int(plain.stdout), "completed").node == "gpu01"
    either = parted.gpuq("submit", "--parsable", "-p", "debug,gpu", "--wrap", "true")
    assert parted.wait_state(int(either.stdout), "completed").node in ("dbg1", "gpu01")

    nope = parted.gpuq("submit", "-p", "nope", "--wrap", "true")
    assert nope.returncode == 2, nope.stderr
    assert "no partition nope; partitions: debug, gpu, closed" in nope.stderr, nope.stderr
    long = parted.gpuq("submit", "-p", "debug", "-t", "3-00:00:00", "--wrap", "true")
    assert long.returncode == 2, long.stderr
    assert "--time 3-00:00:00 is over partition debug's max_time 01:00:00" in long.stderr
    closed = parted.gpuq("submit", "-p", "closed", "--wrap", "true")
    assert closed.returncode == 2, closed.stderr
    assert "partition closed is for groups no-such-group-gpuq: " in closed.stderr

    held = parted.gpuq("submit", "--parsable", "--hold", "-p", "debug", "--wrap", "true")
    queue = parted.gpuq("queue")
    header, row = queue.stdout.splitlines()[0], queue.stdout.splitlines()[1]
    assert "PARTITION" in header.split() and "debug" in row.split(), queue.stdout
    listed = json.loads(parted.gpuq("queue", "--json").stdout)
    assert [j["partitions"] for j in listed] == [["debug"]], listed
    assert held.stdout.strip() == str(listed[0]["id"])

    nodes = parted.gpuq("nodes")
    rows = {line.split()[0]: line.split() for line in nodes.stdout.splitlines()[1:3]}
    assert "PARTITION" in nodes.stdout.splitlines()[0], nodes.stdout
    assert "debug" in rows["dbg1"] and "gpu*,closed" in rows["gpu01"], nodes.stdout
    found = {n["name"]: n for n in json.loads(parted.gpuq("nodes", "--json").stdout)}
    assert found["gpu01"]["partitions"] == ["gpu", "closed"]
    assert found["gpu01"]["default_partition"] == "gpu"
    assert found["dbg1"]["default_partition"] is None


def test_slurms_commands_show_the_partitions(parted: Cluster, tmp_path: Path) -> None:
    """squeue's %P, sinfo's %P (the default marked `*`) and -p filters, through the shims."""
    import os
    import subprocess

    made = parted.gpuq("slurm-shims", str(tmp_path / "bin"))
    assert made.returncode == 0, made.stderr
    env = {**parted.env, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}

    def call(*argv: str) -> str:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    held = parted.gpuq("submit", "--parsable", "--hold", "-p", "debug", "--wrap", "true")
    job = held.stdout.strip()
    assert call("squeue", "-h", "-o", "%i %P").split() == [job, "debug"]
    assert call("squeue", "-h", "-p", "gpu", "-o", "%i").strip() == ""
    assert call("squeue", "-h", "-p", "gpu,debug", "-o", "%i").strip() == job
    rows = dict(line.split() for line in call("sinfo", "-N", "-h", "-o", "%N %P").splitlines())
    assert rows == {"dbg1": "debug", "gpu01": "gpu*,closed"}, rows
    assert call("sinfo", "-N", "-h", "-p", "debug", "-o", "%N").split() == ["dbg1"]
    assert call("scontrol", "show", "job", job).count("Partition=debug") == 1
