"""Looking ahead: when would a blocked job fit, given the running jobs' expected ends?

The top blocked job gets a reservation (EASY backfill): the node, the time, and the exact GPU
units it will start on. A lower job may start now only if it ends before that time, or uses
none of the reserved units and leaves the reservation enough CPUs and memory.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from gpuq.domain.model import Resources
from gpuq.scheduler.fitting import KindKey, NodeView, ShareUse, kind_of, share_units

# a running (or just started) job's hold on a node: (end estimate, units, cpus, mem)
Release = tuple[float, tuple[str, ...], int, int]
# a blocked job, for the estimates: (job id, need, time limit, the nodes it may use or None)
Blocked = tuple[int, Resources, float | None, frozenset[str] | None]


@dataclass(slots=True)
class FreeNode:
    """A node's free resources during one pass (they only shrink)."""

    view: NodeView
    units: set[str]
    cpus: int
    mem: int
    releases: list[Release] = field(default_factory=list)
    # (end estimate, units, cpus, mem) of every job running on it, started ones included
    shares: dict[str, list[ShareUse]] = field(default_factory=dict)  # live, started ones too

    def usable(
        self, need: Resources, excluded: set[str] | frozenset[str] = frozenset(), user: str = ""
    ) -> list[str]:
        """Free, ok units `need` can use, outside `excluded`, in the view's order (PCI order;
        MIG slices smallest first; for a share of `user`, shared units with room)."""
        if need.gpu_share is not None:
            units = share_units(self.view.eligible(need), self.units, self.shares, user, need)
            return [u.uuid for u in units if u.uuid not in excluded]
        return [
            u.uuid
            for u in self.view.eligible(need)
            if u.uuid in self.units and u.uuid not in excluded
        ]

    def may_hold(self, need: Resources) -> bool:
        """Whether enough units are free for `need`, before `usable` looks at which (a
        share may use units that other shares hold): most nodes of a busy pass fail this."""
        return need.gpu_share is not None or len(self.units) >= need.gpus

    def release_early(self, units: tuple[str, ...], end: float, moment: float) -> None:
        """The running job on `units` that was to end at `end` ends by `moment` (a victim
        stopped for a preemption elsewhere: its part here frees up too)."""
        for i, (until, held, cpus, mem) in enumerate(self.releases):
            if held == units and until == end:
                self.releases[i] = (min(until, moment), held, cpus, mem)
                return

    def holders(self) -> Counter[str]:
        """How many running jobs hold each unit (several MPS shares may hold one)."""
        return Counter(u for _, units, _, _ in self.releases for u in units)


@dataclass(slots=True)
class Reservation:
    job_id: int
    node: str
    start: float
    units: frozenset[str]
    spare_cpus: int  # CPUs free at `start` beyond the job's (backfill that overlaps may use them)
    spare_mem: int

    def leaves_room(self, need: Resources) -> bool:
        """Can a job that overlaps the reservation's start run beside it (the reserved units
        aside)? Only if the node's CPUs and memory at the start cover both."""
        return need.cpus <= self.spare_cpus and (need.mem or 0) <= self.spare_mem

    def take(self, node: str, end: float, need: Resources) -> None:
        if node == self.node and end > self.start:
            self.spare_cpus -= need.cpus
            self.spare_mem -= need.mem or 0


def earliest(
    node: FreeNode, need: Resources, now: float, excluded: frozenset[str], user: str = ""
) -> tuple[float, tuple[str, ...], int, int] | None:
    """(time, units, spare cpus, spare mem) at which `need` first fits on the node; None if it
    never does within the known ends (a job without a time limit never ends, for this). A
    unit held by several shares is released when the last of them ends."""
    if not node.view.up:
        return None
    eligible = {u.uuid for u in node.view.eligible(need)}
    free_now = node.usable(need, excluded, user)
    holders = node.holders()
    released: list[str] = []
    cpus, mem = node.cpus, node.mem
    events = sorted(node.releases)
    index = 0
    moment = now
    while True:
        if (
            len(free_now) + len(released) >= need.gpus
            and cpus >= need.cpus
            and (mem >= (need.mem or 0))
        ):
            # reserve released units first: the free ones stay usable for backfill
            units = tuple((released + free_now)[: need.gpus])
            return moment, units, cpus - need.cpus, mem - (need.mem or 0)
        if index >= len(events) or math.isinf(events[index][0]):
            return None
        moment, freed, freed_cpus, freed_mem = events[index]
        index += 1
        for unit in freed:
            holders[unit] -= 1
            if holders[unit] <= 0 and unit in eligible and unit not in excluded | set(free_now):
                released.append(unit)
        cpus += freed_cpus
        mem += freed_mem


