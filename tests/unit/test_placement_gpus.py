"""Placement on GPUs as they really are: unit health (ok / unhealthy / dirty / drained), MIG
slices the way CUDA sees them, and --gpu-mem at marketed sizes. Pure: plain data, no server."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from scheduling import POLICY, views, wait

from gpuq.domain.model import (
    GPU_MEM_TOLERANCE,
    ONE_MIG_SLICE,
    GpuUnit,
    Resources,
    gpu_mem_fits,
)
from gpuq.domain.units import parse_size
from gpuq.errors import InvalidInput
from gpuq.scheduler.array_split import room_for
from gpuq.scheduler.fit_keys import fit_key
from gpuq.scheduler.fitting import (
    NodeView,
    choose_units,
    kind_fits,
    misfit,
    never_fits,
    never_fits_reason,
    shortage,
)
from gpuq.scheduler.plan import plan
from gpuq.scheduler.snapshot import PendingJob
from gpuq.scheduler.waiting_reasons import NEVER_ON_UP

MiB = 1 << 20
GiB = 1 << 30
# NVML's totals (memory v2) for cards sold as 80GB, 141GB, 24GB, 48GB and 40GB
H100 = 81_559 * MiB
H200 = 143_771 * MiB
L4 = 23_034 * MiB
L40S = 46_068 * MiB
A100_40 = 40_960 * MiB

DIRTY = "dirty: pid 4242 (python) still holds 2.0 GiB after job 17"
DRAINED = "drained by admin: fan"


def gpu(node: str, index: int, memory: int = H100, name: str = "NVIDIA H100") -> GpuUnit:
    return GpuUnit(f"GPU-{node}-{index}", index, name, memory, f"0000:{index:02x}:00.0")


def mig(node: str, index: int, slot: int, profile: str, memory: int) -> GpuUnit:
    return GpuUnit(
        f"MIG-{node}-{index}-{slot}",
        index,
        f"NVIDIA H100 MIG {profile}",
        memory,
        f"0000:{index:02x}:00.0",
        f"GPU-{node}-{index}",
        profile,
    )


def view(
    name: str,
    units: tuple[GpuUnit, ...],
    *,
    taken: tuple[str, ...] = (),
    unhealthy: dict[str, str] | None = None,
    up: bool = True,
    down_reason: str = "is down",
) -> NodeView:
    return NodeView(
        name=name,
        up=up,
        units=units,
        free_units=frozenset(u.uuid for u in units) - set(taken),
        cpus=64,
        cpus_free=64,
        mem=512 * GiB,
        mem_free=512 * GiB,
        distances={},
        down_reason=down_reason,
        unhealthy=unhealthy or {},
    )


def pending(job_id: int, need: Resources) -> PendingJob:
    return PendingJob(job_id, "u", "normal", need, 0.0, -job_id, 3600.0)


# ---- --gpu-mem at marketed sizes ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "total"),
    [("80G", H100), ("141G", H200), ("24G", L4), ("48G", L40S), ("40G", A100_40)],
)
def test_a_marketed_size_fits_its_card(asked: str, total: int) -> None:
    assert gpu_mem_fits(total, parse_size(asked))
    one = Resources(gpus=1, gpu_mem=parse_size(asked))
    assert not never_fits(view("a", (gpu("a", 0, total),)), one)


def test_a_marketed_size_never_fits_a_smaller_card() -> None:
    assert not gpu_mem_fits(A100_40, parse_size("80G"))
    assert not gpu_mem_fits(L4, parse_size("48G"))
    assert not gpu_mem_fits(H100, parse_size("141G"))
    assert GPU_MEM_TOLERANCE == 0.07


def test_a_mig_slice_fits_gpu_mem_below_its_size() -> None:
    slice_ = mig("m", 0, 0, "3g.71gb", 71 * GiB)
    assert kind_fits((slice_,), Resources(mig="3g.71gb", gpu_mem=parse_size("70G"))) == [slice_]
    assert kind_fits((slice_,), Resources(gpus=1, gpu_mem=parse_size("70G"))) == [slice_]


def test_the_tolerance_is_the_one_comparison_everywhere() -> None:
    """placement, never_fits, array splitting and the shortage text agree on an H100."""
    need = Resources(gpus=2, gpu_mem=parse_size("80G"))
    node = view("a", (gpu("a", 0), gpu("a", 1)), taken=("GPU-a-1",))
    assert not never_fits(node, need)
    assert room_for(need, [node]) == 0
    assert room_for(replace(need, gpus=1), [node]) == 1
    assert misfit(node, need) == "node a has 1 of 2 GPUs free"
    assert shortage([node], need) == (
        "needs 2 GPUs with 80G on one node; largest free block is 1 (node a)"
    )
    started = plan([view("a", (gpu("a", 0), gpu("a", 1)))], [], [pending(1, need)], POLICY, 0.0)
    assert [s.gpus for s in started.starts] == [("GPU-a-0", "GPU-a-1")]


@pytest.mark.parametrize("asked", ["1G", "10G", "24G", "40G", "80G", "141G", "1T"])
def test_gpu_mem_fits_from_93_percent_of_the_size_on_both_sides(asked: str) -> None:
    """README: a GPU fits --gpu-mem SIZE when NVML's memory is at least 93 % of SIZE. A unit
    1 MiB over the edge fits, 1 MiB under does not; 92 % and 94 % are well either side."""
    size = parse_size(asked)
    edge = math.ceil(size * 0.93)
    assert gpu_mem_fits(edge, size)
    assert gpu_mem_fits(edge + MiB, size)
    assert gpu_mem_fits(size * 94 // 100, size)
    assert not gpu_mem_fits(edge - MiB, size)
    assert not gpu_mem_fits(size * 92 // 100, size)
    # the scheduler takes the unit over the edge and never the one under it
    need = Resources(gpus=1, gpu_mem=size)
    over, under = gpu("a", 0, edge + MiB), gpu("b", 0, edge - MiB)
    assert not never_fits(view("a", (over,)), need)
    assert never_fits(view("b", (under,)), need)
    started = plan([view("b", (under,)), view("a", (over,))], [], [pending(1, need)], POLICY, 0.0)
    assert [(s.node, s.gpus) for s in started.starts] == [("a", ("GPU-a-0",))]
    assert room_for(need, [view("a", (over,)), view("b", (under,))]) == 1


@pytest.mark.parametrize(
    ("total", "asked", "fits"),
    [
        (81_559 * MiB, "80G", True),  # README: an H100 "80GB" fits --gpu-mem 80G
        (40_960 * MiB, "80G", False),  # README: a 40 GB A100 does not
        (143_771 * MiB, "141G", True),  # an H200
        (23_034 * MiB, "24G", True),  # an L4 "24GB", 6.3 % short of its size
        (23_034 * MiB, "25G", False),  # 10 % short
    ],
)
def test_gpu_mem_readme_examples(total: int, asked: str, fits: bool) -> None:
    assert gpu_mem_fits(total, parse_size(asked)) is fits
    need = Resources(gpus=1, gpu_mem=parse_size(asked))
    assert never_fits(view("a", (gpu("a", 0, total),)), need) is not fits


# ---- health ----------------------------------------------------------------------------------


def test_units_that_are_not_ok_are_never_given_out() -> None:
    units = (gpu("a", 0), gpu("a", 1), gpu("a", 2))
    node = view("a", units, unhealthy={"GPU-a-0": DRAINED, "GPU-a-2": DIRTY})
    assert [u.uuid for u in node.usable_units(Resources(gpus=1))] == ["GPU-a-1"]
    decided = plan([node], [], [pending(1, Resources(gpus=1))], POLICY, 0.0)
    assert [s.gpus for s in decided.starts] == [("GPU-a-1",)]
    decided = plan([node], [], [pending(1, Resources(gpus=2))], POLICY, 0.0, explain=True)
    assert decided.starts == ()
    assert decided.waiting[1].reasons == (
        "needs 2 GPUs on one node; largest free block is 1 (node a) (node a: GPU 0 drained by "
        "admin: fan; node a: GPU 2 dirty: pid 4242 (python) still holds 2.0 GiB after job 17)",
    )


def test_misfit_names_the_units_that_are_not_ok() -> None:
    node = view("a", (gpu("a", 0), gpu("a", 1)), unhealthy={"GPU-a-1": DRAINED})
    assert misfit(node, Resources(gpus=2)) == (
        "node a has 1 of 2 GPUs free (GPU 1 drained by admin: fan)"
    )
    dirty = view("a", (gpu("a", 0), gpu("a", 2)), taken=("GPU-a-0",), unhealthy={"GPU-a-2": DIRTY})
    assert misfit(dirty, Resources(gpus=1)) == (
        "node a has 0 of 1 GPUs free (GPU 2 dirty: pid 4242 (python) still holds 2.0 GiB "
        "after job 17)"
    )


def test_a_drained_gpu_still_counts_for_never_fits() -> None:
    """A drained or dirty GPU can come back: the job waits, it is not refused."""
    node = view("a", (gpu("a", 0), gpu("a", 1)), unhealthy={"GPU-a-0": DRAINED, "GPU-a-1": DIRTY})
    assert not never_fits(node, Resources(gpus=2))
    decided = plan([node], [], [pending(1, Resources(gpus=2))], POLICY, 0.0, explain=True)
    assert decided.starts == ()
    assert decided.waiting[1].reasons[0].startswith("needs 2 GPUs on one node; largest free")


def test_a_unit_that_is_not_ok_is_not_reserved_nor_freed_by_preemption() -> None:
    """A drained unit held by a running job is not counted as coming free when it ends."""
    from scheduling import run as running

    job = running(9, "a", [0], limit=60.0, qos="low")
    node = views({"a": 2}, [job])[0]
    node = replace(node, unhealthy={"GPU-a-0": DRAINED})
    decided = plan([node], [job], [pending(1, Resources(gpus=2))], POLICY, 0.0, explain=True)
    assert decided.starts == () and decided.preemptions == ()
    assert decided.waiting[1].estimated_start is None


def test_a_drained_node_takes_no_work_and_is_named() -> None:
    node = view("a", (gpu("a", 0),), up=False, down_reason="drained by admin: rack work")
    decided = plan([node], [], [pending(1, Resources(gpus=1))], POLICY, 0.0, explain=True)
    assert decided.starts == ()
    assert decided.waiting[1].reasons == ("node a drained by admin: rack work",)


# ---- MIG the way CUDA sees it -------------------------------------------------------------------


MIXED = (
    gpu("x", 0),
    mig("x", 1, 0, "3g.40gb", 40 * GiB),
    mig("x", 1, 1, "3g.40gb", 40 * GiB),
    gpu("x", 2),
)
MIG_ONLY = (
    mig("m", 0, 0, "4g.40gb", 40 * GiB),
    mig("m", 0, 1, "2g.20gb", 20 * GiB),
    mig("m", 0, 2, "1g.10gb", 10 * GiB),
)


def test_gpus_n_means_whole_gpus_and_never_slices() -> None:
    node = view("x", MIXED)
    assert choose_units(node, Resources(gpus=2)) == ("GPU-x-0", "GPU-x-2")
    assert choose_units(node, Resources(gpus=1)) == ("GPU-x-0",)
    busy = view("x", MIXED, taken=("GPU-x-0",))
    assert misfit(busy, Resources(gpus=2)) == "node x has 1 of 2 GPUs free"
    decided = plan([busy], [], [pending(1, Resources(gpus=2))], POLICY, 0.0)
    assert decided.starts == ()  # never a whole GPU plus a slice


def test_gpus_on_a_mig_only_node_says_so() -> None:
    node = view("m", MIG_ONLY)
    assert never_fits(node, Resources(gpus=2))
    assert never_fits(node, Resources(gpus=1))
    assert misfit(node, Resources(gpus=2)) == (
        "needs 2 whole GPUs on one node; node m has MIG slices only"
    )
    assert never_fits_reason([node], Resources(gpus=2)) == (
        "--gpus 2 can never run: needs 2 whole GPUs on one node; MIG slices only on m "
        "(a job gets whole GPUs or one --mig slice)"
    )
    whole = view("w", (gpu("w", 0),), taken=("GPU-w-0",))
    decided = plan([node, whole], [], [pending(1, Resources(gpus=2))], POLICY, 0.0, explain=True)
    assert decided.waiting[1].reasons[0] == (
        f"{NEVER_ON_UP} (--gpus 2 can never run: the largest node (w) has 1 whole GPUs)"
    )


def test_one_gpu_with_gpu_mem_on_a_mig_only_node_takes_the_smallest_slice_that_fits() -> None:
    node = view("m", MIG_ONLY)
    assert choose_units(node, Resources(gpus=1, gpu_mem=parse_size("15G"))) == ("MIG-m-0-1",)
    assert choose_units(node, Resources(gpus=1, gpu_mem=parse_size("10G"))) == ("MIG-m-0-2",)
    busy = view("m", MIG_ONLY, taken=("MIG-m-0-1",))
    assert choose_units(busy, Resources(gpus=1, gpu_mem=parse_size("15G"))) == ("MIG-m-0-0",)
    # on a node with whole GPUs, a whole GPU, even when a slice would fit
    assert choose_units(view("x", MIXED), Resources(gpus=1, gpu_mem=parse_size("30G"))) == (
        "GPU-x-0",
    )
    decided = plan([node], [], [pending(1, Resources(gpus=1, gpu_mem=20 * GiB))], POLICY, 0.0)
    assert [s.gpus for s in decided.starts] == [("MIG-m-0-1",)]


def test_mig_profile_takes_exactly_one_slice_of_that_profile() -> None:
    need = Resources(mig="3g.40gb")
    assert need.gpus == 1
    node = view("x", MIXED)
    assert choose_units(node, need) == ("MIG-x-1-0",)
    decided = plan([node], [], [pending(1, need), pending(2, need)], POLICY, 0.0)
    assert sorted(s.gpus for s in decided.starts) == [("MIG-x-1-0",), ("MIG-x-1-1",)]


def test_a_profile_no_node_has_is_named() -> None:
    need = Resources(mig="3g.71gb")
    nodes = [view("x", MIXED), view("m", MIG_ONLY)]
    assert all(never_fits(n, need) for n in nodes)
    assert never_fits_reason(nodes, need) == (
        "--mig 3g.71gb can never run: no node has a MIG 3g.71gb slice"
    )
    assert misfit(nodes[0], need) == "node x has no MIG 3g.71gb slice"
    assert shortage(nodes, need) == "no node that is up has a MIG 3g.71gb slice"


def test_mig_slices_all_busy_or_dirty_wait_with_the_reason() -> None:
    need = Resources(mig="3g.40gb")
    node = view("x", MIXED, taken=("MIG-x-1-0",), unhealthy={"MIG-x-1-1": DIRTY})
    assert misfit(node, need) == (
        "node x has 0 of 1 MIG 3g.40gb slices free (GPU 1 slice 3g.40gb dirty: pid 4242 "
        "(python) still holds 2.0 GiB after job 17)"
    )


def test_mig_with_more_than_one_unit_is_refused() -> None:
    with pytest.raises(InvalidInput) as raised:
        Resources(gpus=2, mig="3g.71gb")
    assert ONE_MIG_SLICE in str(raised.value)
    assert "ask for --gpus N whole GPUs or one --mig slice" in str(raised.value)
    with pytest.raises(InvalidInput, match="MIG profile"):
        Resources(mig="three")


def test_mig_and_whole_gpu_jobs_are_scheduled_apart_in_one_pass() -> None:
    """The fit key tells a --mig job from a --gpus 1 job of the same size."""
    node = view("x", MIXED, taken=("GPU-x-0", "GPU-x-2"))
    queue = [pending(1, Resources(gpus=1)), pending(2, Resources(mig="3g.40gb"))]
    shapes = {fit_key(j.need, j.time_limit, j.qos): 1 for j in queue}
    assert len(shapes) == 2
    decided = plan([node], [], queue, POLICY, 0.0, shapes=shapes)
    assert [s.job_id for s in decided.starts] == [2]
    assert wait(3).need.mig is None


def test_mig_from_a_directive_a_keyword_and_the_wire(tmp_path: object) -> None:
    from pathlib import Path

    from gpuq.convert import spec_from_proto, spec_to_proto
    from gpuq.submission import build_spec

    script = Path(str(tmp_path)) / "job.sh"
    script.write_text("#!/bin/sh\n#GPUQ --mig 3g.71gb\n#GPUQ --gpu-mem 70G\ntrue\n")
    spec = build_spec(str(script), environ={})
    assert (spec.resources.mig, spec.resources.gpus) == ("3g.71gb", 1)
    assert spec_from_proto(spec_to_proto(spec)).resources == spec.resources
    assert build_spec(wrap="true", mig="1g.10gb", environ={}).resources.mig == "1g.10gb"
    assert build_spec(wrap="true", gpus="2", environ={}).resources.mig is None
    with pytest.raises(InvalidInput, match="a job sees one MIG slice"):
        build_spec(wrap="true", mig="1g.10gb", gpus="2", environ={})
