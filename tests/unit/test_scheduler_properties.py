"""Properties of the pure scheduler over random clusters and queues (hypothesis):
it never over-allocates, never starts a lower job that delays the top job's reservation, and
preempts only preemptible jobs of lower tiers, and only when the preemptor then starts."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from scheduling import POLICY, views

from gpuq.domain.model import Resources
from gpuq.scheduler.fitting import NodeView
from gpuq.scheduler.plan import plan
from gpuq.scheduler.snapshot import Decisions, PendingJob, RunningJob

TIERS = ["high", "normal", "low"]
NOW = 1000.0


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[NodeView], list[RunningJob], list[PendingJob]]:
    sizes = {f"n{i}": draw(st.integers(1, 8)) for i in range(draw(st.integers(1, 4)))}
    running: list[RunningJob] = []
    job_id = 1
    for name, count in sizes.items():
        free = list(range(count))
        while free and draw(st.booleans()):
            take = draw(st.integers(1, len(free)))
            held, free = free[:take], free[take:]
            start = NOW - draw(st.integers(0, 5000))
            limit = draw(st.sampled_from([60.0, 600.0, 3600.0]))
            running.append(
                RunningJob(
                    job_id,
                    draw(st.sampled_from("xy")),
                    draw(st.sampled_from(TIERS)),
                    name,
                    tuple(f"GPU-{name}-{i}" for i in held),
                    1,
                    0,
                    start,
                    max(NOW + 1, start + limit),
                    stopping=draw(st.booleans()) and False,
                )
            )
            job_id += 1
    queue = [
        PendingJob(
            100 + i,
            draw(st.sampled_from("xyz")),
            draw(st.sampled_from(TIERS)),
            Resources(gpus=draw(st.integers(0, 8)), cpus=draw(st.integers(1, 4))),
            0.0,
            priority=draw(st.integers(0, 5)),
            time_limit=draw(st.sampled_from([30.0, 300.0, 3000.0])),
        )
        for i in range(draw(st.integers(1, 12)))
    ]
    queue.sort(key=lambda j: (-j.priority, j.job_id))
    return views(sizes, running, cpus=8), running, queue


def decide(cluster: tuple[list[NodeView], list[RunningJob], list[PendingJob]]) -> Decisions:
    nodes, running, queue = cluster
    return plan(nodes, running, queue, POLICY, NOW, explain=True)


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_never_over_allocates(
    cluster: tuple[list[NodeView], list[RunningJob], list[PendingJob]],
) -> None:
    nodes, _, queue = cluster
    decided = decide(cluster)
    by_name = {n.name: n for n in nodes}
    need = {j.job_id: j.need for j in queue}
    given_units = [u for s in decided.starts for u in s.gpus]
    assert len(given_units) == len(set(given_units)), "a unit was given twice"
    cpus: Counter[str] = Counter()
    for start in decided.starts:
        node = by_name[start.node]
        assert node.up
        assert set(start.gpus) <= node.free_units, "started on a unit that is not free"
        assert len(start.gpus) == need[start.job_id].gpus
        cpus[start.node] += need[start.job_id].cpus
    for name, used in cpus.items():
        assert used <= by_name[name].cpus_free


def earliest_fit(
    need: Resources, nodes: list[NodeView], running: list[tuple[str, tuple[str, ...], int, float]]
) -> float:
    """An oracle, independent of the scheduler's code: the earliest time `need` fits on one
    node, given every job's (node, units, cpus, end)."""
    best = math.inf
    for node in nodes:
        if not node.up:
            continue
        mine = [r for r in running if r[0] == node.name]
        for moment in sorted({NOW} | {end for *_, end in mine}):
            busy = {u for _, units, _, end in mine if end > moment for u in units}
            cpus = node.cpus - sum(c for _, _, c, end in mine if end > moment)
            if len({u.uuid for u in node.units} - busy) >= need.gpus and cpus >= need.cpus:
                best = min(best, moment)
                break
    return best


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_backfill_never_delays_the_top_job(
    cluster: tuple[list[NodeView], list[RunningJob], list[PendingJob]],
) -> None:
    nodes, running, queue = cluster
    decided = decide(cluster)
    started = {s.job_id for s in decided.starts}
    blocked = [j for j in queue if j.job_id not in started]
    if decided.preemptions or not blocked:
        return
    top = blocked[0]
    before = [(r.node, r.gpus, r.cpus, r.end_estimate) for r in running]
    limits = {j.job_id: j for j in queue}
    after = before + [
        (s.node, s.gpus, limits[s.job_id].need.cpus, NOW + (limits[s.job_id].time_limit or 0))
        for s in decided.starts
        if queue.index(limits[s.job_id]) > queue.index(top)
    ]
    higher = [
        (s.node, s.gpus, limits[s.job_id].need.cpus, NOW + (limits[s.job_id].time_limit or 0))
        for s in decided.starts
        if queue.index(limits[s.job_id]) < queue.index(top)
    ]
    reserved = earliest_fit(top.need, nodes, before + higher)
    assert earliest_fit(top.need, nodes, after + higher) <= reserved, (
        f"lower jobs delayed job {top.job_id} past {reserved}"
    )


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_preemption_only_of_lower_preemptible_tiers_and_only_when_it_lets_the_job_start(
    cluster: tuple[list[NodeView], list[RunningJob], list[PendingJob]],
) -> None:
    nodes, running, queue = cluster
    decided = decide(cluster)
    by_id = {r.job_id: r for r in running}
    pending = {j.job_id: j for j in queue}
    tiers = POLICY.tiers
    for preemptor in {p.preemptor for p in decided.preemptions}:
        job = pending[preemptor]
        victims = [by_id[p.victim] for p in decided.preemptions if p.preemptor == preemptor]
        for victim in victims:
            assert tiers[victim.qos].preemptible
            assert tiers[victim.qos].priority < tiers[job.qos].priority
        [node_name] = {p.node for p in decided.preemptions if p.preemptor == preemptor}
        node = next(n for n in nodes if n.name == node_name)
        gone = {v.job_id for v in victims}
        others = [r for r in running if r.job_id not in gone] + [
            RunningJob(
                s.job_id,
                "",
                "",
                s.node,
                s.gpus,
                pending[s.job_id].need.cpus,
                0,
                NOW,
                NOW + (pending[s.job_id].time_limit or 0),
            )
            for s in decided.starts
        ]
        after_grace = NOW + POLICY.kill_grace
        busy = {
            u
            for r in others
            if r.node == node_name and r.end_estimate > after_grace
            for u in r.gpus
        }
        cpus = node.cpus - sum(
            r.cpus for r in others if r.node == node_name and r.end_estimate > after_grace
        )
        assert len({u.uuid for u in node.units} - busy) >= job.need.gpus
        assert cpus >= job.need.cpus
