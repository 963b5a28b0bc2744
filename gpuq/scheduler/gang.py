"""Gang placement: jobs that take several nodes at once (--nodes N), or whole nodes
(--exclusive, --mem=0), during one pass.

A gang job starts on N distinct nodes together or not at all. Each node must give the job's
per-node need (`Resources.gpus`, `cpus`, `mem` are per node); the nodes are chosen best-fit
(the fewest free units that still fit, then CPUs, memory, name: deterministic), and the units
chosen on all of them are of one GPU type (a job that names a type gets that type anyway; a
one-node job may mix types on its node, as before).

--exclusive: a node qualifies only when nothing runs on it (every unit free and ok, every CPU
and byte free, no MPS share) and it has at least `need.gpus` units the job may use; the job
then takes all of them, all its CPUs and all its memory. --mem=0 (`mem_all`): the node's
whole memory must be free, and the job takes it. Both apply to one-node jobs too. A node's
need for such a job is `per_node`: the job's need with the node's sizes filled in, so the rest
of the scheduler (reservations, backfill, preemption) treats it as any other need.

Placement for a gang job is "only these nodes": --nodelist names the nodes it may use, as for
a one-node job (SLURM's "every one of these must be included" is not gpuq's meaning).

Reservations (`soonest`): the job starts when N nodes can all hold it, the N-th smallest of the
nodes' own earliest times; the units are reserved on each of those nodes from that start.
Preemption (`victims_across`): every one of N nodes must be freed by victims on it; the N
nodes chosen lose the least work (a victim that spans nodes counts once and is stopped whole).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import lru_cache

from gpuq.domain.gpu_types import gpu_type
from gpuq.domain.model import GpuUnit, Resources
from gpuq.domain.node_constraints import Placement
from gpuq.scheduler.fitting import (
    MAX_NAMED,
    NodeView,
    Ways,
    allowed,
    choose_units,
    kind_fits,
    never_fits,
)
from gpuq.scheduler.reserve import FreeNode, Reservation, earliest
from gpuq.scheduler.snapshot import RunningJob

# a node's part of a gang start: (node, units, the need on that node)
Part = tuple[str, tuple[str, ...], Resources]
# a part of a reservation: (node, units, spare cpus at the start, spare mem at the start)
Held = tuple[str, tuple[str, ...], int, int]


def is_gang(need: Resources) -> bool:
    """Jobs that this module places: several nodes, or whole nodes or their whole memory."""
    return need.nodes > 1 or need.exclusive or need.mem_all


def per_node(need: Resources, view: NodeView) -> Resources | None:
    """`need` on node `view`: as asked, or with the node's sizes for --exclusive (every unit,
    CPU and byte) and --mem=0 (every byte). None: the node has too few units ever to hold it."""
    if not (need.exclusive or need.mem_all):
        return need
    return _sized(need, len(view.units), view.cpus, view.mem)


@lru_cache(maxsize=4096)
def _sized(need: Resources, units: int, cpus: int, mem: int) -> Resources | None:
    if need.exclusive:
        if units < need.gpus:
            return None
        return replace(
            need,
            gpus=units,
            cpus=max(cpus, 1),
            mem=mem or None,
            mem_all=False,
            tasks_per_node=1,
            gpus_per_task=None,
            gpu_type=need.gpu_type if units else None,
        )
    return replace(need, mem=mem or None, mem_all=False)


def kinds(need: Resources, sized: Resources, view: NodeView) -> list[tuple[str, Resources]]:
    """The ways a node can hold one part, each keyed by the GPU type its units would have:
    the nodes of one gang start share a key. One-node jobs, typed jobs and GPU-less jobs
    have one way ("")."""
    if need.nodes == 1 or need.gpu_type is not None or sized.gpus == 0:
        return [("", sized)]
    return _kinds(need, sized, view.units)


@lru_cache(maxsize=4096)
def _kinds(
    need: Resources, sized: Resources, units: tuple[GpuUnit, ...]
) -> list[tuple[str, Resources]]:
    # a pass asks this of every node for every kind of gang job: nodes alike share an answer
    if need.exclusive:  # every unit: the node's types are the key
        return [("+".join(sorted({gpu_type(u.name) for u in units})), sized)]
    types = sorted({gpu_type(u.name) for u in kind_fits(units, sized)})
    return [(t, replace(sized, gpu_type=t)) for t in types]


def ways(need: Resources, view: NodeView) -> Ways:
    """`per_node`, then `kinds`: the node's part of `need` and the ways it can hold it (None:
    never); kept on the view, as a pass asks it of every node for every gang job."""
    cache = view.gang_ways
    known = cache.get(need)
    if known is not None or need in cache:
        return known
    sized = per_node(need, view)
    found = cache[need] = None if sized is None else (sized, kinds(need, sized, view))
    return found


def _quiet(node: FreeNode) -> bool:
    """Nothing runs on the node (an --exclusive job's condition), started jobs included."""
    return not node.releases and not any(node.shares.values())


def place(
    nodes: Mapping[str, FreeNode],
    reservations: Mapping[str, Sequence[Reservation]],
    only: frozenset[str] | None,
    need: Resources,
    end: float,
    user: str,
) -> list[Part] | None:
    """The best-fit nodes where the job fits now without delaying a reservation (those of
    each node in `reservations`), and the units on each; None unless `need.nodes` nodes do
    (never a partial start)."""
    groups: dict[str, list[tuple[tuple[int, int, int, str], list[str], Resources]]] = {}
    for name, node in nodes.items():
        if (only is not None and name not in only) or not node.view.up:
            continue
        part = ways(need, node.view)
        if part is None:
            continue
        sized, options = part
        if node.cpus < sized.cpus or node.mem < (sized.mem or 0):
            continue
        if need.exclusive and not _quiet(node):
            continue
        overlapping = [r for r in reservations.get(name, ()) if end > r.start]
        if any(not r.leaves_room(sized) for r in overlapping):
            continue
        blocked = {u for r in overlapping for u in r.units}
        for key, each in options:
            if not node.may_hold(each):
                continue
            usable = node.usable(each, blocked, user)
            if len(usable) >= each.gpus:
                rank = (len(usable), node.cpus, node.mem, name)
                groups.setdefault(key, []).append((rank, usable, each))
    Option = tuple[tuple[int, int, int, str], list[str], Resources]
    best: tuple[tuple[int, str], list[Option]] | None = None
    for key, found in groups.items():
        if len(found) < need.nodes:
            continue
        chosen = sorted(found, key=lambda c: c[0])[: need.nodes]
        score = (sum(c[0][0] for c in chosen), key)
        if best is None or score < best[0]:
            best = (score, chosen)
    if best is None:
        return None
    parts: list[Part] = []
    for (*_, name), usable, each in best[1]:
        node = nodes[name]
        view = replace(
            node.view,
            free_units=frozenset(usable),
            cpus_free=node.cpus,
            mem_free=node.mem,
            shares={},
        )
        parts.append((name, choose_units(view, each, user), each))
    return parts


def soonest(
    nodes: Mapping[str, FreeNode],
    only: frozenset[str] | None,
    need: Resources,
    now: float,
    reserved: frozenset[str],
    user: str,
) -> tuple[float, list[Held]] | None:
    """When `need.nodes` nodes can all hold the job (the N-th smallest of the nodes' own
    earliest times), and what to reserve on each; None if that is not known."""
    groups: dict[str, list[tuple[float, str, tuple[str, ...], int, int]]] = {}
    for name, node in nodes.items():
        if only is not None and name not in only:
            continue
        options = ways(need, node.view)
        if options is None:
            continue
        for key, each in options[1]:
            found = earliest(node, each, now, reserved, user)
            if found is not None:
                groups.setdefault(key, []).append((found[0], name, *found[1:]))
    best: tuple[float, str, list[Held]] | None = None
    for key, times in groups.items():
        if len(times) < need.nodes:
            continue
        chosen = sorted(times, key=lambda c: (c[0], c[1]))[: need.nodes]
        start = chosen[-1][0]
        if best is None or (start, key) < best[:2]:
            best = (start, key, [(n, units, c, m) for _, n, units, c, m in chosen])
    return None if best is None else (best[0], best[2])


def victims_across(
    nodes: Mapping[str, FreeNode],
    only: frozenset[str] | None,
    need: Resources,
    now: float,
    reserved: frozenset[str],
    user: str,
    victims_of: Callable[[str, Resources], tuple[float, list[RunningJob]] | None],
) -> list[tuple[str, Resources, list[RunningJob]]] | None:
    """`need.nodes` nodes each freed by victims on it (a node that holds the job now needs
    none), with the least work lost in all (a victim on several of them counts once); None
    when no such set exists, or when it needs no victim at all."""
    groups: dict[str, list[tuple[float, int, str, Resources, list[RunningJob]]]] = {}
    for name, node in nodes.items():
        if (only is not None and name not in only) or not node.view.up:
            continue
        part = ways(need, node.view)
        if part is None or (need.exclusive and any(node.shares.values())):
            continue
        for key, each in part[1]:
            if (
                node.may_hold(each)
                and len(node.usable(each, reserved, user)) >= each.gpus
                and node.cpus >= each.cpus
                and node.mem >= (each.mem or 0)
                and (not need.exclusive or _quiet(node))
            ):
                groups.setdefault(key, []).append((0.0, 0, name, each, []))
                continue
            # an --exclusive part needs every unit, CPU and byte: only all its jobs free that
            found = victims_of(name, each)
            if found is not None:
                groups.setdefault(key, []).append((found[0], len(found[1]), name, each, found[1]))
    best: tuple[tuple[float, int, str], list[tuple[str, Resources, list[RunningJob]]]] | None
    best = None
    for key, options in groups.items():
        if len(options) < need.nodes:
            continue
        chosen = sorted(options, key=lambda c: c[:3])[: need.nodes]
        victims = {v.job_id: v for *_, vs in chosen for v in vs}
        if not victims:
            continue
        lost = sum(max(0.0, now - v.start_time) for v in victims.values())
        score = (lost, len(victims), key)
        if best is None or score < best[0]:
            best = (score, [(name, each, vs) for _, _, name, each, vs in chosen])
    return None if best is None else best[1]


# ---- reasons --------------------------------------------------------------------------------


def _what(need: Resources, key: str, free: bool = False) -> str:
    """ "2 nodes with 4 free a100 GPUs each" (how reasons name a gang job's need)."""
    kind = need.gpu_type or (key if key and "+" not in key else "")
    word = "GPU" if need.gpus == 1 else "GPUs"
    gpus = " ".join(p for p in (str(need.gpus), "free" if free else "", kind, word) if p)
    whole = "whole " if need.exclusive else ""
    nodes = f"{need.nodes} {whole}node" + ("s" if need.nodes > 1 else "")
    if need.gpus == 0:
        return nodes
    return f"{nodes} with {gpus}" + (" each" if need.nodes > 1 else "")


def capable(
    views: Iterable[NodeView], need: Resources, placement: Placement
) -> tuple[str, list[NodeView]]:
    """The nodes (up or not) that could ever hold one part, of the GPU type that most nodes
    could (with its key)."""
    groups: dict[str, list[NodeView]] = {}
    for view in views:
        if allowed(view, placement) is not None:
            continue
        options = ways(need, view)
        if options is None:
            continue
        for key, each in options[1]:
            if not never_fits(view, each):
                groups.setdefault(key, []).append(view)
    if not groups:
        return "", []
    key = max(groups, key=lambda k: (len(groups[k]), k))
    return key, groups[key]


def never_reason(
    need: Resources, placement: Placement, found: tuple[str, list[NodeView]]
) -> str | None:
    """Why a gang job can never run, given what `capable` found (None: enough nodes could
    hold it some day)."""
    key, fit = found
    if len(fit) >= need.nodes:
        return None
    names = ",".join(v.name for v in fit[:MAX_NAMED]) + (
        f" and {len(fit) - MAX_NAMED} more" if len(fit) > MAX_NAMED else ""
    )
    if not fit:
        have = "no node can ever hold that"
    elif len(fit) == 1:
        have = f"only 1 node ({names}) can ever hold that"
    else:
        have = f"only {len(fit)} nodes ({names}) can ever hold that"
    why = " that --nodelist/--exclude/--constraint allow" if placement else ""
    return f"can never run: needs {_what(need, key)}; {have}{why}"


def _clock(moment: float) -> str:
    if math.isinf(moment):
        return "an unknown time"
    return "~" + dt.datetime.fromtimestamp(moment).strftime("%H:%M")


def waiting_reason(
    nodes: Mapping[str, FreeNode],
    need: Resources,
    user: str,
    running_on: Mapping[str, Sequence[RunningJob]],
    found: tuple[str, list[NodeView]],
) -> str:
    """What a waiting gang job lacks, node by node (of those `capable` found): "needs 2 nodes
    with 4 free a100 GPUs each: gpu01 has 4, gpu02 has 1 (job 812 until ~14:20)"."""
    key, fit = found
    down = [f"{v.name} {v.down_reason}" for v in fit if not v.up]
    rows = []
    for view in fit:
        node = nodes.get(view.name)
        if node is None or not view.up:
            continue
        options = ways(need, view)
        assert options is not None
        each = dict(options[1]).get(key, options[0])
        usable = len(node.usable(each, frozenset(), user))
        short = [
            what
            for what, lacking in (
                ("CPUs", node.cpus < each.cpus),
                ("memory", node.mem < (each.mem or 0)),
            )
            if lacking
        ]
        busy = need.exclusive and not _quiet(node)
        if busy:
            text = f"{view.name} is in use"
        else:
            text = f"{view.name} has {usable}" if need.gpus else view.name
            if short:
                text += f"{',' if need.gpus else ''} too few free {' and '.join(short)}"
        lacking = busy or bool(short) or usable < each.gpus
        ends = sorted((r.end_estimate, r.job_id) for r in running_on.get(view.name, ()))
        if lacking and ends:
            until, job = ends[-1] if need.exclusive else ends[0]
            text += f" (job {job} until {_clock(until)})"
        rows.append((lacking, -usable, view.name, text))
    rows.sort()
    shown = [r[3] for r in rows[: MAX_NAMED + 1]]
    more = len(rows) - len(shown)
    detail = ", ".join(shown) + (f" and {more} more" if more > 0 else "")
    if down:
        detail += ("; " if detail else "") + "; ".join(down[:MAX_NAMED])
    return f"needs {_what(need, key, free=True)}: {detail or 'no node is up'}"
