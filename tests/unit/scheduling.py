"""Plain builders for scheduler tests: nodes, running and pending jobs, no server."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gpuq.domain.model import GpuUnit, Resources
from gpuq.domain.policy import SchedulerSettings, default_qos_tiers
from gpuq.scheduler.fitting import NodeView
from gpuq.scheduler.snapshot import PendingJob, Policy, RunningJob

GiB = 1 << 30
POLICY = Policy(default_qos_tiers(), SchedulerSettings(), kill_grace=30.0)


def units(node: str, count: int, memory: int = 80 * GiB) -> tuple[GpuUnit, ...]:
    return tuple(
        GpuUnit(f"GPU-{node}-{i}", i, "NVIDIA A100", memory, f"0000:{i:02x}:00.0")
        for i in range(count)
    )


def views(
    sizes: dict[str, int],
    running: Iterable[RunningJob] = (),
    cpus: int = 64,
    mem: int = 512 * GiB,
    down: Iterable[str] = (),
) -> list[NodeView]:
    """Nodes with `sizes[name]` GPUs; what `running` holds is not free."""
    jobs = list(running)
    result = []
    for name, count in sizes.items():
        mine = [j for j in jobs if j.node == name]
        taken = {u for j in mine for u in j.gpus}
        all_units = units(name, count)
        result.append(
            NodeView(
                name=name,
                up=name not in set(down),
                units=all_units,
                free_units=frozenset(u.uuid for u in all_units) - taken,
                cpus=cpus,
                cpus_free=cpus - sum(j.cpus for j in mine),
                mem=mem,
                mem_free=mem - sum(j.mem for j in mine),
                distances={},
            )
        )
    return result


def run(
    job_id: int,
    node: str,
    gpus: Iterable[int],
    start: float = 0.0,
    limit: float = 3600.0,
    qos: str = "normal",
    user: str = "u",
    stopping: bool = False,
) -> RunningJob:
    return RunningJob(
        job_id=job_id,
        user=user,
        qos=qos,
        node=node,
        gpus=tuple(f"GPU-{node}-{i}" for i in gpus),
        cpus=1,
        mem=0,
        start_time=start,
        end_estimate=start + limit,
        stopping=stopping,
    )


def wait(
    job_id: int,
    gpus: int = 1,
    limit: float | None = 3600.0,
    qos: str = "normal",
    user: str = "u",
    priority: float | None = None,
    **extra: object,
) -> PendingJob:
    return PendingJob(
        job_id=job_id,
        user=user,
        qos=qos,
        need=Resources(gpus=gpus),
        submit_time=0.0,
        priority=-job_id if priority is None else priority,
        time_limit=limit,
        **extra,  # type: ignore[arg-type]
    )


def draw_running(
    draw: Any, sizes: dict[str, int], most: int, tiers: Sequence[str], now: float
) -> list[RunningJob]:
    """Hypothesis: up to `most` running jobs, each on one or two of the nodes (`sizes`: units
    per node), holding some of each node's units, started before `now` in one of `tiers`."""
    from hypothesis import strategies as st

    free = {name: list(range(count)) for name, count in sizes.items()}
    running: list[RunningJob] = []
    for job_id in range(1, draw(st.integers(0, most)) + 1):
        width = draw(st.integers(1, 2))
        hosts = [n for n in sizes if free[n]]
        if len(hosts) < width:
            break
        chosen = draw(st.permutations(hosts))[:width]
        start = now - draw(st.integers(0, 5000))
        end = max(now + 1, start + draw(st.sampled_from([60.0, 600.0, 3600.0])))
        qos = draw(st.sampled_from(list(tiers)))
        for name in chosen:
            take = draw(st.integers(1, len(free[name])))
            held, free[name] = free[name][:take], free[name][take:]
            units = tuple(f"GPU-{name}-{i}" for i in held)
            running.append(
                RunningJob(job_id, "x", qos, name, units, 1, GiB, start, end, nodes=width)
            )
    return running
