"""MPS shares of shared GPUs (`--gpu-share PCT --gpu-mem SIZE`): who may join a unit, how much
is left, whole-GPU jobs and shares kept apart, every refusal named. Pure: plain data."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import make_spec
from scheduling import POLICY

from gpuq.convert import (
    job_from_proto,
    job_to_proto,
    spec_from_proto,
    spec_to_proto,
    unit_from_proto,
    unit_to_proto,
)
from gpuq.domain.model import (
    ENFORCEMENT_EXCLUSIVE,
    ENFORCEMENT_MIG,
    ENFORCEMENT_MPS,
    GpuUnit,
    Job,
    Node,
    Resources,
)
from gpuq.domain.states import JobState
from gpuq.errors import DoubleBooking, InvalidInput
from gpuq.scheduler.array_split import room_for
from gpuq.scheduler.fit_keys import fit_key
from gpuq.scheduler.fitting import NodeView, ShareUse, never_fits, never_fits_reason
from gpuq.scheduler.plan import plan
from gpuq.scheduler.snapshot import PendingJob, RunningJob
from gpuq.store.api import Store
from gpuq.store.records import JobStart, NewJob
from gpuq.submission import build_spec

GiB = 1 << 30
MiB = 1 << 20
H100 = 81_559 * MiB  # NVML's total of an "80GB" card


def gpu(node: str, index: int, shared: bool = True, memory: int = H100) -> GpuUnit:
    return GpuUnit(f"GPU-{node}-{index}", index, "NVIDIA H100", memory, shared=shared)


def share(percent: int, gpu_mem: int = 20 * GiB) -> Resources:
    return Resources(gpu_share=percent, gpu_mem=gpu_mem)


def live(job_id: int, user: str, node: str, index: int, need: Resources) -> RunningJob:
    return RunningJob(
        job_id=job_id,
        user=user,
        qos="normal",
        node=node,
        gpus=(f"GPU-{node}-{index}",),
        cpus=need.cpus,
        mem=need.mem or 0,
        start_time=0.0,
        end_estimate=3600.0,
    )


def node_view(
    name: str,
    gpus: Iterable[GpuUnit],
    running: Iterable[tuple[RunningJob, Resources]] = (),
) -> NodeView:
    """A node as the coordinator shows it: running jobs' units are not free; shares listed."""
    units = tuple(gpus)
    jobs = list(running)
    shares: dict[str, list[ShareUse]] = {}
    for job, need in jobs:
        if need.gpu_share is not None:
            use = ShareUse(job.job_id, job.user, need.gpu_share, need.gpu_mem or 0)
            for unit in job.gpus:
                shares.setdefault(unit, []).append(use)
    return NodeView(
        name=name,
        up=True,
        units=units,
        free_units=frozenset(u.uuid for u in units) - {u for j, _ in jobs for u in j.gpus},
        cpus=64,
        cpus_free=64 - sum(j.cpus for j, _ in jobs),
        mem=512 * GiB,
        mem_free=512 * GiB,
        distances={},
        shares={unit: tuple(uses) for unit, uses in shares.items()},
    )


def pending(job_id: int, need: Resources, user: str = "alice", limit: float = 3600.0) -> PendingJob:
    return PendingJob(
        job_id=job_id,
        user=user,
        qos="normal",
        need=need,
        submit_time=float(job_id),
        time_limit=limit,
    )


def test_two_shares_of_one_user_share_one_gpu_and_a_third_waits() -> None:
    nodes = [node_view("a", [gpu("a", 0)])]
    queue = [pending(1, share(50)), pending(2, share(50)), pending(3, share(50))]
    decided = plan(nodes, [], queue, POLICY, now=0.0, explain=True)
    assert [(s.job_id, s.gpus, s.shared) for s in decided.starts] == [
        (1, ("GPU-a-0",), True),
        (2, ("GPU-a-0",), True),
    ]
    (reason,) = decided.waiting[3].reasons
    assert reason.startswith("needs a 50% share of a shared GPU with 20G free: ")
    assert "node a's shared GPU 0 has only 0% left" in reason


def test_a_third_share_waits_for_what_is_left_among_live_shares() -> None:
    running = [(live(1, "alice", "a", 0, share(70)), share(70))]
    nodes = [node_view("a", [gpu("a", 0)], running)]
    decided = plan(nodes, [r for r, _ in running], [pending(2, share(50))], POLICY, 10.0)
    assert not decided.starts
    assert "node a's shared GPU 0 has only 30% left" in decided.waiting[2].reasons[0]
    fits = plan(nodes, [r for r, _ in running], [pending(3, share(30))], POLICY, 10.0)
    assert [(s.job_id, s.gpus) for s in fits.starts] == [(3, ("GPU-a-0",))]