def explained_starts(
    nodes: Mapping[str, FreeNode],
    reservations: list[Reservation],
    claimed: Collection[int],
    blocked: list[Blocked],
    limit: int,
    now: float,
    expected_runs: Mapping[int, float | None] | None,
    expected_releases: Mapping[str, list[Release]],
) -> dict[int, float]:
    """The estimated starts of a pass's blocked jobs (in queue order; those `claimed` wait
    on a preemption), of the first `limit` that hold no reservation, and of the reserved
    ones: their reservation's start.

    Where some jobs' run times were measured (`expected_runs`, else None: jobs without --time
    whose user ran jobs of that name before), over the units' expected free times
    (`expected_releases`), each job expected to run its measured time (else its limit); a job
    waiting on a preemption starts when its victims' grace ends, a reserved job no later than
    its reservation (which keeps to the limits)."""
    if expected_runs is None:
        found = {r.job_id: r.start for r in reservations}
        reserved = set(found)
        todo = [b for b in blocked if b[0] not in reserved]
        held = {b[0]: b[2] for b in blocked}  # a reserved job's time limit
        found.update(estimate_starts(list(nodes.values()), todo[:limit], reservations, now, held))
        return found
    claims = [r for r in reservations if r.job_id in claimed]
    by_limits: dict[int, float] = {}
    for reservation in reservations:
        if reservation.job_id not in claimed:
            known = by_limits.get(reservation.job_id, -math.inf)
            by_limits[reservation.job_id] = max(known, reservation.start)
    waiting = [b for b in blocked if b[0] not in claimed]
    runs = {b[0]: expected_runs.get(b[0], b[2]) for b in waiting}
    jobs = [(job_id, need, runs[job_id], only) for job_id, need, _, only in waiting]
    free = [
        FreeNode(n.view, n.units, n.cpus, n.mem, expected_releases.get(name, []))
        for name, n in nodes.items()
    ]
    estimates = estimate_starts(free, jobs[:limit], claims, now, runs)
    for reservation in claims:
        estimates[reservation.job_id] = reservation.start
    for job_id, start in by_limits.items():
        estimates[job_id] = min(estimates.get(job_id, start), start)
    return estimates


def estimate_starts(
    nodes: list[FreeNode],
    jobs: list[Blocked],
    reservations: list[Reservation],
    now: float,
    held_for: Mapping[int, float | None] | None = None,
) -> dict[int, float]:
    """List scheduling of blocked jobs in queue order over the GPU units' free times: an
    estimate of when each starts (CPUs and memory are not modelled; GPU-less jobs not either),
    each on the nodes its placement allows (None: any). A job of N nodes starts when N nodes
    have its units free (GPU types are not matched across them: an estimate); an --exclusive
    one needs every unit of each node. A reservation's units are taken from its start for
    `held_for[job]` seconds (the reserved job's time limit; unknown: for good)."""
    free_at: dict[str, dict[str, float]] = {}
    for node in nodes:
        times = dict.fromkeys(node.units, now)
        for end, units, _, _ in node.releases:
            for unit in units:
                times[unit] = max(times.get(unit, now), end)  # shares: the last one's end
        for reservation in reservations:
            if reservation.node == node.view.name:
                held = (held_for or {}).get(reservation.job_id)
                until = math.inf if held is None else reservation.start + held
                for unit in reservation.units:
                    times[unit] = until
        free_at[node.view.name] = times
    estimates: dict[int, float] = {}
    up = [n for n in nodes if n.view.up]
    position = {n.view.name: i for i, n in enumerate(up)}
    changed: list[int] = []  # the nodes (positions in `up`) jobs were put on, in turn
    ranked: dict[tuple[KindKey, bool, int], _Ranked] = {}
    for job_id, need, limit, only in jobs:
        if need.gpus == 0:
            continue
        key = (kind_of(need), need.exclusive, need.gpus)
        kind = ranked.get(key)
        if kind is None:
            kind = ranked[key] = _Ranked(up, need, free_at, len(changed))
        else:
            kind.refresh(up, need, free_at, changed)
        chosen = kind.first(need.nodes, only)
        if chosen is None or math.isinf(chosen[-1][0]):
            continue
        estimates[job_id] = max(chosen[-1][0], now)
        for _, name, taken in chosen:
            changed.append(position[name])
            for unit in taken:
                free_at[name][unit] = math.inf if limit is None else estimates[job_id] + limit
    return estimates


# when a node can first give a need its units, the node, and those units
Found = tuple[float, str, list[str]]


def _soonest_units(node: FreeNode, need: Resources, times: Mapping[str, float]) -> Found | None:
    """When the units of `node` that `need` may take are first all free (by `times`)."""
    kinds = node.view.units if need.exclusive else node.view.eligible(need)
    eligible = sorted((times.get(u.uuid, math.inf), u.uuid) for u in kinds)
    count = len(eligible) if need.exclusive else need.gpus
    if len(eligible) < need.gpus or count == 0:
        return None
    return eligible[count - 1][0], node.view.name, [u for _, u in eligible[:count]]


class _Ranked:
    """Every node's answer (`_soonest_units`) for one kind of need (kind_of, --exclusive,
    GPUs), in the order a job takes them (soonest first, then node order), brought up to
    date for just the nodes jobs were put on since it last looked: a job of the kind then
    reads the first N instead of asking every node and sorting them all."""

    __slots__ = ("answers", "order", "seen")

    def __init__(
        self,
        up: list[FreeNode],
        need: Resources,
        free_at: Mapping[str, dict[str, float]],
        seen: int,
    ) -> None:
        self.answers = [_soonest_units(n, need, free_at[n.view.name]) for n in up]
        self.order = sorted((a[0], i) for i, a in enumerate(self.answers) if a is not None)
        self.seen = seen  # how much of the changed nodes' list it has taken in

    def refresh(
        self,
        up: list[FreeNode],
        need: Resources,
        free_at: Mapping[str, dict[str, float]],
        changed: list[int],
    ) -> None:
        """Ask again of the nodes changed since it last looked."""
        if self.seen == len(changed):
            return
        for i in set(changed[self.seen :]):
            old = self.answers[i]
            if old is not None:
                del self.order[bisect_left(self.order, (old[0], i))]
            new = self.answers[i] = _soonest_units(up[i], need, free_at[up[i].view.name])
            if new is not None:
                insort(self.order, (new[0], i))
        self.seen = len(changed)

    def first(self, count: int, only: frozenset[str] | None) -> list[Found] | None:
        """The `count` soonest answers of the nodes `only` allows (None: all); None if fewer."""
        chosen: list[Found] = []
        for _, i in self.order:
            answer = self.answers[i]
            if answer is not None and (only is None or answer[1] in only):
                chosen.append(answer)
                if len(chosen) == count:
                    return chosen
        return None
