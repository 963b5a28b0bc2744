"""The pure scheduler on hand-built clusters: placement, priority, backfill, preemption,
limits, dependencies, arrays, and the reasons it gives."""

from __future__ import annotations

from dataclasses import replace

from scheduling import POLICY, views, wait
from scheduling import run as running

from gpuq.domain.dependencies import DependencyKind
from gpuq.domain.model import Resources
from gpuq.domain.policy import QosTier, default_qos_tiers
from gpuq.domain.states import JobState
from gpuq.scheduler.fit_keys import fit_key
from gpuq.scheduler.fitting import never_fits_reason
from gpuq.scheduler.plan import plan
from gpuq.scheduler.snapshot import Dependency, PendingJob, Policy, RunningJob


def decide(nodes, live, queue, now=0.0, policy=POLICY, explain=True):  # type: ignore[no-untyped-def]
    ordered = sorted(queue, key=lambda j: (-j.priority, j.job_id))
    return plan(nodes, live, ordered, policy, now, explain=explain)


def test_one_gpu_jobs_fill_partly_used_nodes_first() -> None:
    live = [running(1, "a", range(6))]
    nodes = views({"a": 8, "b": 8}, live)
    queue = [wait(10 + i) for i in range(2)] + [wait(20, gpus=8)]
    decided = decide(nodes, live, queue)
    placed = {s.job_id: s.node for s in decided.starts}
    assert placed == {10: "a", 11: "a", 20: "b"}, "small jobs pack node a; b stays whole"


def test_gpus_close_in_topology_are_chosen_together() -> None:
    [node] = views({"a": 4})
    linked = {("GPU-a-1", "GPU-a-3"): 5}
    far = {(a, b): 50 for a in node.free_units for b in node.free_units if a < b}
    node = replace(node, distances={**far, **linked})
    decided = decide([node], [], [wait(1, gpus=2)])
    assert decided.starts[0].gpus == ("GPU-a-1", "GPU-a-3")


def test_higher_priority_first_and_reasons_name_the_block() -> None:
    live = [running(1, "a", range(6))]
    nodes = views({"a": 8, "b": 4}, live)
    queue = [wait(10, gpus=4, priority=1), wait(11, gpus=4, priority=5)]
    decided = decide(nodes, live, queue)
    assert [s.job_id for s in decided.starts] == [11]
    assert decided.waiting[10].reasons == (
        "needs 4 GPUs on one node; largest free block is 2 (node a)",
    )
    assert decided.waiting[10].estimated_start == 3600.0


def test_backfill_only_when_the_top_reservation_is_not_delayed() -> None:
    live = [running(1, "a", range(6), limit=100)]  # frees its 6 GPUs at t=100
    nodes = views({"a": 8}, live)
    top = wait(10, gpus=8, priority=10)  # needs all 8: reserved for t=100
    long = wait(12, gpus=2, limit=500, priority=1)  # would run past t=100
    decided = decide(nodes, live, [top, long])
    assert decided.starts == ()
    assert decided.waiting[10].estimated_start == 100.0
    assert decided.waiting[12].reasons[0].startswith("resources reserved for job 10")
    short = wait(11, gpus=2, limit=50, priority=5)  # ends at 50, before the reservation
    decided = decide(nodes, live, [top, short, long])
    assert [s.job_id for s in decided.starts] == [11]
    assert decided.waiting[10].estimated_start == 100.0


def test_long_backfill_may_use_units_the_reservation_does_not_need() -> None:
    live = [running(1, "a", range(6), limit=100)]
    nodes = views({"a": 8}, live)
    top = wait(10, gpus=6, priority=10)  # reserves the 6 released units at t=100
    long = wait(12, gpus=2, limit=500, priority=1)  # the 2 free units are not needed by it
    decided = decide(nodes, live, [top, long])
    assert [s.job_id for s in decided.starts] == [12]
    assert decided.waiting[10].estimated_start == 100.0


def test_never_fits_now_and_down_nodes() -> None:
    nodes = views({"a": 8, "b": 8}, down=["b"])
    decided = decide(nodes, [], [wait(1, gpus=8), wait(2, gpus=8)])
    assert [s.job_id for s in decided.starts] == [1]
    nodes = views({"a": 8}, down=["a"])
    decided = decide(nodes, [], [wait(3)])
    assert decided.waiting[3].reasons == ("node a is down",)


def test_preemption_frees_the_least_work() -> None:
    live = [
        running(1, "a", [0, 1], start=-1000, qos="low"),  # ran long
        running(2, "a", [2, 3], start=-10, qos="low"),  # just started
        running(3, "a", [4, 5], start=-20, qos="low"),
        running(4, "a", [6, 7], start=-5, qos="normal"),  # not preemptible
    ]
    nodes = views({"a": 8}, live)
    decided = decide(nodes, live, [wait(10, gpus=4, qos="high")])
    assert sorted(p.victim for p in decided.preemptions) == [2, 3]
    assert all(p.preemptor == 10 for p in decided.preemptions)
    assert decided.starts == ()