def test_another_users_share_waits_one_user_per_mps_server() -> None:
    running = [(live(1, "alice", "a", 0, share(20)), share(20))]
    nodes = [node_view("a", [gpu("a", 0)], running)]
    decided = plan(nodes, [r for r, _ in running], [pending(2, share(20), "bob")], POLICY, 10.0)
    assert not decided.starts
    (reason,) = decided.waiting[2].reasons
    assert reason == (
        "needs a 20% share of a shared GPU with 20G free: "
        "node a's shared GPU 0 is used by alice's shares (one user at a time)"
    )
    # in one pass: alice's share and bob's share do not meet on a unit; a free one is fine
    nodes = [node_view("a", [gpu("a", 0), gpu("a", 1)])]
    queue = [pending(1, share(20)), pending(2, share(20), "bob"), pending(3, share(20))]
    decided = plan(nodes, [], queue, POLICY, 0.0)
    assert {s.job_id: s.gpus for s in decided.starts} == {
        1: ("GPU-a-0",),
        2: ("GPU-a-1",),
        3: ("GPU-a-0",),
    }


def test_share_memory_sums_to_at_most_the_card() -> None:
    running = [(live(1, "alice", "a", 0, share(10, 60 * GiB)), share(10, 60 * GiB))]
    nodes = [node_view("a", [gpu("a", 0)], running)]
    decided = plan(nodes, [r for r, _ in running], [pending(2, share(10, 30 * GiB))], POLICY, 1)
    assert not decided.starts
    assert (
        "node a's shared GPU 0 has only 19.6G of memory left unclaimed"
        in (decided.waiting[2].reasons[0])
    )
    # the marketed size fits its card (GPU_MEM_TOLERANCE): 60G + 20G on an "80GB" H100
    decided = plan(nodes, [r for r, _ in running], [pending(3, share(10, 20 * GiB))], POLICY, 1)
    assert [s.job_id for s in decided.starts] == [3]


def test_whole_gpu_job_never_gets_a_unit_with_live_shares() -> None:
    running = [(live(1, "alice", "a", 0, share(10)), share(10))]
    nodes = [node_view("a", [gpu("a", 0)], running)]
    decided = plan(nodes, [r for r, _ in running], [pending(2, Resources(gpus=1))], POLICY, 1)
    assert not decided.starts
    # a shared unit without live shares may be given whole
    decided = plan([node_view("a", [gpu("a", 0)])], [], [pending(2, Resources(gpus=1))], POLICY, 1)
    assert [(s.job_id, s.gpus, s.shared) for s in decided.starts] == [(2, ("GPU-a-0",), False)]


def test_share_never_joins_a_unit_held_whole() -> None:
    whole = live(1, "alice", "a", 0, Resources(gpus=1))
    nodes = [node_view("a", [gpu("a", 0)], [(whole, Resources(gpus=1))])]
    decided = plan(nodes, [whole], [pending(2, share(10))], POLICY, 1.0)
    assert not decided.starts
    assert "node a's shared GPU 0 is held whole by a job" in decided.waiting[2].reasons[0]


def test_whole_job_and_share_in_one_pass_take_different_units() -> None:
    nodes = [node_view("a", [gpu("a", 0), gpu("a", 1)])]
    queue = [pending(1, share(50)), pending(2, Resources(gpus=2)), pending(3, Resources(gpus=1))]
    decided = plan(nodes, [], queue, POLICY, 0.0)
    assert {s.job_id: s.gpus for s in decided.starts} == {1: ("GPU-a-0",), 3: ("GPU-a-1",)}


def test_shares_go_to_shared_gpus_only_and_never_fit_without_one() -> None:
    plain = node_view("a", [gpu("a", 0, shared=False)])
    assert never_fits(plain, share(50))
    assert "no node has a shared GPU" in never_fits_reason([plain], share(50))
    small = node_view("b", [gpu("b", 0, memory=24 * GiB)])
    assert never_fits(small, share(50, 40 * GiB))
    assert "no shared GPU has that much memory (the largest has 24G)" in never_fits_reason(
        [small], share(50, 40 * GiB)
    )
    mixed = node_view("c", [gpu("c", 0, shared=False), gpu("c", 1)])
    decided = plan([mixed], [], [pending(1, share(50))], POLICY, 0.0)
    assert [s.gpus for s in decided.starts] == [("GPU-c-1",)]


