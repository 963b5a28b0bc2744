"""Plain builders for scheduler tests: nodes, running and pending jobs, no server."""

from __future__ import annotations

from collections.abc import Iterable

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
