"""The shortcuts a pass takes over a long queue change none of its decisions (hypothesis, over
random clusters and queues of one-node and multi-node jobs): the coordinator's early-stopping
pass (fit keys given: it settles kinds of jobs that can neither start nor preempt and stops
once every kind left is settled) and the explaining pass (one reason per kind of job, estimates
for the first explain_limit) start and preempt exactly what a plain pass over every job does,
and the explaining pass gives every job the plain pass's reasons."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st
from scheduling import POLICY, draw_running, views

from gpuq.domain.dependencies import DependencyKind
from gpuq.domain.model import Resources
from gpuq.domain.node_constraints import Placement
from gpuq.domain.states import JobState
from gpuq.scheduler import gang, reserve
from gpuq.scheduler import plan as plan_module
from gpuq.scheduler.fit_keys import fit_key
from gpuq.scheduler.fitting import NodeView, Ways
from gpuq.scheduler.plan import plan
from gpuq.scheduler.preempt import VictimSearch
from gpuq.scheduler.priority import fairshare_factors, rank
from gpuq.scheduler.reserve import Found, FreeNode, Reservation, _soonest_units
from gpuq.scheduler.snapshot import Dependency, PendingJob, Policy, RunningJob
from gpuq.scheduler.waiting_reasons import KindReasons, free_view

TIERS = ["high", "normal", "low"]
NOW = 1000.0

Cluster = tuple[list[NodeView], list[RunningJob], list[PendingJob], Policy]
FreeAt = dict[str, dict[str, float]]


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    sizes = {f"n{i}": draw(st.integers(1, 8)) for i in range(draw(st.integers(1, 5)))}
    running = draw_running(draw, sizes, 10, TIERS, NOW)
    queue = []
    # few kinds of jobs, many of each: as a long queue is
    kinds = [
        Resources(
            gpus=draw(st.integers(1, 8)),
            cpus=draw(st.integers(1, 4)),
            nodes=draw(st.sampled_from([1, 1, 1, 2, 3])),
        )
        for _ in range(draw(st.integers(1, 4)))
    ]
    for i in range(draw(st.integers(1, 30))):
        dependencies: tuple[Dependency, ...] = ()
        if draw(st.integers(0, 9)) == 0:  # one in ten: a dependency, met, not yet, or never
            state = draw(st.sampled_from([JobState.COMPLETED, JobState.RUNNING, JobState.FAILED]))
            dependencies = (Dependency(7, DependencyKind.OK, state),)
        queue.append(
            PendingJob(
                100 + i,
                draw(st.sampled_from("xyz")),
                draw(st.sampled_from(TIERS)),
                draw(st.sampled_from(kinds)),
                NOW - draw(st.integers(0, 5000)),
                time_limit=draw(st.sampled_from([30.0, 300.0, 3000.0, None])),
                dependencies=dependencies,
            )
        )
    down = draw(st.sets(st.sampled_from(sorted(sizes)), max_size=1))
    limit = draw(st.sampled_from([0, 2, 1000]))
    policy = replace(POLICY, settings=replace(POLICY.settings, explain_limit=limit))
    ordered = rank(queue, {"x": 3600.0}, policy.tiers, policy.settings, NOW)
    return views(sizes, running, cpus=8, down=down), running, ordered, policy


def keys(queue: list[PendingJob]) -> Counter[tuple[object, ...]]:
    return Counter(fit_key(j.need, j.time_limit, j.qos, j.user, j.placement) for j in queue)


@settings(max_examples=400, deadline=None)
@given(clusters())
def test_shortcuts_decide_as_a_plain_pass(cluster: Cluster) -> None:
    nodes, running, queue, policy = cluster
    plain = plan(nodes, running, queue, policy, NOW)
    quiet, plan_module.QUIET_JOBS = plan_module.QUIET_JOBS, 1  # the closer look, at once
    try:
        early = plan(nodes, running, queue, policy, NOW, shapes=keys(queue))
    finally:
        plan_module.QUIET_JOBS = quiet
    explained = plan(nodes, running, queue, policy, NOW, explain=True)
    for decided in (early, explained):
        assert decided.starts == plain.starts
        assert decided.preemptions == plain.preemptions
    # the early stop leaves the jobs behind it to a later pass, cancellations too
    assert set(early.cancellations) <= set(plain.cancellations)
    assert explained.cancellations == plain.cancellations
    # (a plain pass gives a job that may not start yet, for its dependency, that reason only,
    # and the reasons of its kind come from a later moment of the pass then)
    if all(d.state is JobState.COMPLETED for j in queue for d in j.dependencies):
        assert explained.waiting.keys() == plain.waiting.keys()
        assert all(explained.waiting[i].reasons == w.reasons for i, w in plain.waiting.items())
    estimated = [i for i, w in explained.waiting.items() if w.estimated_start is not None]
    assert all(plain.waiting[i].estimated_start is None for i in estimated)


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_ranking_is_priority_then_job_id(cluster: Cluster) -> None:
    _, _, queue, policy = cluster
    usage = {"x": 3600.0, "y": 60.0}
    shuffled = sorted(queue, key=lambda j: hash((j.job_id, 7)))
    weights = {name: tier.priority for name, tier in policy.tiers.items()}
    s = policy.settings
    shares = {"x": 0.0, "y": 0.0, "z": 0.0}
    shares.update(fairshare_factors(usage, {j.user for j in queue}))

    def priority(j: PendingJob) -> float:
        age = min(s.weight_age, max(0.0, NOW - j.submit_time) * (s.weight_age / s.max_age))
        return weights.get(j.qos, 0) + age + s.weight_fairshare * shares[j.user] - j.nice

    expected = sorted(queue, key=lambda j: (-priority(j), j.job_id))
    assert rank(shuffled, usage, policy.tiers, s, NOW) == expected


class _PlainRanked:
    """reserve._Ranked without its kept order: every node asked, all sorted, for each job."""

    def __init__(self, up: list[FreeNode], need: Resources, free_at: FreeAt, _: int) -> None:
        self.up, self.need, self.free_at = up, need, free_at

    def refresh(self, *_: object) -> None:
        pass

    def first(self, count: int, only: frozenset[str] | None) -> list[Found] | None:
        found = [
            answer
            for node in self.up
            if (answer := _soonest_units(node, self.need, self.free_at[node.view.name])) is not None
            and (only is None or answer[1] in only)
        ]
        return sorted(found, key=lambda f: f[0])[:count] if len(found) >= count else None


def _plain_by_loss(
    self: VictimSearch, qos: str, reserved: frozenset[str]
) -> list[tuple[float, str, int]]:
    """VictimSearch.by_loss without its kept order: every node asked, all sorted, each time."""
    found = [(name, self.candidates(name, qos, reserved)) for name in self.nodes]
    return sorted((youngest, name, units) for name, (jobs, youngest, units) in found if jobs)


def _fresh_why(
    self: KindReasons, job: PendingJob, only: frozenset[str] | None, top: Reservation | None, _: int
) -> str:
    return self.fresh(job, only, top)


def _plain_ways(need: Resources, view: NodeView) -> Ways:
    sized = gang.per_node(need, view)
    return None if sized is None else (sized, gang.kinds(need, sized, view))


@st.composite
def placed(draw: st.DrawFn) -> Cluster:
    """A cluster whose jobs may name nodes (--nodelist): each step looks at those only."""
    nodes, running, queue, policy = draw(clusters())
    names = [n.name for n in nodes]
    lists = [Placement(nodelist=tuple(draw(st.sets(st.sampled_from(names), min_size=1))))]
    queue = [replace(j, placement=draw(st.sampled_from([Placement(), *lists]))) for j in queue]
    return nodes, running, queue, policy


@settings(max_examples=300, deadline=None)
@given(placed())
def test_kept_answers_are_the_plain_ones(cluster: Cluster) -> None:
    """What a pass keeps to answer again (a kind's reason while nothing changed, a node's free
    view until it changes, a gang need's parts per node, the estimates' order of nodes per
    kind, the nodes by least work lost per preempting tier) gives exactly what asking afresh
    gives: decisions, reasons, estimated starts."""
    nodes, running, queue, policy = cluster

    def passes() -> list[tuple[object, ...]]:
        fresh = [replace(n) for n in nodes]  # no answers kept on the views from before
        found: list[tuple[object, ...]] = []
        for how in ({}, {"explain": True}, {"shapes": keys(queue)}):
            d = plan(fresh, running, queue, policy, NOW, **how)
            waiting = sorted((i, w.reasons, w.estimated_start) for i, w in d.waiting.items())
            found.append((d.starts, d.preemptions, d.cancellations, waiting))
        return found

    kept = passes()
    with (
        patch.object(
            KindReasons, "why", lambda self, job, only, top, _: self.fresh(job, only, top)
        ),
        patch.object(KindReasons, "free_view", lambda _, node: free_view(node)),
        patch.object(gang, "ways", _plain_ways),
        patch.object(reserve, "_Ranked", _PlainRanked),
        patch.object(VictimSearch, "by_loss", _plain_by_loss),
    ):
        plain = passes()
    assert kept == plain