def test_fit_keys_tell_users_of_shares_apart() -> None:
    assert fit_key(share(50), 60.0, "normal", "alice") != fit_key(share(50), 60.0, "normal", "bob")
    whole = Resources(gpus=1)
    assert fit_key(whole, 60.0, "normal", "alice") == fit_key(whole, 60.0, "normal", "bob")


def test_a_blocked_share_reserves_the_unit_and_the_right_users_share_backfills() -> None:
    running = [(live(1, "bob", "a", 0, share(20)), share(20))]
    nodes = [node_view("a", [gpu("a", 0)], running)]
    # alice's share waits for bob's to end (at 3600) and reserves the unit from then on
    queue = [pending(2, share(20), "alice"), pending(3, share(20), "bob")]
    decided = plan(nodes, [r for r, _ in running], queue, POLICY, 1.0, explain=True)
    assert not decided.starts  # bob's second share would run past alice's reservation
    assert decided.waiting[2].estimated_start == 3600.0
    assert decided.waiting[3].reasons[0].startswith("resources reserved for job 2")
    # a share of bob's that ends before then backfills beside his own (the early-stop pass)
    queue = [pending(2, share(20), "alice"), pending(3, share(20), "bob", limit=600.0)]
    shapes = {fit_key(j.need, j.time_limit, j.qos, j.user): 1 for j in queue}
    decided = plan(nodes, [r for r, _ in running], queue, POLICY, 1.0, shapes=shapes)
    assert [(s.job_id, s.gpus) for s in decided.starts] == [(3, ("GPU-a-0",))]


def test_preempting_frees_a_shared_unit_only_with_all_its_shares() -> None:
    low = [replace(live(i, "bob", "a", 0, share(40)), qos="low") for i in (1, 2)]
    low = [replace(j, start_time=100.0 * i) for i, j in enumerate(low, 1)]
    running = [(j, share(40)) for j in low]
    nodes = [node_view("a", [gpu("a", 0)], running)]
    job = replace(pending(9, Resources(gpus=1)), qos="high")
    decided = plan(nodes, low, [job], POLICY, 1000.0)
    assert sorted(p.victim for p in decided.preemptions) == [1, 2]
    # alice's share needs bob's shares gone from the unit too: one victim is not enough
    job = replace(pending(9, share(10)), qos="high")
    decided = plan(nodes, low, [job], POLICY, 1000.0)
    assert sorted(p.victim for p in decided.preemptions) == [1, 2]
    # bob's own share fits beside his shares: nobody is preempted
    decided = plan(nodes, low, [replace(job, user="bob")], POLICY, 1000.0)
    assert [s.job_id for s in decided.starts] == [9] and not decided.preemptions


def test_array_room_counts_shares_per_gpu() -> None:
    assert room_for(share(25), [node_view("a", [gpu("a", 0)])]) == 4


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"gpu_share": 0, "gpu_mem": GiB}, "percentage from 1 to 100"),
        ({"gpu_share": 101, "gpu_mem": GiB}, "percentage from 1 to 100"),
        ({"gpu_share": 50}, "needs --gpu-mem"),
        ({"gpu_share": 50, "gpu_mem": GiB, "gpus": 2}, "a share is of one GPU"),
        ({"gpu_share": 50, "gpu_mem": GiB, "mig": "3g.40gb"}, "a share or a slice"),
        ({"gpu_share": True, "gpu_mem": GiB}, "percentage from 1 to 100"),
    ],
)
def test_resources_refuse_bad_shares(kwargs: dict[str, object], problem: str) -> None:
    with pytest.raises(InvalidInput, match=problem):
        Resources(**kwargs)  # type: ignore[arg-type]


def test_resources_of_a_share_and_their_enforcement() -> None:
    need = Resources(gpu_share=50, gpu_mem=GiB)
    assert (need.gpus, need.enforcement) == (1, ENFORCEMENT_MPS)
    assert Resources(gpus=1, gpu_share=50, gpu_mem=GiB) == need
    assert Resources(gpus=2).enforcement == ENFORCEMENT_EXCLUSIVE
    assert Resources(mig="3g.40gb").enforcement == ENFORCEMENT_MIG
    assert Resources().enforcement == ""
    assert replace(need, gpu_share=None).enforcement == ENFORCEMENT_EXCLUSIVE


# ---- the store: shares may hold one unit together, never beside a whole job ----------------


def _submit(store: Store, *needs: Resources) -> list[int]:
    new = [
        NewJob(make_spec(f"j{i}", resources=need), user="alice", qos="normal", priority=0)
        for i, need in enumerate(needs)
    ]
    with store.transaction() as tx:
        ids = tx.add_jobs(new, 100.0)
    return [i for group in ids for i in group]


