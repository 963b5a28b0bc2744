"""Properties of gang scheduling over random clusters and queues of mixed one-node and
multi-node jobs (hypothesis): a start has exactly its job's nodes, each with the job's units,
no unit or CPU is given twice, and a waiting two-node job at the head of the queue is not
starved by a stream of small jobs."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from scheduling import POLICY, GiB, draw_running, views

from gpuq.domain.gpu_types import gpu_type
from gpuq.domain.model import GpuUnit, Resources
from gpuq.scheduler.fitting import NodeView
from gpuq.scheduler.plan import plan
from gpuq.scheduler.snapshot import PendingJob, RunningJob

TIERS = ["high", "normal", "low"]
NOW = 1000.0
MODELS = ["NVIDIA A100", "NVIDIA H100 80GB HBM3"]

Cluster = tuple[list[NodeView], list[RunningJob], list[PendingJob]]


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    sizes = {f"n{i}": draw(st.integers(1, 8)) for i in range(draw(st.integers(1, 6)))}
    models = {name: draw(st.sampled_from(MODELS)) for name in sizes}
    running = draw_running(draw, sizes, 8, TIERS, NOW)
    queue = []
    for i in range(draw(st.integers(1, 12))):
        nodes = draw(st.sampled_from([1, 1, 1, 2, 3]))
        whole = draw(st.sampled_from(["", "", "", "exclusive", "mem_all"]))
        need = Resources(
            gpus=draw(st.integers(0 if whole else 1, 8)),
            cpus=draw(st.integers(1, 4)),
            nodes=nodes,
            exclusive=whole == "exclusive",
            mem_all=whole == "mem_all",
            mem=None if whole else draw(st.sampled_from([None, GiB, 8 * GiB])),
        )
        queue.append(
            PendingJob(
                100 + i,
                draw(st.sampled_from("xyz")),
                draw(st.sampled_from(TIERS)),
                need,
                0.0,
                priority=draw(st.integers(0, 5)),
                time_limit=draw(st.sampled_from([30.0, 300.0, 3000.0])),
            )
        )
    queue.sort(key=lambda j: (-j.priority, j.job_id))
    nodes = [
        replace(
            v,
            units=tuple(
                GpuUnit(u.uuid, u.index, models[v.name], u.memory, u.pci_bus_id) for u in v.units
            ),
        )
        for v in views(sizes, running, cpus=8, mem=16 * GiB)
    ]
    return nodes, running, queue


@settings(max_examples=400, deadline=None)
@given(clusters())
def test_gang_starts_are_whole_and_never_over_allocate(cluster: Cluster) -> None:
    nodes, running, queue = cluster
    decided = plan(nodes, running, queue, POLICY, NOW, explain=True)
    by_name = {n.name: n for n in nodes}
    need = {j.job_id: j.need for j in queue}
    given_units: list[str] = []
    cpus: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    on: defaultdict[str, list[int]] = defaultdict(list)
    for start in decided.starts:
        asked = need[start.job_id]
        names = [n for n, _ in start.parts]
        assert len(names) == asked.nodes == len(set(names)), "exactly its nodes, distinct"
        types = set()
        for name, units in start.parts:
            node = by_name[name]
            assert node.up
            assert set(units) <= node.free_units, "a unit a running job holds"
            whole = asked.exclusive
            assert len(units) == (len(node.units) if whole else asked.gpus)
            given_units += units
            cpus[name] += node.cpus if whole else asked.cpus
            mem[name] += node.mem if whole or asked.mem_all else asked.mem or 0
            on[name].append(start.job_id)
            if whole:
                assert node.cpus_free == node.cpus and node.free_units == {
                    u.uuid for u in node.units
                }, "an exclusive job on a busy node"
            types |= {gpu_type(u.name) for u in node.units if u.uuid in units}
        if asked.nodes > 1:
            assert len(types) <= 1, "one job's nodes mix GPU types"
    assert len(given_units) == len(set(given_units)), "a unit was given twice"
    for name in cpus:
        assert cpus[name] <= by_name[name].cpus_free
        assert mem[name] <= by_name[name].mem_free
    for jobs in on.values():
        if any(need[j].exclusive for j in jobs):
            assert len(jobs) == 1, "a job beside an exclusive one"
    victims = [p.victim for p in decided.preemptions]
    assert len(victims) == len(set(victims)), "a victim preempted twice"
    first = {}
    for r in running:
        first.setdefault(r.job_id, r.node)
    for p in decided.preemptions:
        assert p.node == first[p.victim]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 4),
    st.lists(st.sampled_from([50.0, 100.0, 400.0, 1000.0]), min_size=40, max_size=40),
    st.lists(st.integers(1, 3), min_size=30, max_size=30),
)
def test_a_waiting_two_node_job_is_not_starved_by_small_jobs(
    width: int, limits: list[float], arrivals: list[int]
) -> None:
    sizes = {f"n{i}": 4 for i in range(width)}
    now = 0.0
    running = [
        RunningJob(i + 1, "x", "normal", name, (f"GPU-{name}-{g}",), 1, 0, now, limit)
        for i, (name, g, limit) in enumerate(
            (name, g, limits[(i * 4 + g) % len(limits)])
            for i, name in enumerate(sizes)
            for g in range(4)
        )
    ]
    top = PendingJob(
        1000, "y", "normal", Resources(gpus=4, nodes=2), 0.0, priority=100, time_limit=500.0
    )
    queue: list[PendingJob] = [top]
    next_id = 2000
    promised: float | None = None
    for step in range(30):
        for _ in range(arrivals[step]):
            queue.append(
                PendingJob(
                    next_id,
                    "z",
                    "normal",
                    Resources(gpus=1),
                    now,
                    priority=-next_id,
                    time_limit=limits[next_id % len(limits)],
                )
            )
            next_id += 1
        decided = plan(views(sizes, running), running, queue, POLICY, now, explain=True)
        started = {s.job_id: s for s in decided.starts}
        if top.job_id in started:
            assert promised is None or now <= promised
            return
        if promised is None:
            promised = decided.waiting[top.job_id].estimated_start
            assert promised is not None, "a two-node job on a cluster with ends gets a time"
        by_id = {j.job_id: j for j in queue}
        for start in decided.starts:
            job = by_id[start.job_id]
            running.append(
                RunningJob(
                    job.job_id,
                    job.user,
                    job.qos,
                    start.node,
                    start.gpus,
                    1,
                    0,
                    now,
                    now + (job.time_limit or 0),
                )
            )
        queue = [j for j in queue if j.job_id not in started]
        ends = sorted({r.end_estimate for r in running if r.end_estimate > now})
        now = ends[0] if ends else now + 10
        running = [r for r in running if r.end_estimate > now]
    assert promised is not None and now <= promised, "the two-node job never started"
