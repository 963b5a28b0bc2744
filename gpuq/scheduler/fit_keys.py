"""Kinds of queued jobs: the fit key, and the tests that let a pass over a long queue stop
looking at a kind of job (settle it) before meeting every job of it.

Jobs with one fit key fit, or preempt, the same way during a pass. A kind is settled when no
job of it can start nor preempt for the rest of the pass: that only ever becomes more true
within a pass (free resources and victims only shrink, reservations only grow), so settling
it early changes no decision; it only lets the pass stop sooner (gpuq.scheduler.plan).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping

from gpuq.domain.model import Resources
from gpuq.domain.node_constraints import Placement
from gpuq.scheduler.fitting import ANYWHERE
from gpuq.scheduler.reserve import FreeNode, Reservation

FitKey = tuple[
    int,
    int | None,
    int,
    int | None,
    float | None,
    str,
    str | None,
    int | None,
    str,
    str | None,
    Placement | None,
    int,
    bool,
    bool,
]


def fit_key(
    need: Resources,
    time_limit: float | None,
    qos: str,
    user: str = "",
    placement: Placement = ANYWHERE,
) -> FitKey:
    """Jobs with the same key fit, or preempt, the same way during a pass (a share's fit
    depends on its user too: one user's shares at a time on a unit; a GPU type and a
    placement narrow where a job fits; so do the number of nodes and whole-node requests).
    No placement is None in the key: keys are hashed and compared for every queued job (so
    is this made for each: Placement.__bool__'s test inline, without its call)."""
    share = need.gpu_share
    return (
        need.gpus,
        need.gpu_mem,
        need.cpus,
        need.mem,
        time_limit,
        qos,
        need.mig,
        share,
        user if share is not None else "",
        need.gpu_type,
        placement
        if placement.nodelist or placement.exclude or placement.constraint or placement.partitions
        else None,
        need.nodes,
        need.exclusive,
        need.mem_all,
    )


def most_room(nodes: Iterable[FreeNode]) -> tuple[int, int]:
    """The most free units, and the most free CPUs, of any node that is up."""
    up = [n for n in nodes if n.view.up]
    return max((len(n.units) for n in up), default=0), max((n.cpus for n in up), default=0)


def hopeless(
    keys: Iterable[FitKey], room: tuple[int, int], may_preempt: Callable[[str], bool]
) -> list[FitKey]:
    """The kinds that no node has room for now (more GPUs or CPUs than any node has free:
    `room` is `most_room`) and that have nobody to preempt (`may_preempt(qos)`)."""
    block, cpus = room
    found = []
    for key in keys:
        gpus, _, need_cpus, _, _, qos, _, share, *_ = key
        # a share may join a unit that is not free: only its CPUs can rule it out here
        no_room = (gpus > block and share is None) or need_cpus > cpus
        if no_room and not may_preempt(qos):
            found.append(key)
    return found


def blocked(
    keys: Iterable[FitKey],
    nodes: Mapping[str, FreeNode],
    reservations: Iterable[Reservation],
    now: float,
    allowed: Callable[[Placement], Collection[str] | None],
    may_preempt: Callable[[str], bool],
) -> list[FitKey]:
    """A closer look than `hopeless`: the kinds (of whole GPUs) with nobody to preempt for
    which fewer nodes than they need have as many units free outside the reservations a job
    of theirs would overlap (it would end after their start). `allowed(placement)`: the
    names of the nodes a placement allows (None: all)."""
    held: dict[str, list[Reservation]] = {}
    for reservation in reservations:
        held.setdefault(reservation.node, []).append(reservation)
    blocks: dict[tuple[float, Placement | None], list[int]] = {}
    found = []
    for key in keys:
        gpus, _, _, _, limit, qos, _, share, _, _, placement, count, *_ = key
        if share is not None or not gpus or may_preempt(qos):
            continue
        end = now + limit if limit else math.inf
        open_units = blocks.get((end, placement))
        if open_units is None:
            only = allowed(placement or ANYWHERE)
            open_units = blocks[(end, placement)] = _open_units(nodes, held, end, only)
        if len(open_units) < count or open_units[count - 1] < gpus:
            found.append(key)
    return found


def _open_units(
    nodes: Mapping[str, FreeNode],
    held: Mapping[str, list[Reservation]],
    end: float,
    only: Collection[str] | None,
) -> list[int]:
    """Per node that is up (of `only`, None: all), how many of its free units no reservation
    holds that a job ending at `end` would overlap; largest first."""
    counts = []
    for name, node in nodes.items():
        if not node.units or not node.view.up or (only is not None and name not in only):
            continue
        taken = [r.units for r in held.get(name, ()) if end > r.start]
        counts.append(len(node.units.difference(*taken)) if taken else len(node.units))
    counts.sort(reverse=True)
    return counts
