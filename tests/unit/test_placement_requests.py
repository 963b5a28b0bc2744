"""Placement requests: GPU types from NVML names (`--gpus a100:2`), --nodelist / --exclude
(node ranges), --constraint and --partition over node features, and how the scheduler honours
them (placing, waiting with a reason, never-fits, preemption, reservations, arrays). Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest
from scheduling import POLICY, run, wait

from gpuq.config.loading import load_settings
from gpuq.domain.gpu_types import gpu_type, parse_gpu_request
from gpuq.domain.model import GpuUnit, Resources
from gpuq.domain.node_constraints import (
    MAX_PLACEMENT_NODES,
    Placement,
    constraint_matches,
    expand_nodes,
    with_partitions,
)
from gpuq.errors import ConfigError, InvalidInput
from gpuq.scheduler.array_split import room_for
from gpuq.scheduler.fit_keys import fit_key
from gpuq.scheduler.fitting import NodeView, kind_fits, never_fits, never_fits_reason
from gpuq.scheduler.plan import plan
from gpuq.scheduler.reserve import FreeNode, estimate_starts
from gpuq.scheduler.snapshot import PendingJob
from gpuq.submission import build_spec

GiB = 1 << 30

# (NVML's name, as nvmlDeviceGetName returns it) -> the type people type
NVML_NAMES = [
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100-SXM4-40GB", "a100"),
    ("NVIDIA A100-PCIE-40GB", "a100"),
    ("NVIDIA A100 80GB PCIe", "a100"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA H100 NVL", "h100"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", "h200"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA L40", "l40"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA A10G", "a10g"),
    ("NVIDIA A40", "a40"),
    ("NVIDIA A30", "a30"),
    ("Tesla T4", "t4"),
    ("Tesla V100-SXM2-32GB", "v100"),
    ("Tesla V100-PCIE-16GB", "v100"),
    ("Tesla P100-PCIE-16GB", "p100"),
    ("NVIDIA RTX A6000", "a6000"),
    ("NVIDIA RTX A5000", "a5000"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx6000ada"),
    ("NVIDIA RTX 4000 SFF Ada Generation", "rtx4000ada"),
    ("Quadro RTX 8000", "rtx8000"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA GeForce RTX 3090 Ti", "rtx3090ti"),
    ("NVIDIA TITAN RTX", "titanrtx"),
    # MIG slices have their GPU's type (with or without a compute-instance prefix)
    ("NVIDIA H200 MIG 3g.71gb", "h200"),
    ("NVIDIA H200 MIG 1c.3g.71gb", "h200"),
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "a100"),
    # unknown: a sane lower-case token
    ("NVIDIA Foo Bar 9", "foobar9"),
    ("Some GPU!", "some"),
    ("", "unknown"),
    ("!!!", "unknown"),
]


@pytest.mark.parametrize(("name", "expected"), NVML_NAMES)
def test_nvml_names_normalise_to_types(name: str, expected: str) -> None:
    assert gpu_type(name) == expected


def test_the_fake_backends_models_have_the_types_people_type() -> None:
    from gpuq.agent.fake.gpu_backend import parse_fake_spec

    inventory = parse_fake_spec("1xH100-80GB,1xA100-40GB,1xL4-24GB,1xRTX4090-24GB", "n")
    assert [gpu_type(u.name) for u in inventory.units] == ["h100", "a100", "l4", "rtx4090"]
    sliced = parse_fake_spec("1xH200-141GB:mig=3g.71gb+2g.35gb", "n")
    assert {gpu_type(u.name) for u in sliced.units} == {"h200"}


def test_gpu_requests_parse_as_type_and_count() -> None:
    assert parse_gpu_request("2") == (None, 2)
    assert parse_gpu_request("a100:2") == ("a100", 2)
    assert parse_gpu_request("A100:1") == ("a100", 1)
    assert parse_gpu_request("a100-sxm4-80gb:1") == ("a100", 1)
    assert parse_gpu_request("rtx-a6000:4") == ("a6000", 4)
    assert parse_gpu_request("a100") == ("a100", 1)  # a type alone is one, as in SLURM
    assert parse_gpu_request("H100-80GB") == ("h100", 1)
    for bad in ("", "a100:", ":2", "a1@0:2", "a100:x", "a:b:2", "a100:1234567"):
        with pytest.raises(InvalidInput, match="--gpus"):
            parse_gpu_request(bad)


def test_submit_options_and_directives_carry_types_and_placement(tmp_path: Path) -> None:
    notes: list[str] = []
    spec = build_spec(
        wrap="true",
        gpus="H100:2",
        nodelist="n[1-3]",
        exclude="n2",
        constraint="nvlink|ib",
        partition="debug",
        warnings=notes,
    )
    assert (spec.resources.gpu_type, spec.resources.gpus) == ("h100", 2)
    # -p is kept as partitions: the coordinator reads them against its [partitions.NAME], or
    # as node features where it has none (tests/store/test_placement_coordinator.py)
    assert spec.placement == Placement(("n1", "n2", "n3"), ("n2",), "nvlink|ib", ("debug",))
    assert notes == []
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/sh\n#SBATCH --gres=gpu:l4:3 -w a1 -x a2 -C ib -p gpu\n#GPUQ --gpus a100:2 -w b1\n"
    )
    spec = build_spec(str(script), warnings=notes)
    assert (spec.resources.gpu_type, spec.resources.gpus) == ("a100", 2)  # #GPUQ wins
    assert spec.placement == Placement(("b1",), ("a2",), "ib", ("gpu",))
    assert notes == []
    typed = build_spec(wrap="true", gpus="a100-80gb:1", mig="3g.40gb", warnings=notes)
    assert (typed.resources.gpu_type, typed.resources.mig) == ("a100", "3g.40gb")
    assert "the GPU type is a100" in notes[0] and "--gpu-mem" in notes[0]
    assert build_spec(wrap="true", gpus="a100").resources.gpus == 1
    with pytest.raises(InvalidInput, match="a GPU type needs a GPU count"):
        build_spec(wrap="true", gpus="a100:0")


def test_node_ranges_expand_as_slurm_writes_them() -> None:
    assert expand_nodes("n1,n2") == ("n1", "n2")
    assert expand_nodes("n[1-4,7]") == ("n1", "n2", "n3", "n4", "n7")
    assert expand_nodes("gpu[08-10],x") == ("gpu08", "gpu09", "gpu10", "x")
    assert expand_nodes("r[1-2]n[1-2]") == ("r1n1", "r1n2", "r2n1", "r2n2")
    assert expand_nodes("n1,n1, n2") == ("n1", "n2")
    assert len(expand_nodes(f"n[1-{MAX_PLACEMENT_NODES}]")) == MAX_PLACEMENT_NODES
    for bad, problem in [
        ("n[4-1]", "goes backwards"),
        ("n[1-2", "brackets do not match"),
        ("n[a-b]", "expected a range"),
        (f"n[1-{MAX_PLACEMENT_NODES + 1}]", "more than"),
        ("n[1-40]m[1-40]", "more than"),
        ("/etc/hosts", "not a file"),
        ("n 1", "not a node name"),
        (",", "expected node names"),
    ]:
        with pytest.raises(InvalidInput, match=problem):
            expand_nodes(bad)


def test_constraints_match_features_all_or_any() -> None:
    assert constraint_matches(None, [])
    assert constraint_matches("nvlink", ["nvlink", "ib"])
    assert constraint_matches("nvlink&ib", ["ib", "nvlink"])
    assert not constraint_matches("nvlink&ib", ["nvlink"])
    assert constraint_matches("a|b", ["b"])
    assert constraint_matches("a&b|c", ["c"])  # & binds tighter
    assert not constraint_matches("a&b|c", ["a"])
    assert constraint_matches("NVLink", ["nvlink"])  # case does not matter
    assert with_partitions(None, "gpu") == "gpu"
    assert with_partitions("a|b", "p,q") == "a&p|a&q|b&p|b&q"
    with pytest.raises(InvalidInput, match="--partition"):
        with_partitions(None, "a b")
    with pytest.raises(InvalidInput, match="--constraint"):
        Placement(constraint="a&&b")


def test_agent_features_in_the_config(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[agent]\nfeatures = ["nvlink", "ib", "debug", "ib"]\n')
    assert load_settings(config, home=tmp_path).agent.features == ("nvlink", "ib", "debug")
    for bad in ('"nvlink"', '["nv link"]', "[1]", "[" + ", ".join(['"f"'] * 65) + "]"):
        config.write_text(f"[agent]\nfeatures = {bad}\n")
        with pytest.raises(ConfigError, match=r"\[agent\] features"):
            load_settings(config, home=tmp_path)


# ---- the scheduler ---------------------------------------------------------------------------


def unit(node: str, index: int, name: str, memory: int = 80 * GiB) -> GpuUnit:
    return GpuUnit(f"GPU-{node}-{index}", index, name, memory, f"0000:{index:02x}:00.0")


def node(
    name: str,
    models: Iterable[str],
    features: Iterable[str] | None = (),
    busy: Iterable[int] = (),
    up: bool = True,
) -> NodeView:
    units = tuple(unit(name, i, model) for i, model in enumerate(models))
    taken = {f"GPU-{name}-{i}" for i in busy}
    return NodeView(
        name=name,
        up=up,
        units=units,
        free_units=frozenset(u.uuid for u in units) - taken,
        cpus=64,
        cpus_free=64,
        mem=512 * GiB,
        mem_free=512 * GiB,
        distances={},
        features=None if features is None else frozenset(features),
    )


H100, A100, L4 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L4"


def typed(job_id: int, kind: str | None, gpus: int = 1) -> PendingJob:
    return replace(wait(job_id, gpus=gpus), need=Resources(gpus=gpus, gpu_type=kind))


def test_a_typed_job_takes_only_units_of_its_type_on_a_mixed_node() -> None:
    mixed = node("m", [A100, H100, A100])
    decided = plan([mixed], [], [typed(1, "h100")], POLICY, now=0.0)
    assert [(s.node, s.gpus) for s in decided.starts] == [("m", ("GPU-m-1",))]
    assert [u.uuid for u in kind_fits(mixed.units, Resources(gpus=1, gpu_type="a100"))] == [
        "GPU-m-0",
        "GPU-m-2",
    ]


def test_a_typed_job_waits_for_its_type_and_says_so() -> None:
    mixed = node("m", [A100, H100, A100], busy=[1])
    holder = run(9, "m", [1])
    decided = plan([mixed], [holder], [typed(1, "h100"), typed(2, None)], POLICY, now=0.0)
    assert [(s.job_id, s.gpus) for s in decided.starts] == [(2, ("GPU-m-0",))]
    reasons = decided.waiting[1].reasons
    assert reasons == ("needs 1 h100 GPU on one node; largest free block is 0 (node m)",)


def test_a_type_no_node_has_never_fits_and_says_which_types_there_are() -> None:
    nodes = [node("a", [A100, A100]), node("b", [L4])]
    need = Resources(gpus=1, gpu_type="h100")
    assert all(never_fits(n, need) for n in nodes)
    assert never_fits_reason(nodes, need) == (
        "--gpus h100:1 can never run: no node has h100 GPUs (types: a100, l4)"
    )
    two = Resources(gpus=3, gpu_type="a100")
    assert never_fits_reason(nodes, two) == (
        "--gpus a100:3 can never run: the largest node (a) has 2 a100 GPUs"
    )
    decided = plan(nodes, [], [typed(1, "h100")], POLICY, now=0.0)
    assert "no node has h100 GPUs" in decided.waiting[1].reasons[0]


def test_a_type_combines_with_a_mig_slice() -> None:
    sliced = NodeView(
        name="s",
        up=True,
        units=(
            GpuUnit(
                "MIG-a", 0, "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20 * GiB, "", "GPU-a", "3g.20gb"
            ),
            GpuUnit(
                "MIG-h", 1, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40 * GiB, "", "GPU-h", "3g.40gb"
            ),
        ),
        free_units=frozenset({"MIG-a", "MIG-h"}),
        cpus=8,
        cpus_free=8,
        mem=64 * GiB,
        mem_free=64 * GiB,
        distances={},
    )
    job = replace(wait(1), need=Resources(gpus=1, mig="3g.40gb", gpu_type="h100"))
    assert [(s.gpus) for s in plan([sliced], [], [job], POLICY, 0.0).starts] == [("MIG-h",)]
    wrong = replace(wait(2), need=Resources(gpus=1, mig="3g.40gb", gpu_type="a100"))
    assert never_fits(sliced, wrong.need)


def placed(job_id: int, placement: Placement, gpus: int = 1, kind: str | None = None) -> PendingJob:
    job = wait(job_id, gpus=gpus, placement=placement)
    return replace(job, need=Resources(gpus=gpus, gpu_type=kind)) if kind else job


def test_nodelist_and_exclude_choose_the_node() -> None:
    nodes = [node("n1", [A100]), node("n2", [A100, A100]), node("n3", [A100])]
    queue = [
        placed(1, Placement(nodelist=("n3",))),
        placed(2, Placement(exclude=("n1", "n3"))),
        placed(3, Placement(nodelist=("n1", "n2"), exclude=("n2",))),
    ]
    decided = plan(nodes, [], queue, POLICY, now=0.0)
    assert sorted((s.job_id, s.node) for s in decided.starts) == [(1, "n3"), (2, "n2"), (3, "n1")]


def test_a_nodelist_waits_for_its_node_and_never_takes_another() -> None:
    nodes = [node("n1", [A100], busy=[0]), node("n2", [A100])]
    decided = plan(
        nodes, [run(9, "n1", [0])], [placed(1, Placement(nodelist=("n1",)))], POLICY, 0.0
    )
    assert decided.starts == ()
    assert decided.waiting[1].reasons == (
        "needs 1 GPU on one node; largest free block is 0 (node n1)",
    )
    # the reservation is on n1 too: a job on n2 may backfill
    later = plan(
        nodes,
        [run(9, "n1", [0])],
        [placed(1, Placement(nodelist=("n1",))), wait(2)],
        POLICY,
        0.0,
        explain=True,
    )
    assert [(s.job_id, s.node) for s in later.starts] == [(2, "n2")]
    assert later.waiting[1].estimated_start == 3600.0


def test_placement_reasons_name_the_cause() -> None:
    nodes = [node("n1", [A100], ["ib"]), node("n2", [H100], ["nvlink"])]

    def reasons(placement: Placement, kind: str | None = None) -> tuple[str, ...]:
        return plan(nodes, [], [placed(1, placement, kind=kind)], POLICY, 0.0).waiting[1].reasons

    assert reasons(Placement(nodelist=("n9",))) == ("nodelist: n9 is not known",)
    assert reasons(Placement(nodelist=("n1",), exclude=("n1",))) == (
        "nodelist: every node of n1 is excluded",
    )
    assert reasons(Placement(exclude=("n1", "n2"))) == ("exclude: n1,n2 leaves no node",)
    assert reasons(Placement(constraint="nvlink&ib")) == (
        "constraint: no node has nvlink&ib (features: a100, h100, ib, nvlink)",
    )
    assert reasons(Placement(constraint="ib"), kind="h100") == (
        "no node that is up can ever run it (--gpus h100:1 can never run: no node that "
        "--nodelist/--exclude/--constraint allow has h100 GPUs (types: a100))",
    )


def test_constraints_match_features_and_gpu_types() -> None:
    nodes = [node("n1", [A100], ["ib"]), node("n2", [H100], ["nvlink", "ib"])]
    queue = [
        placed(1, Placement(constraint="nvlink&ib")),
        placed(2, Placement(constraint="a100")),  # a GPU type is a feature
        placed(3, Placement(constraint="debug|h100")),
    ]
    decided = plan(nodes, [], queue, POLICY, now=0.0)
    assert sorted((s.job_id, s.node) for s in decided.starts) == [(1, "n2"), (2, "n1")]
    assert decided.waiting[3].reasons == (
        "needs 1 GPU on one node; largest free block is 0 (node n2)",
    )


def test_never_fits_with_placement_spares_nodes_whose_features_are_not_known_yet() -> None:
    """After a coordinator restart, a node that has not registered yet has no known features:
    a constraint must not make submissions fail because of it."""
    fresh = node("n1", [A100], features=None, up=False)
    need = Resources(gpus=1)
    assert not never_fits(fresh, need, Placement(constraint="nvlink"))
    known = node("n1", [A100], features=["ib"])
    assert never_fits(known, need, Placement(constraint="nvlink"))
    assert never_fits(known, need, Placement(nodelist=("n2",)))
    assert never_fits(known, need, Placement(exclude=("n1",)))
    assert not never_fits(known, need, Placement(constraint="ib|nvlink"))
    assert never_fits_reason([known], need, Placement(nodelist=("n2",))) == (
        "can never run: nodelist: n2 is not known"
    )


def test_preemption_respects_placement() -> None:
    nodes = [node("n1", [A100], busy=[0]), node("n2", [A100], busy=[0])]
    running = [run(8, "n1", [0], qos="low", start=0.0), run(9, "n2", [0], qos="low", start=50.0)]
    job = placed(1, Placement(nodelist=("n1",)))
    urgent = replace(job, qos="high")
    decided = plan(nodes, running, [urgent], POLICY, now=100.0)
    # n2's victim lost less work, but the job may only run on n1
    assert [(p.victim, p.node) for p in decided.preemptions] == [(8, "n1")]


def test_fit_keys_tell_placements_and_types_apart() -> None:
    plain = fit_key(Resources(gpus=1), 60.0, "normal")
    assert fit_key(Resources(gpus=1, gpu_type="a100"), 60.0, "normal") != plain
    assert fit_key(Resources(gpus=1), 60.0, "normal", "", Placement(nodelist=("n1",))) != plain


def test_an_early_stopping_pass_still_places_later_placed_jobs() -> None:
    """A job pinned to a busy node must not make the pass skip a job that fits elsewhere."""
    nodes = [node("n1", [A100], busy=[0]), node("n2", [A100])]
    queue = [placed(1, Placement(nodelist=("n1",))), wait(2)]
    shapes = {fit_key(j.need, j.time_limit, j.qos, j.user, j.placement): 1 for j in queue}
    decided = plan(nodes, [run(9, "n1", [0])], queue, POLICY, now=0.0, shapes=shapes)
    assert [(s.job_id, s.node) for s in decided.starts] == [(2, "n2")]


def test_array_splitting_and_estimates_count_only_allowed_nodes() -> None:
    nodes = [node("n1", [A100, A100]), node("n2", [H100, H100, H100])]
    assert room_for(Resources(gpus=1), nodes) == 5
    assert room_for(Resources(gpus=1), nodes, Placement(exclude=("n2",))) == 2
    assert room_for(Resources(gpus=1, gpu_type="h100"), nodes) == 3
    free = [FreeNode(n, set(), 64, 512 * GiB) for n in nodes]
    free[0].releases.append((100.0, ("GPU-n1-0",), 1, 0))
    free[1].releases.append((50.0, ("GPU-n2-0",), 1, 0))
    jobs: list[tuple[int, Resources, float | None, frozenset[str] | None]] = [
        (1, Resources(gpus=1), 60.0, frozenset({"n1"})),
        (2, Resources(gpus=1), 60.0, None),
    ]
    assert estimate_starts(free, jobs, [], 0.0) == {1: 100.0, 2: 50.0}