def test_only_preemptible_lower_tiers_are_preempted() -> None:
    live = [running(1, "a", range(4), qos="normal"), running(2, "b", range(4), qos="low")]
    nodes = views({"a": 4, "b": 4}, live)
    assert decide(nodes, live, [wait(10, gpus=4, qos="low")]).preemptions == ()
    for qos in ("normal", "high"):  # both may preempt low; nobody preempts normal
        decided = decide(nodes, live, [wait(10, gpus=4, qos=qos)])
        assert [p.victim for p in decided.preemptions] == [2]
    live = [running(1, "a", range(4), qos="normal")]
    assert decide(views({"a": 4}, live), live, [wait(10, gpus=4, qos="high")]).preemptions == ()


def test_no_preemption_when_waiting_is_shorter_than_the_grace() -> None:
    live = [running(1, "a", range(4), qos="low", limit=10)]
    nodes = views({"a": 4}, live)
    decided = decide(nodes, live, [wait(10, gpus=4, qos="high")])
    assert decided.preemptions == ()
    assert decided.waiting[10].estimated_start == 10.0


def test_a_preemption_in_progress_is_not_repeated() -> None:
    live = [
        running(1, "a", range(4), qos="low", stopping=True, limit=30),
        running(2, "b", range(4), qos="low"),
    ]
    nodes = views({"a": 4, "b": 4}, live)
    decided = decide(nodes, live, [wait(10, gpus=4, qos="high")])
    assert decided.preemptions == ()


def test_qos_limits_and_their_reason() -> None:
    tiers = dict(default_qos_tiers())
    tiers["normal"] = replace(tiers["normal"], max_running_gpus=3, max_running_jobs=5)
    policy = Policy(tiers, POLICY.settings, 30.0)
    live = [running(1, "a", range(2), user="alice")]
    nodes = views({"a": 8}, live)
    queue = [wait(10, gpus=2, user="alice"), wait(11, gpus=1, user="alice"), wait(12, gpus=2)]
    decided = decide(nodes, live, queue, policy=policy)
    assert sorted(s.job_id for s in decided.starts) == [11, 12]
    assert decided.waiting[10].reasons[0] == (
        "qos normal limit: at most 3 running GPUs per user (alice runs 2)"
    )


def test_qos_running_limits_admit_up_to_the_limit_and_no_more() -> None:
    """Both sides of each per-user limit: the job that reaches it starts, the next waits (the
    limits count the jobs this pass starts too)."""
    tiers = dict(default_qos_tiers())
    tiers["normal"] = replace(tiers["normal"], max_running_jobs=3)
    tiers["high"] = replace(tiers["high"], max_running_gpus=4)
    policy = Policy(tiers, POLICY.settings, 30.0)
    live = [running(1, "a", [0], user="alice"), running(2, "a", [1, 2], qos="high", user="bob")]
    nodes = views({"a": 8}, live)
    queue = [
        wait(10, user="alice"),
        wait(11, user="alice"),  # alice's third running job: the limit
        wait(12, user="alice"),
        wait(13, gpus=2, qos="high", user="bob"),  # bob's fourth GPU: the limit
        wait(14, qos="high", user="bob"),
    ]
    decided = decide(nodes, live, queue, policy=policy)
    assert sorted(s.job_id for s in decided.starts) == [10, 11, 13]
    assert decided.waiting[12].reasons[0] == (
        "qos normal limit: at most 3 running jobs per user (alice runs 3)"
    )
    assert decided.waiting[14].reasons[0] == (
        "qos high limit: at most 4 running GPUs per user (bob runs 4)"
    )


def dep(job_id: int, kind: str, state: JobState | None) -> Dependency:
    return Dependency(job_id, DependencyKind(kind), state)


def test_dependencies() -> None:
    nodes = views({"a": 8})
    queue = [
        wait(10, dependencies=(dep(1, "ok", JobState.COMPLETED),)),
        wait(11, dependencies=(dep(2, "ok", JobState.RUNNING),)),
        wait(12, dependencies=(dep(3, "ok", JobState.FAILED),)),
        wait(13, dependencies=(dep(3, "notok", JobState.FAILED),)),
        wait(14, dependencies=(dep(4, "any", JobState.CANCELLED),)),
        wait(15, dependencies=(dep(5, "notok", JobState.COMPLETED),)),
    ]
    decided = decide(nodes, [], queue)
    assert sorted(s.job_id for s in decided.starts) == [10, 13, 14]
    assert decided.waiting[11].reasons[0] == "dependency: waiting for job 2 (afterok)"
    assert {c.job_id: c.reason for c in decided.cancellations} == {
        12: "dependency can never be met: job 3 failed (afterok)",
        15: "dependency can never be met: job 5 completed (afternotok)",
    }
    keep = Policy(POLICY.tiers, replace(POLICY.settings, cancel_unsatisfiable=False), 30.0)
    kept = decide(nodes, [], queue, policy=keep)
    assert kept.cancellations == ()
    assert kept.waiting[12].reasons[0].startswith("dependency can never be met")


