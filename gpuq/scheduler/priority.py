"""Multifactor priority: QOS + age + fair share - nice, as SLURM's priority/multifactor.

Fair share is SLURM's classic formula with equal shares: a user's factor is 2^(-U/S), where U
is the user's part of all recent GPU-seconds (exponentially decayed, half-life from config) and
S is an equal share among the users present. Nobody with no recent usage gets 1; two users
who used the same get the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuq.domain.policy import QosTier, SchedulerSettings
from gpuq.scheduler.snapshot import PendingJob


@dataclass(frozen=True, slots=True)
class Factors:
    qos: float
    age: float
    fairshare: float
    nice: float

    @property
    def total(self) -> float:
        return self.qos + self.age + self.fairshare - self.nice

    def as_pairs(self) -> tuple[tuple[str, float], ...]:
        return (
            ("qos", self.qos),
            ("age", self.age),
            ("fairshare", self.fairshare),
            ("nice", -self.nice),
        )


def decayed(value: float, since: float, now: float, half_life: float) -> float:
    """`value` GPU-seconds recorded at `since`, as they weigh at `now`."""
    if half_life <= 0 or now <= since:
        return value
    return float(value * 0.5 ** ((now - since) / half_life))


def fairshare_factors(usage: Mapping[str, float], users: Iterable[str]) -> dict[str, float]:
    """Each user's fair-share factor in [0, 1] from their decayed GPU-seconds."""
    present = set(users) | {u for u, v in usage.items() if v > 0}
    total = sum(max(0.0, usage.get(u, 0.0)) for u in present)
    if not present or total <= 0:
        return dict.fromkeys(present, 1.0)
    share = 1.0 / len(present)
    return {u: 2.0 ** (-(max(0.0, usage.get(u, 0.0)) / total) / share) for u in present}


def factors(
    qos_weight: float,
    submit_time: float,
    fairshare: float,
    nice: int,
    now: float,
    settings: SchedulerSettings,
) -> Factors:
    age = min(1.0, max(0.0, now - submit_time) / settings.max_age) if settings.max_age else 0.0
    return Factors(
        qos=float(qos_weight),
        age=settings.weight_age * age,
        fairshare=settings.weight_fairshare * fairshare,
        nice=float(nice),
    )


def rank(
    jobs: Sequence[PendingJob],
    usage: Mapping[str, float],
    tiers: Mapping[str, QosTier],
    settings: SchedulerSettings,
    now: float,
) -> list[PendingJob]:
    """The queue in scheduling order: highest priority first, then submit order (job id).
    The same arithmetic as `factors`, inlined: this runs over the whole queue, so it makes
    plain floats and sorts positions by them (no tuple per job to build, compare and collect)."""
    shares = fairshare_factors(usage, {j.user for j in jobs})
    weights = {name: tier.priority for name, tier in tiers.items()}
    w_age = settings.weight_age / settings.max_age if settings.max_age else 0.0
    cap = settings.weight_age if settings.max_age else 0.0
    w_share = settings.weight_fairshare
    negated = []
    for j in jobs:  # min() and max() as comparisons, in their order: the same floats
        waited = now - j.submit_time
        age = (waited if waited > 0.0 else 0.0) * w_age
        negated.append(
            -(
                weights.get(j.qos, 0)
                + (age if age < cap else cap)
                + w_share * shares[j.user]
                - j.nice
            )
        )
    ids = [j.job_id for j in jobs]
    order = sorted(range(len(ids)), key=ids.__getitem__)  # by id; a queue mostly is already
    order.sort(key=negated.__getitem__)  # stable: equal priorities stay in id order
    return [jobs[i] for i in order]