def test_store_keeps_shares_and_shared_units(store: Store) -> None:
    (job,) = _submit(store, share(50))
    assert store.get_job(job).spec.resources == share(50)
    unit = gpu("n1", 0)
    with store.transaction() as tx:
        tx.save_node(Node("n1", (unit, gpu("n1", 1, shared=False)), 8, 64 * GiB))
    (node,) = store.list_nodes()
    assert [u.shared for u in node.units] == [True, False]


def test_store_lets_shares_hold_one_unit_together(store: Store) -> None:
    first, second, whole, third = _submit(store, share(50), share(50), Resources(gpus=1), share(10))
    with store.transaction() as tx:
        tx.start_jobs([JobStart(first, "n1", ("GPU-1",), shared=True)], 1.0)
    with store.transaction() as tx:
        tx.start_jobs([JobStart(second, "n1", ("GPU-1",), shared=True)], 2.0)
    assert sorted(a.job_id for a in store.live_allocations()) == [first, second]
    with pytest.raises(DoubleBooking, match="GPU-1"), store.transaction() as tx:
        tx.start_jobs([JobStart(whole, "n1", ("GPU-1",))], 3.0)
    with store.transaction() as tx:
        tx.start_jobs([JobStart(whole, "n1", ("GPU-2",))], 3.0)
    with pytest.raises(DoubleBooking, match="held whole"), store.transaction() as tx:
        tx.start_jobs([JobStart(third, "n1", ("GPU-2",), shared=True)], 4.0)
    assert store.get_job(third).state is JobState.PENDING


def test_store_refuses_a_plan_giving_a_unit_whole_and_as_a_share(store: Store) -> None:
    first, second = _submit(store, share(50), Resources(gpus=1))
    with pytest.raises(DoubleBooking, match="whole and as a share"), store.transaction() as tx:
        tx.start_jobs(
            [
                JobStart(first, "n1", ("GPU-1",), shared=True),
                JobStart(second, "n1", ("GPU-1",)),
            ],
            1.0,
        )
    assert store.live_allocations() == []


def test_job_proto_says_its_enforcement_and_units_keep_shared() -> None:
    spec = make_spec(resources=share(40))
    job = Job(1, spec, "alice", JobState.PENDING, "normal", 0, 1.0)
    message = job_to_proto(job)
    assert (message.gpu_enforcement, message.spec.resources.gpu_share) == (ENFORCEMENT_MPS, 40)
    assert job_from_proto(message).spec.resources == share(40)
    assert spec_from_proto(spec_to_proto(spec)).resources == share(40)
    plain = Job(2, make_spec(), "alice", JobState.PENDING, "normal", 0, 1.0)
    assert job_to_proto(plain).gpu_enforcement == ""
    unit = gpu("n1", 3)
    assert unit_from_proto(unit_to_proto(unit)) == unit
    mig = GpuUnit("MIG-1", 0, "H100", GiB, parent_uuid="GPU-1", mig_profile="1g.10gb", shared=True)
    assert not unit_to_proto(mig).shared


# ---- submitting: --gpu-share, the #GPUQ directive, Client.submit's keyword --------------------


def test_gpu_share_flag_and_directive(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n#GPUQ --gpu-share 30% --gpu-mem 12G\ntrue\n")
    spec = build_spec(script=str(script), environ={})
    assert (spec.resources.gpu_share, spec.resources.gpu_mem, spec.resources.gpus) == (
        30,
        12 * GiB,
        1,
    )
    # the command line beats the directive, as for every option
    assert build_spec(script=str(script), environ={}, gpu_share="60").resources.gpu_share == 60


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"gpu_share": "0", "gpu_mem": "20G"}, "invalid --gpu-share 0: must be a percentage"),
        ({"gpu_share": "101", "gpu_mem": "20G"}, "invalid --gpu-share 101: must be a percentage"),
        ({"gpu_share": "half", "gpu_mem": "20G"}, "expected a whole number"),
        ({"gpu_share": "50"}, "needs --gpu-mem SIZE"),
        ({"gpu_share": "50", "gpu_mem": "20G", "gpus": "2"}, "a share is of one GPU"),
        ({"gpu_share": "50", "gpu_mem": "20G", "mig": "3g.40gb"}, "a share or a slice"),
    ],
)
def test_gpu_share_flag_refuses_bad_values(options: dict[str, str], problem: str) -> None:
    with pytest.raises(InvalidInput, match=problem):
        build_spec(wrap="true", environ={}, **options)
