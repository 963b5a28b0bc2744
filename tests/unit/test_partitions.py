"""Partitions (issue 25): `[partitions.NAME]` read and checked from the config file (one
ConfigError naming the key), and the pure rules: which partitions a node is in (names, SLURM
host ranges, shell patterns), what a submission to some partitions becomes (`admit`: unknown,
groups, max_time, default time and QOS, the default partition), and how the scheduler names
them in a waiting job's reason. Through the coordinator: tests/store/test_partitions_coordinator.py;
the command line: tests/e2e/test_partitions_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuq.config.loading import load_settings
from gpuq.config.settings import Settings
from gpuq.coordinator.metrics import reason_category
from gpuq.domain.node_constraints import Placement
from gpuq.domain.partitions import (
    Partition,
    admit,
    default_in,
    node_partitions,
    parse_partitions,
)
from gpuq.errors import ConfigError, InvalidInput, PermissionDenied
from gpuq.scheduler.fitting import NodeView, in_partition, placement_reason
from gpuq.submission import build_spec


def view(name: str, partitions: set[str]) -> NodeView:
    """A node without GPUs in `partitions` (all placement looks at)."""
    return NodeView(
        name, True, (), frozenset(), 8, 8, 1 << 30, 1 << 30, {}, partitions=frozenset(partitions)
    )


def load(tmp_path: Path, text: str) -> Settings:
    config = tmp_path / "config.toml"
    config.write_text(text)
    return load_settings(config, home=tmp_path / "home")


GOOD = """
[qos.normal]

[qos.debug]
priority = 10
max_time = 3600

[partitions.debug]
nodes = ["gpu01"]
max_time = "1:00:00"
default_time = "30"
qos = "debug"

