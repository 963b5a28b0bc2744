"""Where a job fits on one node, and why not when it does not.

A fit check never answers just "no": it returns the named reasons, which the plan keeps so that
`gpuq show` can say exactly what blocks a job.

Which units a job may take (`kind_fits`), the rule CUDA imposes: a process sees whole GPUs or
exactly one MIG slice. `--gpus N` takes whole GPUs only; `--mig PROFILE` one slice of that
profile; `--gpus 1 --gpu-mem SIZE` on a node that has MIG slices only takes the smallest slice
that fits. Memory is compared by gpuq.domain.model.gpu_mem_fits (a marketed size fits its card).
A unit that is not ok (unhealthy, dirty, drained) is never given out, but still counts for
"can never fit": it can come back.

A GPU type (`--gpus a100:2`) keeps only units of that type (gpuq.domain.gpu_types.gpu_type of
their NVML name; a MIG slice has its GPU's), whatever else is asked: `--mig` and `--gpu-share`
combine with it. A job's placement (--nodelist, --exclude, --constraint) rules whole nodes out
(`Placement.node_problem`); a node's features for --constraint are its `[agent] features` and
the types of its GPUs (`node_features`).

MPS shares (`--gpu-share PCT --gpu-mem SIZE`) go to whole GPUs the admin shares (`shared`
units). Several shares may hold one unit at once, if they are of one user (an MPS server
serves one Unix user at a time), their percentages sum to at most 100 and their VRAM limits
to at most the unit's memory (as gpu_mem_fits compares). A unit with live shares is not free:
no whole-GPU job gets it until the last share ends; a share never joins a unit held whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuq.domain.gpu_types import gpu_type
from gpuq.domain.model import DISTANCE_SYSTEM, GpuUnit, Resources, gpu_mem_fits
from gpuq.domain.node_constraints import Placement
from gpuq.domain.units import format_size

ANYWHERE = Placement()

MAX_NAMED = 3  # units or nodes named in one reason; more are counted


@dataclass(frozen=True, slots=True)
class ShareUse:
    """A live MPS share of a unit: whose, how much of its compute, how much of its VRAM."""

    job_id: int
    user: str
    percent: int
    gpu_mem: int


ShareMap = Mapping[str, Sequence[ShareUse]]  # unit uuid -> its live shares
KindKey = tuple[int, str | None, bool, str | None, int | None]  # see kind_of
# a gang job's part on one node: its need there, and the ways (GPU types) it can take
# (gpuq.scheduler.gang.ways); None: the node can never hold one
Ways = tuple[Resources, list[tuple[str, Resources]]] | None


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as the scheduler sees it at one instant."""

    name: str
    up: bool
    units: tuple[GpuUnit, ...]
    free_units: frozenset[str]  # not allocated to a job (health aside)
    cpus: int
    cpus_free: int
    mem: int
    mem_free: int
    distances: Mapping[tuple[str, str], int]  # (a, b) with a < b
    down_reason: str = "is down"  # why it takes no work when not up
    # units that are not ok, with why: "dirty: pid 4242 (python) still holds 2.0 GiB after
    # job 17", "drained by admin: fan", "unhealthy: XID 79 (GPU fell off the bus)"
    unhealthy: Mapping[str, str] = field(default_factory=dict)
    # live MPS shares per shared unit (such a unit is not in free_units: no whole job gets it)
    shares: ShareMap = field(default_factory=dict)
    # its `[agent] features`; None: not known yet (its agent has not registered since the
    # coordinator started), so any constraint may match it
    features: frozenset[str] | None = frozenset()
    # the `[partitions.NAME]` it is in (none configured: none)
    partitions: frozenset[str] = frozenset()
    # (the units each kind of need may take, ok ones only: a pass asks this of each node
    # for every job it looks at, and the answer only depends on the kind; see `kind_of`)
    _eligible: dict[KindKey, tuple[GpuUnit, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # (gpuq.scheduler.gang.ways of each gang need: asked of every node for every gang job a
    # pass looks at, and of the node's sizes and units only)
    gang_ways: dict[Resources, Ways] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def distance(self, a: str, b: str) -> int:
        return self.distances.get((a, b) if a < b else (b, a), DISTANCE_SYSTEM)

    def eligible(self, need: Resources) -> tuple[GpuUnit, ...]:
        """Units of the kind and size `need` can use that are ok (free or not)."""
        key = kind_of(need)
        found = self._eligible.get(key)
        if found is None:
            unhealthy = self.unhealthy
            found = tuple(u for u in kind_fits(self.units, need) if u.uuid not in unhealthy)
            self._eligible[key] = found
        return found

    def usable_units(self, need: Resources, user: str = "") -> list[GpuUnit]:
        """Free, ok units `need` can use: in PCI order (MIG slices: smallest first). For a
        share of `user`: shared units with room, those with live shares first."""
        if need.gpu_share is not None:
            return share_units(self.eligible(need), self.free_units, self.shares, user, need)
        return [u for u in self.eligible(need) if u.uuid in self.free_units]

    def not_ok(self, need: Resources) -> list[str]:
        """The units `need` could use that are not ok, as reasons name them."""
        return [
            f"{u.label} {self.unhealthy[u.uuid]}"
            for u in kind_fits(self.units, need)
            if u.uuid in self.unhealthy
        ]


def kind_of(need: Resources) -> KindKey:
    """What of `need` decides which units it may take (`kind_fits`): needs alike share it."""
    return (min(need.gpus, 2), need.gpu_type, need.gpu_share is None, need.mig, need.gpu_mem)


def node_features(node: NodeView) -> frozenset[str] | None:
    """What --constraint matches on `node`: its features and its GPUs' types (None: its
    features are not known yet)."""
    if node.features is None:
        return None
    return node.features | {gpu_type(u.name) for u in node.units}


def allowed(node: NodeView, placement: Placement) -> str | None:
    """Why `placement` rules `node` out (None: the job may run there)."""
    if not placement:
        return None
    return placement.node_problem(node.name, node_features(node), node.partitions)


def typed(need: Resources) -> str:
    """ "h100 GPUs" or "GPUs" (how reasons name what a job asks for), for `need.gpus`."""
    word = "GPU" if need.gpus == 1 else "GPUs"
    return f"{need.gpu_type} {word}" if need.gpu_type else word


def kind_fits(units: Sequence[GpuUnit], need: Resources) -> list[GpuUnit]:
    """The units of a node with `units` that `need` may take, health and allocation aside:
    whole GPUs with enough memory, or for one MIG slice the slices that fit (smallest first),
    or for a share the shared GPUs with at least the share's memory; of `need.gpu_type` only
    when it names one."""
    if not need.gpus:
        return []
    if need.gpu_type is not None:
        units = [u for u in units if gpu_type(u.name) == need.gpu_type]
    if need.gpu_share is not None:
        return [
            u for u in units if u.shared and not u.is_mig and gpu_mem_fits(u.memory, need.gpu_mem)
        ]
    if need.mig is not None:
        return [
            u for u in units if u.mig_profile == need.mig and gpu_mem_fits(u.memory, need.gpu_mem)
        ]
    whole = [u for u in units if not u.is_mig]
    if whole or need.gpus > 1 or need.gpu_mem is None:
        return [u for u in whole if gpu_mem_fits(u.memory, need.gpu_mem)]
    # --gpus 1 --gpu-mem SIZE on a node with MIG slices only: the smallest slice that fits
    slices = [u for u in units if gpu_mem_fits(u.memory, need.gpu_mem)]
    return sorted(slices, key=lambda u: u.memory)


def kind_problem(name: str, units: Sequence[GpuUnit], need: Resources) -> str | None:
    """Why node `name` can never offer `need` the kind of unit it asks for (None: it can)."""
    if not need.gpus or len(kind_fits(units, need)) >= need.gpus:
        return None
    if need.gpu_type is not None:
        mine = [u for u in units if gpu_type(u.name) == need.gpu_type]
        if not mine:
            have = sorted({gpu_type(u.name) for u in units})
            return f"node {name} has no {need.gpu_type} GPU" + (
                f" (it has {', '.join(have)})" if have else ""
            )
        if need.mig is None and need.gpu_share is None and need.gpu_mem is None:
            return f"node {name} has {len(mine)} {need.gpu_type} GPUs, not {need.gpus}"
    if need.gpu_share is not None:
        return f"node {name} has no shared GPU with {format_size(need.gpu_mem or 0)}"
    if need.mig is not None:
        return f"node {name} has no MIG {need.mig} slice"
    whole = [u for u in units if not u.is_mig]
    if units and not whole:
        gpus = "1 whole GPU" if need.gpus == 1 else f"{need.gpus} whole GPUs"
        hint = " (ask for one slice with --mig PROFILE or --gpu-mem SIZE)" if need.gpus == 1 else ""
        return f"needs {gpus} on one node; node {name} has MIG slices only{hint}"
    return None


def misfit(node: NodeView, need: Resources, user: str = "") -> str | None:
    """Why `need` (of `user`) does not fit on `node` now (None: it fits)."""
    if not node.up:
        return f"node {node.name} {node.down_reason}"
    if need.gpus:
        usable = len(node.usable_units(need, user))
        if usable < need.gpus:
            kind = kind_problem(node.name, node.units, need)
            if kind is not None:
                return kind
            if need.gpu_share is not None:
                return share_wanted(need) + "; ".join(share_reasons(node, need, user)[:MAX_NAMED])
            unit = f"MIG {need.mig} slices" if need.mig else "GPUs"
            if need.gpu_type is not None:
                unit = f"{need.gpu_type} {unit}"
            text = f"node {node.name} has {usable} of {need.gpus} {unit} free"
            return text + _named(node.not_ok(need))
    if need.cpus > node.cpus_free:
        return f"node {node.name} has {node.cpus_free} of {need.cpus} CPUs free"
    if need.mem is not None and need.mem > node.mem_free:
        return f"node {node.name} has {format_size(node.mem_free)} of {format_size(need.mem)} free"
    return None


def never_fits(node: NodeView, need: Resources, placement: Placement = ANYWHERE) -> bool:
    """True when the node could not run the job even empty (every unit counts, healthy or not:
    a drained or dirty unit can come back), or the job's placement rules the node out (a node
    whose features are not known yet is not ruled out by a constraint)."""
    return (
        allowed(node, placement) is not None
        or len(kind_fits(node.units, need)) < need.gpus
        or need.cpus > node.cpus
        or (need.mem is not None and need.mem > node.mem)
    )


def placement_reason(nodes: Sequence[NodeView], placement: Placement) -> str | None:
    """Why `placement` rules out every one of `nodes` (None: it allows some): an unknown node
    in --nodelist, nodes excluded, features no node has."""
    if not placement or any(allowed(n, placement) is None for n in nodes):
        return None
    if not placement.partitions:
        return _ruled_out(nodes, placement)
    named = f"partition {','.join(placement.partitions)}"
    inside = [n for n in nodes if set(placement.partitions) & n.partitions]
    if not inside:
        return f"{named}: no node is in it"
    return f"{named}: {_ruled_out(inside, placement)}"


def in_partition(placement: Placement, reason: str) -> str:
    """A waiting job's reason, said of its partitions ("partition debug: no node is up"), as
    squeue's reasons are read against the job's PARTITION."""
    if not placement.partitions or reason.startswith("partition "):
        return reason
    return f"partition {','.join(placement.partitions)}: {reason}"


def _ruled_out(nodes: Sequence[NodeView], placement: Placement) -> str:
    """Why --nodelist, --exclude or --constraint rule out every one of `nodes`."""
    known = {n.name for n in nodes}
    if placement.nodelist:
        unknown = [n for n in placement.nodelist if n not in known]
        left = [n for n in placement.nodelist if n in known and n not in placement.exclude]
        if not left:
            if len(unknown) == len(placement.nodelist):
                names = _listed(unknown)
                return f"nodelist: {names} {'is' if len(unknown) == 1 else 'are'} not known"
            return f"nodelist: every node of {_listed(placement.nodelist)} is excluded"
        candidates = [n for n in nodes if n.name in left]
    else:
        candidates = [n for n in nodes if n.name not in placement.exclude]
        if not candidates:
            return f"exclude: {_listed(placement.exclude)} leaves no node"
    have = sorted({f for n in candidates for f in (node_features(n) or ())})
    where = " on nodes of --nodelist" if placement.nodelist else ""
    return (
        f"constraint: no node has {placement.constraint}{where} "
        f"(features: {', '.join(have[:12]) or 'none'}{', ...' if len(have) > 12 else ''})"
    )


def _listed(names: Sequence[str]) -> str:
    shown = ",".join(names[:MAX_NAMED])
    return shown + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")


def never_fits_reason(
    nodes: Sequence[NodeView], need: Resources, placement: Placement = ANYWHERE
) -> str:
    """Why no node could ever run `need` (the caller checked that none can), in one line."""
    ruled_out = placement_reason(nodes, placement)
    if ruled_out is not None:
        return f"can never run: {ruled_out}"
    if placement:
        nodes = [n for n in nodes if allowed(n, placement) is None]
    with_units = [n for n in nodes if n.units]
    if need.gpu_type is not None and not any(
        gpu_type(u.name) == need.gpu_type for n in nodes for u in n.units
    ):
        have = sorted({gpu_type(u.name) for n in nodes for u in n.units})
        where = " that --nodelist/--exclude/--constraint allow" if placement else ""
        return (
            f"--gpus {need.gpu_type}:{need.gpus} can never run: no node{where} has "
            f"{need.gpu_type} GPUs (types: {', '.join(have) or 'none'})"
        )
    if need.gpu_share is not None:
        shared = [u for n in nodes for u in n.units if u.shared and not u.is_mig]
        asked = f"--gpu-share {need.gpu_share} --gpu-mem {format_size(need.gpu_mem or 0)}"
        if not shared:
            return f"{asked} can never run: no node has a shared GPU (the admin shares GPUs)"
        if not any(gpu_mem_fits(u.memory, need.gpu_mem) for u in shared):
            most = max(u.memory for u in shared)
            return (
                f"{asked} can never run: no shared GPU has that much memory "
                f"(the largest has {format_size(most)})"
            )
    if need.mig is not None and not any(u.mig_profile == need.mig for n in nodes for u in n.units):
        return f"--mig {need.mig} can never run: no node has a MIG {need.mig} slice"
    if (
        need.mig is None
        and need.gpus
        and with_units
        and all(all(u.is_mig for u in n.units) for n in with_units)
    ) and (need.gpus > 1 or need.gpu_mem is None):
        gpus = "1 whole GPU" if need.gpus == 1 else f"{need.gpus} whole GPUs"
        names = ", ".join(n.name for n in with_units[:MAX_NAMED])
        return (
            f"--gpus {need.gpus} can never run: needs {gpus} on one node; "
            f"MIG slices only on {names} (a job gets whole GPUs or one --mig slice)"
        )
    if need.gpu_mem is not None and not any(
        gpu_mem_fits(u.memory, need.gpu_mem) for n in nodes for u in n.units
    ):
        most = max((u.memory for n in nodes for u in n.units), default=0)
        return (
            f"--gpu-mem {format_size(need.gpu_mem)} can never be met: no GPU in the cluster has "
            f"that much memory (the largest has {format_size(most)})"
        )
    largest = max(nodes, key=lambda n: (len(kind_fits(n.units, need)), n.name))
    fitting = len(kind_fits(largest.units, need))
    if need.gpus > fitting:
        kind = "whole GPUs" if need.mig is None else f"MIG {need.mig} slices"
        if need.gpu_type is not None:
            kind = f"{need.gpu_type} {'GPUs' if need.mig is None else kind}"
        asked = f"{need.gpu_type}:{need.gpus}" if need.gpu_type else str(need.gpus)
        return (
            f"--gpus {asked} can never run: the largest node ({largest.name}) "
            f"has {fitting} {kind}" + (" that fit" if need.gpu_mem is not None else "")
        )
    most_cpus = max(nodes, key=lambda n: n.cpus)
    if need.cpus > most_cpus.cpus:
        return (
            f"--cpus {need.cpus} can never run: the largest node ({most_cpus.name}) "
            f"has {most_cpus.cpus} CPUs"
        )
    most_mem = max(nodes, key=lambda n: (n.mem, n.name))
    if need.mem is not None and need.mem > most_mem.mem:
        return (
            f"--mem {format_size(need.mem)} can never run: the largest node ({most_mem.name}) "
            f"has {format_size(most_mem.mem)}"
        )
    return (
        "the request can never run: no node has that combination of GPUs, CPUs and memory "
        f"(the largest: {', '.join(node_size(n) for n in sorted(nodes, key=_size)[-2:][::-1])})"
    )


def _size(node: NodeView) -> tuple[int, int, int, str]:
    return (len(node.units), node.cpus, node.mem, node.name)


def node_size(node: NodeView) -> str:
    """`a: 4 GPUs, 16 CPUs, 23.5G`: what a node offers, to say why a request never fits."""
    gpus = len(node.units)
    return f"{node.name}: {gpus} GPU{'s' * (gpus != 1)}, {node.cpus} CPUs, {format_size(node.mem)}"


def choose_units(node: NodeView, need: Resources, user: str = "") -> tuple[str, ...]:
    """The `need.gpus` usable units closest to each other (least total pairwise distance).

    Greedy from every seed: exact for the common shapes (pairs, NVLink islands) and O(n^3) on
    an 8-GPU node, which is nothing. One unit: the first usable one (for a MIG slice, the
    smallest that fits).
    """
    usable = node.usable_units(need, user)
    if need.gpus == 0:
        return ()
    if need.gpus == 1 and usable:
        return (usable[0].uuid,)
    if need.gpus == len(usable):
        return tuple(u.uuid for u in usable)
    best: tuple[int, list[str]] | None = None
    for seed in usable:
        chosen = [seed.uuid]
        cost = 0
        while len(chosen) < need.gpus:
            step, pick = min(
                (sum(node.distance(c, u.uuid) for c in chosen), u.uuid)
                for u in usable
                if u.uuid not in chosen
            )
            chosen.append(pick)
            cost += step
        if best is None or cost < best[0]:
            best = (cost, chosen)
    assert best is not None
    order = {u.uuid: i for i, u in enumerate(node.units)}
    return tuple(sorted(best[1], key=order.__getitem__))


def shortage(nodes: list[NodeView], need: Resources, user: str = "") -> str:
    """One line on the whole cluster: what the job needs and the best that is free."""
    up = [n for n in nodes if n.up]
    if not up:
        return "no node is up"
    if need.gpus:
        kinds = [p for n in up if (p := kind_problem(n.name, n.units, need)) is not None]
        if len(kinds) == len(up):  # no node that is up offers this kind of unit
            if need.mig is not None:
                return f"no node that is up has a MIG {need.mig} slice"
            return "; ".join(kinds[:MAX_NAMED]) + ("; ..." if len(kinds) > MAX_NAMED else "")
        if need.gpu_share is not None and not any(n.usable_units(need, user) for n in up):
            texts = [t for n in up for t in share_reasons(n, need, user)]
            more = len(texts) - MAX_NAMED
            return (
                share_wanted(need)
                + "; ".join(texts[:MAX_NAMED])
                + (f"; and {more} more" if more > 0 else "")
            )
        largest = max(up, key=lambda n: (len(n.usable_units(need, user)), n.name))
        free = len(largest.usable_units(need, user))
        if free < need.gpus:
            if need.mig is not None:
                kind = f"MIG {need.mig} slice" if need.gpus == 1 else f"MIG {need.mig} slices"
                if need.gpu_type is not None:
                    kind = f"{need.gpu_type} {kind}"
            else:
                kind = typed(need)
                if need.gpu_mem:
                    kind += f" with {format_size(need.gpu_mem)}"
            not_ok = [f"node {n.name}: {text}" for n in up for text in n.not_ok(need)]
            return (
                f"needs {need.gpus} {kind} on one node; largest free block is {free} "
                f"(node {largest.name})" + _named(not_ok)
            )
    reasons = [r for n in up if (r := misfit(n, need, user)) is not None]
    return "resources: " + "; ".join(reasons[:3]) + ("; ..." if len(reasons) > 3 else "")


def _named(texts: list[str]) -> str:
    """` (A; B; C; and 2 more)`, or "" for none."""
    if not texts:
        return ""
    more = len(texts) - MAX_NAMED
    return " (" + "; ".join(texts[:MAX_NAMED]) + (f"; and {more} more" if more > 0 else "") + ")"


def share_problem(
    unit: GpuUnit, uses: Sequence[ShareUse], user: str, need: Resources
) -> str | None:
    """Why a share of `user` cannot join the live shares `uses` of a shared unit (None: it
    can): another user's shares, not enough percent or memory left."""
    others = sorted({u.user for u in uses if u.user != user})
    if others:
        whose = " and ".join(f"{o}'s" for o in others[:2]) + (" ..." if len(others) > 2 else "")
        return f"is used by {whose} shares (one user at a time)"
    percent = 100 - sum(u.percent for u in uses)
    if (need.gpu_share or 0) > percent:
        return f"has only {max(percent, 0)}% left"
    claimed = sum(u.gpu_mem for u in uses)
    if not gpu_mem_fits(unit.memory, claimed + (need.gpu_mem or 0)):
        left = max(unit.memory - claimed, 0)
        return f"has only {format_size(left)} of memory left unclaimed"
    return None


def share_units(
    eligible: Sequence[GpuUnit],
    free: frozenset[str] | set[str],
    shares: ShareMap,
    user: str,
    need: Resources,
) -> list[GpuUnit]:
    """Of the `eligible` shared units, those a share of `user` may take now: those with live
    shares of the user and room first (shares pack, free GPUs stay whole), then free ones."""
    joined = [
        u
        for u in eligible
        if u.uuid in shares and share_problem(u, shares[u.uuid], user, need) is None
    ]
    return joined + [u for u in eligible if u.uuid in free and u.uuid not in shares]


def share_wanted(need: Resources) -> str:
    """ "needs a 50% share of a shared GPU with 20G free: " (the start of a share's reason)."""
    return (
        f"needs a {need.gpu_share}% share of a shared GPU with "
        f"{format_size(need.gpu_mem or 0)} free: "
    )


def share_reasons(node: NodeView, need: Resources, user: str) -> list[str]:
    """Why each shared unit of `node` that could take the share cannot now."""
    texts = []
    for unit in kind_fits(node.units, need):
        where = f"node {node.name}'s shared {unit.label}"
        if unit.uuid in node.unhealthy:
            texts.append(f"{where} {node.unhealthy[unit.uuid]}")
        elif unit.uuid in node.shares:
            problem = share_problem(unit, node.shares[unit.uuid], user, need)
            if problem is not None:
                texts.append(f"{where} {problem}")
        elif unit.uuid not in node.free_units:
            texts.append(f"{where} is held whole by a job")
    return texts
