"""Scheduler benchmark: one pass of the pure scheduler over 128 nodes x 8 GPUs with 1,000 /
10,000 / 100,000 pending jobs. Prints figures (medians of 5), asserts nothing.

    python bench/scheduler_bench.py           # everything, then issue 27's rows
    python bench/scheduler_bench.py --rows    # issue 27's rows only (CPU ms, medians of 5)

For each queue length:
  rank      multifactor priorities for the whole queue, sorted (the coordinator redoes this
            every priority_interval, not every pass);
  explain   every pending job's reasons, and estimated starts for the first explain_limit;
  a pass on three clusters: full (nothing can start: reserve for the top job, stop early),
  mixed (some starts, and high-tier jobs preempting low ones), idle (about 1,000 GPUs fill);
  and the next pass after that one's decisions took effect (nothing changed meanwhile).
Then the same three clusters with a queue of mixed one-node and multi-node jobs (80% one node
with 1-8 GPUs, 20% 2-4 nodes x 8 GPUs; gpuq.scheduler.gang), at 10,000 and 100,000 pending.

Issue 27's rows (targets on a 2-core machine), on that mixed queue and the mixed cluster, in
CPU milliseconds of this process (the machine may be busy; wall time is shown beside):
a scheduling pass (the coordinator's: early stop by fit keys) <= 50 ms at 10,000 pending and
<= 250 ms at 100,000; ranking 100,000 <= 100 ms; explaining 100,000 <= 300 ms.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))

from scheduling import POLICY, views

from gpuq.domain.model import Resources
from gpuq.scheduler.fit_keys import FitKey, fit_key
from gpuq.scheduler.plan import plan
from gpuq.scheduler.priority import rank
from gpuq.scheduler.snapshot import Decisions, PendingJob, RunningJob

NODES = {f"node{i:03d}": 8 for i in range(128)}
NOW = 1_000_000.0


def busy_cluster(rng: random.Random, fraction: float, tiers: list[str]) -> list[RunningJob]:
    """Running jobs on `fraction` of the GPUs, of random sizes, users, tiers and ends."""
    running = []
    job_id = 1
    for name in NODES:
        free = list(range(8))
        while len(free) > round(8 * (1 - fraction)):
            take = min(len(free) - round(8 * (1 - fraction)), rng.choice([1, 1, 2, 4, 8]))
            held, free = free[:take], free[take:]
            start = NOW - rng.uniform(0, 20000)
            running.append(
                RunningJob(
                    job_id,
                    f"user{rng.randrange(20)}",
                    rng.choice(tiers),
                    name,
                    tuple(f"GPU-{name}-{i}" for i in held),
                    1,
                    0,
                    start,
                    start + rng.choice([3600, 14400, 86400]),
                )
            )
            job_id += 1
    return running


def queued(jobs: list[PendingJob]) -> list[PendingJob]:
    """The jobs as the coordinator hands them to a pass: each with the fit key made when it
    was queued (gpuq.coordinator.memory.live_jobs), not by every pass."""
    return [replace(j, fit=fit_key(j.need, j.time_limit, j.qos, j.user, j.placement)) for j in jobs]


def shapes_of(jobs: list[PendingJob]) -> Counter[FitKey]:
    """How many jobs of each fit key are queued (LiveJobs.shapes)."""
    return Counter(j.fit for j in jobs if j.fit is not None)


def queue(rng: random.Random, count: int) -> list[PendingJob]:
    return queued(
        [
            PendingJob(
                10_000 + i,
                f"user{rng.randrange(20)}",
                rng.choice(["high", "normal", "normal", "low"]),
                Resources(gpus=rng.choice([1, 1, 1, 2, 4, 8])),
                NOW - rng.uniform(0, 86400),
                time_limit=rng.choice([3600.0, 14400.0, 86400.0]),
            )
            for i in range(count)
        ]
    )


def gang_queue(rng: random.Random, count: int) -> list[PendingJob]:
    """80% one-node jobs of 1-8 GPUs, 20% jobs of 2-4 whole nodes' GPUs (8 each)."""
    jobs = []
    for i in range(count):
        if rng.random() < 0.8:
            need = Resources(gpus=rng.choice([1, 1, 1, 2, 4, 8]))
        else:
            need = Resources(gpus=8, nodes=rng.choice([2, 2, 3, 4]))
        jobs.append(
            PendingJob(
                10_000 + i,
                f"user{rng.randrange(20)}",
                rng.choice(["high", "normal", "normal", "low"]),
                need,
                NOW - rng.uniform(0, 86400),
                time_limit=rng.choice([3600.0, 14400.0, 86400.0]),
            )
        )
    return queued(jobs)


def timed(fn: Callable[[], object], repeat: int = 5) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), result


def cpu_timed(fn: Callable[[], object], repeat: int = 5) -> tuple[float, float]:
    """Median CPU and wall milliseconds of `repeat` calls."""
    cpu, wall = [], []
    for _ in range(repeat):
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        fn()
        cpu.append((time.process_time() - start_cpu) * 1000)
        wall.append((time.perf_counter() - start_wall) * 1000)
    return statistics.median(cpu), statistics.median(wall)


