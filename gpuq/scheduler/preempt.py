"""Which running jobs to preempt so that a blocked job fits: the fewest seconds of work lost
(run time since each victim's last start), then the fewest victims (`victims_on`, one node);
and what a pass's preempting jobs may take, kept per node until it changes (`VictimSearch`).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from gpuq.domain.model import Resources
from gpuq.scheduler.fitting import kind_of
from gpuq.scheduler.reserve import FreeNode
from gpuq.scheduler.snapshot import RunningJob

# the jobs a tier may preempt on a node now, the least run time among them, their units
Candidates = tuple[list[RunningJob], float, int]
Found = tuple[float, list[RunningJob]] | None  # victims_on's answer

EXACT_UP_TO = 8  # candidates on one node; beyond this, a greedy choice


def victims_on(
    node: FreeNode,
    need: Resources,
    candidates: Sequence[RunningJob],
    now: float,
    excluded: frozenset[str],
    user: str = "",
) -> tuple[float, list[RunningJob]] | None:
    """(work lost, victims) freeing enough on this node; None if even all would not do. A
    unit several shares hold is freed only when all of them are victims."""
    eligible = {u.uuid for u in node.view.eligible(need)}
    free = set(node.usable(need, excluded, user))
    holders = node.holders()
    # the units victims may free: held by one job each (no MPS shares), a victim's own
    freeable = eligible - excluded if all(n <= 1 for n in holders.values()) else None

    def fits(subset: Sequence[RunningJob]) -> bool:
        if freeable is not None:
            units = free | {u for v in subset for u in v.gpus if u in freeable}
        else:
            held = Counter(u for v in subset for u in v.gpus)
            units = free | {
                u
                for u, n in held.items()
                if n >= holders[u] and u in eligible and u not in excluded
            }
        cpus = node.cpus + sum(v.cpus for v in subset)
        mem = node.mem + sum(v.mem for v in subset)
        return len(units) >= need.gpus and cpus >= need.cpus and mem >= (need.mem or 0)

    def lost(subset: Sequence[RunningJob]) -> float:
        return sum(max(0.0, now - v.start_time) for v in subset)

    if not candidates or not fits(candidates):
        return None
    if len(candidates) <= EXACT_UP_TO:
        ordered = sorted(candidates, key=lambda v: now - v.start_time)
        best: tuple[float, int, list[RunningJob]] | None = None
        for size in range(1, len(ordered) + 1):
            # the k youngest jobs lose the least work any k victims can: if even they lose as
            # much as the best choice so far, no larger set can do better
            if best is not None and lost(ordered[:size]) >= best[0]:
                break
            for subset in combinations(ordered, size):
                cost = lost(subset)
                if (best is None or (cost, size) < best[:2]) and fits(subset):
                    best = (cost, size, list(subset))
        assert best is not None
        return best[0], best[2]
    chosen: list[RunningJob] = []
    for victim in sorted(candidates, key=lambda v: now - v.start_time):
        chosen.append(victim)
        if fits(chosen):
            break
    for victim in sorted(chosen, key=lambda v: now - v.start_time, reverse=True):
        rest = [v for v in chosen if v is not victim]
        if fits(rest):
            chosen = rest
    return lost(chosen), chosen


@dataclass(slots=True)
class VictimSearch:
    """What a pass's preempting jobs may take: each node's candidates and victims per tier,
    kept until the node changes. The pass owns `touched` (its count of changes per node) and
    `log` (each change's node, in order) and bumps both; `victims` is its set of jobs chosen
    (or stopping) already. Within a pass candidates only go: victims are added, reservations
    take units."""

    nodes: Mapping[str, FreeNode]
    running_on: Mapping[str, list[RunningJob]]
    victims: set[int]
    can_preempt: Callable[[str, str], bool]  # (preemptor's tier, victim's tier)
    now: float
    touched: Mapping[str, int]
    log: list[str]
    preemptible: dict[tuple[str, str], list[RunningJob]] = field(default_factory=dict)
    kept: dict[tuple[str, str], tuple[int, Candidates]] = field(default_factory=dict)
    found: dict[tuple[object, ...], tuple[int, Found]] = field(default_factory=dict)
    ordered: dict[str, _NodesByLoss] = field(default_factory=dict)  # by preemptor's tier

    def candidates(self, name: str, qos: str, reserved: frozenset[str]) -> Candidates:
        """The jobs on `name` that a job of `qos` may preempt now (not victims, no reserved
        unit), the least run time among them and their units."""
        version = self.touched[name]
        known = self.kept.get((name, qos))
        if known is None or known[0] != version:
            if (name, qos) not in self.preemptible:  # victims or not
                self.preemptible[(name, qos)] = [
                    r for r in self.running_on.get(name, ()) if self.can_preempt(qos, r.qos)
                ]
            jobs = [
                r
                for r in self.preemptible[(name, qos)]
                if r.job_id not in self.victims and not reserved.intersection(r.gpus)
            ]
            youngest = min((self.now - r.start_time for r in jobs), default=math.inf)
            known = self.kept[(name, qos)] = (
                version,
                (jobs, youngest, sum(len(r.gpus) for r in jobs)),
            )
        return known[1]

    def on(
        self, name: str, qos: str, need: Resources, reserved: frozenset[str], user: str
    ) -> Found:
        """victims_on for a job of `qos` on `name`."""
        share = need.gpu_share
        key = (name, qos, kind_of(need), need.gpus, need.cpus, need.mem, share, share and user)
        version = self.touched[name]
        known = self.found.get(key)
        if known is None or known[0] != version:
            jobs = self.candidates(name, qos, reserved)[0]
            answer = victims_on(self.nodes[name], need, jobs, self.now, reserved, user)
            known = self.found[key] = (version, answer)
        return known[1]

    def by_loss(self, qos: str, reserved: frozenset[str]) -> list[tuple[float, str, int]]:
        """(least run time, name, units) of `candidates` for a job of `qos` on each node with
        any, in that order: kept per tier and brought up to date with the nodes changed since
        (a preempting job looked at every node each time: most of a busy pass)."""
        kept = self.ordered.get(qos)
        if kept is None:
            kept = self.ordered[qos] = _NodesByLoss(len(self.log))
            changed: Iterable[str] = self.nodes
        else:
            changed = {n for n in self.log[kept.seen :] if n in self.nodes}
            kept.seen = len(self.log)
        for name in changed:
            jobs, youngest, units = self.candidates(name, qos, reserved)
            kept.update(name, (youngest, name, units) if jobs else None)
        return kept.order


@dataclass(slots=True)
class _NodesByLoss:
    """One tier's `VictimSearch.by_loss`, and how much of the log of changes it reflects."""

    seen: int
    order: list[tuple[float, str, int]] = field(default_factory=list)
    entries: dict[str, tuple[float, str, int]] = field(default_factory=dict)

    def update(self, name: str, entry: tuple[float, str, int] | None) -> None:
        old = self.entries.pop(name, None)
        if old is not None:
            del self.order[bisect_left(self.order, old)]
        if entry is not None:
            self.entries[name] = entry
            insort(self.order, entry)
