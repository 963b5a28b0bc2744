"""Gang scheduling in the pure scheduler: jobs of several nodes start on all of them at once
or not at all, whole-node jobs (--exclusive, --mem=0), reservations and preemption across
nodes, and the reasons a waiting multi-node job is given. Hand-built clusters, a fake clock."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from scheduling import POLICY, GiB, views, wait
from scheduling import run as running

from gpuq.domain.model import GpuUnit, Resources
from gpuq.domain.node_constraints import Placement
from gpuq.scheduler.fit_keys import fit_key
from gpuq.scheduler.fitting import NodeView
from gpuq.scheduler.plan import plan
from gpuq.scheduler.snapshot import Decisions, PendingJob, Policy, RunningJob, Start


def gang(
    job_id: int,
    nodes: int,
    gpus: int,
    limit: float | None = 3600.0,
    qos: str = "normal",
    priority: float | None = None,
    **need: object,
) -> PendingJob:
    return replace(
        wait(job_id, limit=limit, qos=qos, priority=priority),
        need=Resources(gpus=gpus, nodes=nodes, **need),  # type: ignore[arg-type]
    )


def decide(
    nodes: list[NodeView],
    live: list[RunningJob],
    queue: list[PendingJob],
    now: float = 0.0,
    policy: Policy = POLICY,
    explain: bool = True,
) -> Decisions:
    ordered = sorted(queue, key=lambda j: (-j.priority, j.job_id))
    return plan(nodes, live, ordered, policy, now, explain=explain)


def typed(node: NodeView, model: str) -> NodeView:
    """The node with GPUs of NVML name `model` instead of A100s."""
    return replace(
        node,
        units=tuple(GpuUnit(u.uuid, u.index, model, u.memory, u.pci_bus_id) for u in node.units),
    )


def clock(moment: float) -> str:
    return "~" + dt.datetime.fromtimestamp(moment).strftime("%H:%M")


def test_a_two_node_job_starts_on_two_best_fit_nodes_at_once() -> None:
    live = [running(1, "a", range(4)), running(2, "c", range(6))]
    nodes = views({"a": 8, "b": 8, "c": 8}, live)
    decided = decide(nodes, live, [gang(10, nodes=2, gpus=2)])
    [start] = decided.starts
    # c (2 free) and a (4 free) are the tightest fits; b stays whole
    assert [n for n, _ in start.parts] == ["c", "a"]
    assert start.node == "c" and start.gpus == ("GPU-c-6", "GPU-c-7")
    assert start.more == (("a", ("GPU-a-4", "GPU-a-5")),)


def test_never_a_partial_start_and_the_reason_names_each_node() -> None:
    live = [running(812, "b", range(7), limit=3000.0)]
    nodes = views({"a": 8, "b": 8}, live)
    decided = decide(nodes, live, [gang(10, nodes=2, gpus=4)])
    assert decided.starts == ()
    reason = decided.waiting[10].reasons[0]
    assert reason == (
        "needs 2 nodes with 4 free a100 GPUs each: a has 8, b has 1 "
        f"(job 812 until {clock(3000.0)})"
    )
    assert decided.waiting[10].estimated_start == 3000.0


def test_one_job_s_nodes_share_a_gpu_type() -> None:
    live = [running(1, "a", range(6))]
    nodes = views({"a": 8, "b": 8, "c": 8})
    nodes = views({"a": 8, "b": 8, "c": 8}, live)
    nodes[1] = typed(nodes[1], "NVIDIA H100 80GB HBM3")
    nodes[2] = typed(nodes[2], "NVIDIA H100 80GB HBM3")
    # a has 2 a100 free: with b or c it would mix types, so b and c it is
    decided = decide(nodes, live, [gang(10, nodes=2, gpus=2)])
    [start] = decided.starts
    assert sorted(n for n, _ in start.parts) == ["b", "c"]
    # a job that names a type takes that type on every node, or waits
    decided = decide(nodes, live, [gang(11, nodes=2, gpus=2, gpu_type="a100")])
    assert decided.starts == ()
    assert decided.waiting[11].reasons[0].startswith("can never run: needs 2 nodes with 2 a100")


def test_a_type_on_too_few_nodes_never_fits_and_says_which_can() -> None:
    nodes = views({"gpu01": 8, "gpu02": 8})
    nodes[1] = typed(nodes[1], "NVIDIA H100 80GB HBM3")
    decided = decide(nodes, [], [gang(10, nodes=2, gpus=4, gpu_type="a100")])
    assert decided.waiting[10].reasons == (
        "can never run: needs 2 nodes with 4 a100 GPUs each; only 1 node (gpu01) can ever "
        "hold that",
    )
    decided = decide(nodes, [], [gang(11, nodes=3, gpus=4)])
    assert decided.waiting[11].reasons[0].startswith("can never run: needs 3 nodes with 4")


def test_a_nodelist_means_only_these_nodes() -> None:
    nodes = views({"a": 8, "b": 8, "c": 8})
    job = replace(gang(10, nodes=2, gpus=1), placement=Placement(nodelist=("b", "c")))
    [start] = decide(nodes, [], [job]).starts
    assert sorted(n for n, _ in start.parts) == ["b", "c"]
    job = replace(job, placement=Placement(nodelist=("b",)))
    reason = decide(nodes, [], [job]).waiting[10].reasons[0]
    assert "only 1 node (b) can ever hold that" in reason


def test_exclusive_takes_a_whole_idle_node_and_nothing_else_joins_it() -> None:
    live = [running(1, "a", [0])]
    nodes = views({"a": 8, "b": 8}, live, cpus=32, mem=256 * GiB)
    queue = [gang(10, nodes=1, gpus=2, exclusive=True), wait(11, gpus=1, priority=-100)]
    decided = decide(nodes, live, queue)
    by_id = {s.job_id: s for s in decided.starts}
    assert by_id[10].node == "b" and len(by_id[10].gpus) == 8, "every unit of b"
    assert by_id[11].node == "a", "nothing joins b: its CPUs and memory are all taken"


def test_exclusive_waits_for_the_node_to_empty() -> None:
    live = [running(5, "a", [0], limit=500.0), running(6, "a", [1], limit=900.0)]
    nodes = views({"a": 2}, live)
    decided = decide(nodes, live, [gang(10, nodes=1, gpus=1, exclusive=True)])
    assert decided.starts == ()
    assert decided.waiting[10].reasons[0] == (
        f"needs 1 whole node with 1 free GPU: a is in use (job 6 until {clock(900.0)})"
    )
    assert decided.waiting[10].estimated_start == 900.0


def test_mem_all_needs_the_whole_memory_free_and_takes_it() -> None:
    hog = replace(running(1, "a", []), mem=GiB)
    nodes = views({"a": 4, "b": 4}, [hog])
    queue = [gang(10, nodes=1, gpus=1, mem_all=True), wait(11, priority=-100)]
    queue[1] = replace(queue[1], need=Resources(gpus=1, mem=GiB))
    decided = decide(nodes, [hog], queue)
    by_id = {s.job_id: s.node for s in decided.starts}
    assert by_id == {10: "b", 11: "a"}, "b's memory went to job 10 whole"


def test_a_blocked_two_node_job_holds_a_reservation_small_jobs_backfill_around() -> None:
    live = [
        running(1, "a", range(8), limit=100.0),
        running(2, "b", range(8), limit=300.0),
        running(3, "c", range(8), limit=10_000.0),
    ]
    nodes = views({"a": 8, "b": 8, "c": 8}, live)
    top = gang(10, nodes=2, gpus=8, priority=10)
    decided = decide(nodes, live, [top])
    assert decided.waiting[10].estimated_start == 300.0, "the 2nd-earliest node (b) frees at 300"
    # a short job ending before 300 may use a's units; a long one must not
    free = views({"a": 8, "b": 8, "c": 8}, live[1:])
    short, long = wait(11, gpus=8, limit=200.0), wait(12, gpus=8, limit=500.0)
    decided = decide(free, live[1:], [top, short])
    assert [s.job_id for s in decided.starts] == [11]
    decided = decide(free, live[1:], [top, long])
    assert decided.starts == ()
    assert decided.waiting[12].reasons[0].startswith("resources reserved for job 10")


def test_multi_node_preemption_frees_every_node_and_stops_a_gang_victim_whole() -> None:
    low = dict(qos="low")
    live = [
        running(1, "a", range(8), start=-50.0, **low),  # type: ignore[arg-type]
        replace(running(2, "b", range(8), start=-10.0, **low), nodes=2),  # type: ignore[arg-type]
        replace(running(2, "c", range(8), start=-10.0, **low), nodes=2),  # type: ignore[arg-type]
        running(3, "d", range(8), start=-5.0),  # normal: not preemptible
    ]
    nodes = views({"a": 8, "b": 8, "c": 8, "d": 8}, live)
    decided = decide(nodes, live, [gang(10, nodes=2, gpus=8, qos="high")])
    assert [(p.victim, p.preemptor, p.node) for p in decided.preemptions] == [(2, 10, "b")]
    assert decided.starts == ()


def test_a_multi_node_job_counts_once_with_all_its_gpus_in_qos_limits() -> None:
    tiers = dict(POLICY.tiers)
    tiers["normal"] = replace(tiers["normal"], max_running_gpus=10, max_running_jobs=2)
    policy = replace(POLICY, tiers=tiers)
    live = [replace(running(1, n, range(4)), nodes=2) for n in ("a", "b")]
    nodes = views({"a": 8, "b": 8, "c": 8}, live)
    queue = [gang(10, nodes=2, gpus=2, priority=5), wait(11, gpus=1)]
    decided = decide(nodes, live, queue, policy=policy)
    assert [s.job_id for s in decided.starts] == [11], "job 10: 8 + 4 GPUs is over 10"
    assert decided.waiting[10].reasons[0] == (
        "qos normal limit: at most 10 running GPUs per user (u runs 8)"
    )
    decided = decide(nodes, live, [gang(12, nodes=2, gpus=1)], policy=policy)
    assert [s.job_id for s in decided.starts] == [12], "one job running, not two; 10 GPUs"
    after = [*live, RunningJob(12, "u", "normal", "c", ("GPU-c-0",), 1, 0, 0.0, 3600.0, nodes=2)]
    decided = decide(nodes, after, [wait(13)], policy=policy)
    assert "at most 2 running jobs per user (u runs 2)" in decided.waiting[13].reasons[0]


def test_fit_keys_tell_node_counts_and_whole_nodes_apart() -> None:
    one = Resources(gpus=4)
    keys = {
        fit_key(need, 60.0, "normal")
        for need in (
            one,
            Resources(gpus=4, nodes=2),
            Resources(gpus=4, exclusive=True),
            Resources(gpus=4, mem_all=True),
        )
    }
    assert len(keys) == 4


def test_one_node_jobs_start_as_before_beside_gang_jobs() -> None:
    nodes = views({"a": 8, "b": 8, "c": 4})
    decided = decide(nodes, [], [gang(10, nodes=2, gpus=8), wait(11, gpus=4)])
    placed = {s.job_id: s for s in decided.starts}
    assert sorted(n for n, _ in placed[10].parts) == ["a", "b"]
    assert placed[11] == Start(11, "c", tuple(f"GPU-c-{i}" for i in range(4)))


def test_explain_estimates_every_waiting_multi_node_job() -> None:
    live = [
        running(1, "a", range(8), limit=100.0),
        running(2, "b", range(8), limit=200.0),
        running(3, "c", range(8), limit=400.0),
    ]
    nodes = views({"a": 8, "b": 8, "c": 8}, live)
    queue = [
        gang(10, nodes=2, gpus=8, limit=1000.0),  # a and b: reserved from 200
        gang(11, nodes=2, gpus=4, limit=50.0),  # c at 400, and a or b after job 10 (1200)
        gang(12, nodes=3, gpus=1, exclusive=True),
    ]
    decided = decide(nodes, live, queue)
    assert decided.waiting[10].estimated_start == 200.0
    assert decided.waiting[11].estimated_start == 1200.0
    assert decided.waiting[12].estimated_start == 1250.0