def issue_rows() -> None:
    """Issue 27's rows: the mixed pass at 10k and 100k pending, ranking and explaining 100k."""
    rng = random.Random(27)
    busy_cluster(rng, 1.0, ["normal"])  # as main() draws: the same mixed cluster
    mixed = busy_cluster(rng, 0.9, ["normal", "low"])
    usage = {f"user{i}": rng.uniform(0, 1e6) for i in range(20)}
    nodes = views(NODES, mixed)
    rows = []
    for count, target in ((10_000, 50.0), (100_000, 250.0)):
        pending = gang_queue(rng, count)
        ordered = rank(pending, usage, POLICY.tiers, POLICY.settings, NOW)
        shapes = shapes_of(ordered)
        figures = cpu_timed(
            lambda o=ordered, s=shapes: plan(nodes, mixed, o, POLICY, NOW, shapes=s)
        )
        rows.append((f"scheduler pass, mixed, {count // 1000}k pending", target, figures))
    rows.append(
        (
            "ranking 100k pending",
            100.0,
            cpu_timed(lambda: rank(pending, usage, POLICY.tiers, POLICY.settings, NOW)),
        )
    )
    rows.append(
        (
            "explaining 100k pending",
            300.0,
            cpu_timed(lambda: plan(nodes, mixed, ordered, POLICY, NOW, explain=True)),
        )
    )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        "issue 27 rows: 128 nodes x 8 GPUs, 90% busy (half low tier), queue 80% one-node, "
        f"20% 2-4 nodes; medians of 5; load average {load}"
    )
    for label, target, (cpu, wall) in rows:
        print(
            f"  {label:<36} {cpu:7.1f} ms CPU ({wall:7.1f} ms wall); target {target:5.0f} ms, "
            f"{cpu / target:4.2f} x the target"
        )


def applied(
    running: list[RunningJob], decided: Decisions, ordered: list[PendingJob]
) -> list[RunningJob]:
    """The running jobs after a pass's decisions took effect (victims now stopping)."""
    victims = {p.victim for p in decided.preemptions}
    by_id = {j.job_id: j for j in ordered}
    after = [
        replace(r, stopping=True, end_estimate=NOW + 30) if r.job_id in victims else r
        for r in running
    ]
    for start in decided.starts:
        job = by_id[start.job_id]
        for node, units in start.parts:  # one per node of a multi-node job
            after.append(
                RunningJob(
                    job.job_id,
                    job.user,
                    job.qos,
                    node,
                    units,
                    1,
                    0,
                    NOW,
                    NOW + (job.time_limit or 0),
                    nodes=len(start.parts),
                )
            )
    return after


def scenario(
    label: str, running: list[RunningJob], ordered: list[PendingJob], shapes: Counter[FitKey]
) -> str:
    nodes = views(NODES, running)
    ms, decided = timed(lambda: plan(nodes, running, ordered, POLICY, NOW, shapes=shapes))
    assert isinstance(decided, Decisions)
    started = {s.job_id for s in decided.starts}
    rest = [j for j in ordered if j.job_id not in started]
    after = applied(running, decided, ordered)
    rest_shapes = shapes_of(rest)
    again_ms, _ = timed(
        lambda: plan(views(NODES, after), after, rest, POLICY, NOW, shapes=rest_shapes)
    )
    return (
        f"{label} {ms:6.1f} ms ({len(decided.starts)} starts, "
        f"{len(decided.preemptions)} preemptions; next pass {again_ms:5.1f} ms)"
    )


def main() -> None:
    rng = random.Random(7)
    full = busy_cluster(rng, 1.0, ["normal"])
    mixed = busy_cluster(rng, 0.9, ["normal", "low"])
    usage = {f"user{i}": rng.uniform(0, 1e6) for i in range(20)}
    print(
        "128 nodes x 8 GPUs. full: every GPU busy with normal-tier jobs; mixed: 90% busy, "
        "half of it preemptible (low); idle: nothing running"
    )
    for count in (1_000, 10_000, 100_000):
        pending = queue(rng, count)
        rank_ms, ranked = timed(
            lambda p=pending: rank(p, usage, POLICY.tiers, POLICY.settings, NOW), repeat=3
        )
        ordered: list[PendingJob] = ranked  # type: ignore[assignment]
        shapes = shapes_of(ordered)
        explain_ms, _ = timed(
            lambda o=ordered: plan(views(NODES, mixed), mixed, o, POLICY, NOW, explain=True),
            repeat=3,
        )
        print(f"{count:>7} pending: rank {rank_ms:6.1f} ms; explain (mixed) {explain_ms:7.1f} ms")
        for label, running in (("full ", full), ("mixed", mixed), ("idle ", [])):
            print("         " + scenario(label, running, ordered, shapes), flush=True)
    print("mixed one-node and multi-node queue (80% 1 node x 1-8 GPUs, 20% 2-4 nodes x 8 GPUs)")
    for count in (10_000, 100_000):
        ordered = rank(gang_queue(rng, count), usage, POLICY.tiers, POLICY.settings, NOW)
        shapes = shapes_of(ordered)
        explain_ms, _ = timed(
            lambda o=ordered: plan(views(NODES, mixed), mixed, o, POLICY, NOW, explain=True),
            repeat=3,
        )
        print(f"{count:>7} pending: explain (mixed) {explain_ms:7.1f} ms")
        for label, running in (("full ", full), ("mixed", mixed), ("idle ", [])):
            print("         " + scenario(label, running, ordered, shapes), flush=True)


if __name__ == "__main__":
    if "--rows" not in sys.argv[1:]:
        main()
    issue_rows()