def test_array_limit_singleton_and_begin_time() -> None:
    live = [
        RunningJob(1, "u", "normal", "a", ("GPU-a-0",), 1, 0, 0.0, 3600.0, "sweep", 100),
        RunningJob(2, "u", "normal", "a", ("GPU-a-1",), 1, 0, 0.0, 3600.0, "single"),
    ]
    nodes = views({"a": 8}, live)
    queue = [
        wait(10, array_job_id=100, array_max_running=2, name="sweep"),
        wait(11, array_job_id=100, array_max_running=2, name="sweep"),
        wait(12, singleton=True, name="single"),
        wait(13, singleton=True, name="other"),
        wait(14, begin_time=500.0),
    ]
    decided = decide(nodes, live, queue)
    assert sorted(s.job_id for s in decided.starts) == [10, 13]
    assert decided.waiting[11].reasons[0] == "array limit: at most 2 tasks of array 100 run at once"
    assert decided.waiting[12].reasons[0] == "singleton: job 2 named single is running"
    assert decided.waiting[14].reasons[0].startswith("begin time")
    later = decide(nodes, live, [wait(14, begin_time=500.0)], now=600.0)
    assert [s.job_id for s in later.starts] == [14]


def test_all_reasons_are_listed() -> None:
    tiers = dict(default_qos_tiers())
    tiers["normal"] = QosTier("normal", priority=1000, max_running_jobs=1, default_time=3600)
    policy = Policy(tiers, POLICY.settings, 30.0)
    live = [running(1, "a", range(8))]
    nodes = views({"a": 8}, live)
    job = wait(10, gpus=2, dependencies=(dep(2, "ok", JobState.PENDING),))
    reasons = decide(nodes, live, [job], policy=policy).waiting[10].reasons
    assert reasons == (
        "dependency: waiting for job 2 (afterok)",
        "qos normal limit: at most 1 running jobs per user (u runs 1)",
        "needs 2 GPUs on one node; largest free block is 0 (node a)",
    )


def test_a_quiet_pass_stops_early() -> None:
    """With the cluster full, a long queue of one shape costs a few steps, not its length."""
    live = [running(i, "a", [i]) for i in range(8)]
    nodes = views({"a": 8}, live)
    queue = [wait(100 + i) for i in range(10_000)]
    seen = 0

    def counted() -> object:
        nonlocal seen
        for job in queue:
            seen += 1
            yield job

    key = fit_key(Resources(gpus=1), 3600.0, "normal")
    decided = plan(nodes, live, counted(), POLICY, 0.0, shapes={key: len(queue)})  # type: ignore[arg-type]
    assert decided.starts == () and seen <= 3


def test_cpu_and_memory_fit() -> None:
    nodes = views({"a": 2}, cpus=4, mem=16 << 30)
    big = PendingJob(1, "u", "normal", Resources(gpus=1, cpus=8), 0.0, 1.0, 3600.0)
    hungry = PendingJob(2, "u", "normal", Resources(gpus=1, mem=32 << 30), 0.0, 0.5, 3600.0)
    fine = PendingJob(3, "u", "normal", Resources(gpus=1, cpus=4, mem=8 << 30), 0.0, 0.0, 3600.0)
    decided = decide(nodes, [], [big, hungry, fine])
    assert [s.job_id for s in decided.starts] == [3]
    assert decided.waiting[1].reasons == (
        "no node that is up can ever run it (--cpus 8 can never run: the largest node (a) "
        "has 4 CPUs)",
    )


GiB = 1 << 30


def test_a_request_no_one_node_can_hold_names_the_largest_nodes() -> None:
    """Each part fits some node, none fits all at once: the two largest nodes say why."""
    [a] = views({"a": 4}, cpus=4, mem=24 * GiB)
    [b] = views({"b": 1}, cpus=32, mem=256 * GiB)
    [c] = views({"c": 1}, cpus=2, mem=8 * GiB)
    need = Resources(gpus=2, cpus=16)
    assert never_fits_reason([c, b, a], need) == (
        "the request can never run: no node has that combination of GPUs, CPUs and memory "
        "(the largest: a: 4 GPUs, 4 CPUs, 24G, b: 1 GPU, 32 CPUs, 256G)"
    )
    assert never_fits_reason([replace(a, mem=int(23.5 * GiB))], Resources(mem=30 * GiB)) == (
        "--mem 30G can never run: the largest node (a) has 23.5G"
    )
