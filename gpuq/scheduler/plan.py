"""One scheduling pass: a pure function of (nodes, pending jobs) returning what to start and
why every other job waits. Nothing here does I/O; the coordinator applies the plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuq.domain.model import Resources
from gpuq.scheduler.placement import NodeView, choose_units, misfit, shortage


@dataclass(frozen=True, slots=True)
class PendingJob:
    job_id: int
    priority: float
    need: Resources


@dataclass(frozen=True, slots=True)
class Start:
    job_id: int
    node: str
    gpus: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    starts: tuple[Start, ...] = ()
    blocked: dict[int, tuple[str, ...]] = field(default_factory=dict)  # job -> every reason


Shape = tuple[int, int | None, int, int | None]


def shape(need: Resources) -> Shape:
    return (need.gpus, need.gpu_mem, need.cpus, need.mem)


def plan(
    nodes: Sequence[NodeView],
    queue: Iterable[PendingJob],
    shapes: Mapping[Shape, int] | None = None,
) -> Plan:
    """Start jobs in queue order (priority, then submit order), each on its best-fit node.

    Best fit is the node with the fewest free GPUs that still fits, so small jobs fill partly
    used nodes and whole nodes stay whole. Free resources only shrink during a pass, so once a
    shape does not fit, every later job of that shape is blocked for the same reason without
    looking at the nodes again. Given `shapes` (how many queued jobs have each shape), the pass
    stops as soon as every shape still in the queue is blocked: the common case of a full
    cluster and a long queue costs a few steps, not the queue's length. The blocked reasons are
    then only those of the jobs seen; pass no `shapes` to explain every job.
    """
    working = {n.name: n for n in nodes}
    starts: list[Start] = []
    blocked: dict[int, tuple[str, ...]] = {}
    unfit: dict[Shape, str] = {}
    remaining = dict(shapes) if shapes is not None else None
    for job in queue:
        key = shape(job.need)
        if remaining is not None:
            remaining[key] -= 1
        if key in unfit:
            blocked[job.job_id] = (unfit[key],)
            continue
        node = best_fit(list(working.values()), job.need)
        if node is None:
            unfit[key] = shortage(list(working.values()), job.need)
            blocked[job.job_id] = (unfit[key],)
            if remaining is not None and all(k in unfit for k, n in remaining.items() if n > 0):
                break
            continue
        units = choose_units(node, job.need)
        working[node.name] = take(node, units, job.need)
        starts.append(Start(job.job_id, node.name, units))
    return Plan(tuple(starts), blocked)


def best_fit(nodes: list[NodeView], need: Resources) -> NodeView | None:
    fitting = [n for n in nodes if misfit(n, need) is None]
    if not fitting:
        return None
    return min(
        fitting, key=lambda n: (len(n.usable_units(need.gpu_mem)), n.cpus_free, n.mem_free, n.name)
    )


def take(node: NodeView, units: tuple[str, ...], need: Resources) -> NodeView:
    return replace(
        node,
        free_units=node.free_units - set(units),
        cpus_free=node.cpus_free - need.cpus,
        mem_free=node.mem_free - (need.mem or 0),
    )