[partitions.gpu]
nodes = ["gpu[02-04]", "big*"]
default = true
allow_groups = ["ml", "ml"]
"""


def test_partitions_are_read_in_order_with_slurm_times(tmp_path: Path) -> None:
    parts = load(tmp_path, GOOD).coordinator.partitions
    assert list(parts) == ["debug", "gpu"]
    assert parts["debug"] == Partition(
        "debug", ("gpu01",), default_time=1800, max_time=3600, qos="debug"
    )
    assert parts["gpu"] == Partition(
        "gpu", ("gpu[02-04]", "big*"), allow_groups=("ml",), default=True
    )
    assert load(tmp_path, "").coordinator.partitions == {}  # none: -p stays a node feature


BAD = [
    # (config text, key named in the message, words of the problem)
    ("[partitions.a]\ndefault = true", "[partitions.a] nodes", "missing"),
    ('[partitions.a]\nnodes = "gpu01"', "[partitions.a] nodes", "expected a list"),
    ("[partitions.a]\nnodes = []", "[partitions.a] nodes", "not empty"),
    ('[partitions.a]\nnodes = ["gpu[04-01]"]', "[partitions.a] nodes", "goes backwards"),
    ('[partitions.a]\nnodes = ["g[1-2]*"]', "[partitions.a] nodes", "no [...]"),
    ('[partitions.a]\nnodes = ["n"]\nmax_time = 60', "[partitions.a] max_time", "expected a time"),
    ('[partitions.a]\nnodes = ["n"]\nmax_time = "1:99"', "[partitions.a] max_time", "seconds"),
    (
        '[partitions.a]\nnodes = ["n"]\nmax_time = "1:00:00"\ndefault_time = "2:00:00"',
        "[partitions.a] default_time",
        "longer than this partition's max_time (01:00:00)",
    ),
    (
        '[partitions.a]\nnodes = ["n"]\nallow_groups = ["a b"]',
        "[partitions.a] allow_groups",
        "group",
    ),
    ('[partitions.a]\nnodes = ["n"]\nqos = "gold"', "[partitions.a] qos", "no such qos tier"),
    ('[partitions.a]\nnodes = ["n"]\nqueue = 1', "[partitions.a] queue", "unknown setting"),
    ('[partitions."a b"]\nnodes = ["n"]', "[partitions.a b]", "partition name"),
    ("partitions = 3", "[partitions]", "expected a table"),
    (
        '[partitions.a]\nnodes = ["n"]\ndefault = true\n'
        '[partitions.b]\nnodes = ["n"]\ndefault = true',
        "[partitions.b] default",
        "partition a is the default already",
    ),
]


@pytest.mark.parametrize(("text", "key", "problem"), BAD)
def test_a_bad_partition_is_one_error_naming_the_key(
    tmp_path: Path, text: str, key: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    message = str(caught.value)
    assert f": {key} = " in message and problem in message, message


def test_nodes_are_names_host_ranges_or_shell_patterns() -> None:
    parts = {
        "debug": Partition("debug", ("gpu01",)),
        "gpu": Partition("gpu", ("gpu[02-04,07]",), default=True),
        "big": Partition("big", ("big*", "gpu0?")),
    }
    assert node_partitions(parts, "gpu01") == ("debug", "big")
    assert node_partitions(parts, "gpu03") == ("gpu", "big")
    assert node_partitions(parts, "gpu05") == ("big",)
    assert node_partitions(parts, "gpu07") == ("gpu", "big")
    assert node_partitions(parts, "gpu10") == ()
    assert node_partitions(parts, "bigmem1") == ("big",)
    assert node_partitions(parts, "other") == ()
    assert default_in(parts, "gpu02") == "gpu" and default_in(parts, "gpu01") == ""


PARTS = {
    "debug": Partition("debug", ("n1",), default_time=600, max_time=3600, qos="debug"),
    "gpu": Partition("gpu", ("n2",), allow_groups=("ml",), default=True, default_time=7200),
    "cpu": Partition("cpu", ("n3",)),
}


def test_admit_checks_names_groups_and_times_and_fills_defaults() -> None:
    got = admit(PARTS, ("debug",), None, None, "alice", ())
    assert (got.partitions, got.time_limit, got.qos) == (("debug",), 600, "debug")
    got = admit(PARTS, ("debug", "cpu"), 1200, "high", "alice", ())
    assert (got.partitions, got.time_limit, got.qos) == (("debug", "cpu"), 1200, "high")
    got = admit(PARTS, (), None, None, "bob", ("ml", "users"))  # no -p: the default one
    assert (got.partitions, got.time_limit) == (("gpu",), 7200)
    without_default = {k: v for k, v in PARTS.items() if k != "gpu"}
    assert admit(without_default, (), 60, None, "bob", ()).partitions == ()  # anywhere

    # -p a,b keeps the partitions that take the job (SLURM's EnforcePartLimits=ANY)
    got = admit(PARTS, ("debug", "cpu"), 2 * 86400, None, "alice", ())
    assert (got.partitions, got.time_limit, got.qos) == (("cpu",), 2 * 86400, None)
    assert admit(PARTS, ("gpu", "debug"), None, None, "alice", ()).partitions == ("debug",)

    with pytest.raises(InvalidInput) as unknown:
        admit(PARTS, ("debug", "nope"), None, None, "alice", ())
    assert str(unknown.value) == "no partition nope; partitions: debug, gpu, cpu"
    with pytest.raises(InvalidInput) as long:
        admit(PARTS, ("debug",), 3 * 86400, None, "alice", ())
    assert str(long.value) == "--time 3-00:00:00 is over partition debug's max_time 01:00:00"
    with pytest.raises(PermissionDenied) as outside:
        admit(PARTS, ("gpu",), None, None, "alice", ("users", "alice"))
    assert str(outside.value) == "partition gpu is for groups ml: alice is in alice, users"
    with pytest.raises(PermissionDenied, match="partition gpu is for groups ml"):
        admit(PARTS, (), None, None, "alice", ())
    with pytest.raises(PermissionDenied, match="partition gpu is for groups ml"):
        admit(PARTS, ("gpu", "debug"), 86400, None, "alice", ())  # the first one's refusal


def test_dash_p_is_kept_as_partition_names() -> None:
    assert parse_partitions("debug, gpu,debug") == ("debug", "gpu")
    for bad in ("", ",", "a b", "a|b"):
        with pytest.raises(InvalidInput, match="--partition"):
            parse_partitions(bad)
    spec = build_spec(wrap="true", partition="debug,gpu", constraint="ib")
    assert spec.placement == Placement(constraint="ib", partitions=("debug", "gpu"))
    assert spec.placement.describe() == "partition debug,gpu; constraint ib"


def test_a_node_outside_the_jobs_partitions_is_ruled_out_and_reasons_name_them() -> None:
    debug = Placement(partitions=("debug",))
    assert debug.node_problem("n2", (), ("gpu",)) == "node n2 is not in partition debug"
    assert debug.node_problem("n1", (), ("debug", "gpu")) is None
    either = Placement(partitions=("debug", "gpu"))
    assert either.node_problem("n2", (), ("gpu",)) is None

    views = [view("n1", partitions={"debug"}), view("n2", partitions={"gpu"})]
    assert placement_reason(views, debug) is None
    nowhere = Placement(partitions=("cpu",))
    assert placement_reason(views, nowhere) == "partition cpu: no node is in it"
    excluded = Placement(exclude=("n1",), partitions=("debug",))
    assert placement_reason(views, excluded) == "partition debug: exclude: n1 leaves no node"

    said = in_partition(debug, "no node is up")
    assert said == "partition debug: no node is up"
    assert in_partition(Placement(), "no node is up") == "no node is up"
    assert reason_category(said) == "nodes_unavailable"
    assert reason_category("partition cpu: no node is in it") == "placement"
