"""Which running jobs to preempt so that a blocked job fits: the fewest seconds of work lost
(run time since each victim's last start), then the fewest victims.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import combinations

from gpuq.domain.model import Resources
from gpuq.scheduler.reserve import FreeNode
from gpuq.scheduler.snapshot import RunningJob

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
