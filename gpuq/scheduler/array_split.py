"""How many tasks of a waiting array to split off its record before a pass: enough to fill
what is free now (and its `%N` limit allows), plus one that waits and so carries the array's
reasons, reservation or preemption. The rest stay in the record, one entry however many."""

from __future__ import annotations

from collections.abc import Iterable

from gpuq.domain.model import Resources
from gpuq.domain.node_constraints import Placement
from gpuq.scheduler.fitting import ANYWHERE, NodeView, allowed

MAX_SPLIT = 1000  # tasks split off one array in one pass: the next pass splits more


def room_for(need: Resources, views: Iterable[NodeView], placement: Placement = ANYWHERE) -> int:
    """How many jobs of this size fit in what is free now, node by node, on the nodes the
    tasks' placement allows (an upper bound: GPU topology, reservations, GPU types across a
    multi-node task's nodes and --exclusive may leave fewer)."""
    total = 0
    for view in views:
        if not view.up or allowed(view, placement) is not None:
            continue
        fits = [view.cpus_free // need.cpus]
        if need.mem:
            fits.append(view.mem_free // need.mem)
        if need.gpu_share is not None:  # shares of one GPU: as many as its compute allows
            fits.append(len(view.usable_units(need)) * (100 // need.gpu_share))
        elif need.gpus:
            fits.append(len(view.usable_units(need)) // need.gpus)
        total += max(0, min(fits))
        if total >= MAX_SPLIT * need.nodes:
            return MAX_SPLIT
    return total // need.nodes  # a task of N nodes takes room on N of them


def tasks_to_split(
    need: Resources,
    views: Iterable[NodeView],
    *,
    left: int,
    queued: int,
    running: int,
    max_running: int | None,
    blocked: bool,
    placement: Placement = ANYWHERE,
) -> int:
    """How many of the `left` tasks in the record to split off now, given `queued` tasks of
    the array already split and waiting and `running` ones. A `blocked` array (begin time,
    dependencies) needs only the one waiting task that shows why."""
    if blocked:
        wanted = 1
    else:
        room = room_for(need, views, placement)
        if max_running is not None:
            room = min(room, max(0, max_running - running))
        wanted = room + 1
    return max(0, min(left, wanted - queued, MAX_SPLIT))
