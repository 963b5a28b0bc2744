"""Fair-share usage decays with [scheduler] fairshare_half_life: a user's recorded GPU-seconds
weigh half after one half-life and a quarter after two, and the fair-share factors follow.
Pure arithmetic and the coordinator's SchedulerInputs, on a fake clock (nothing sleeps)."""

from __future__ import annotations

import math

import pytest

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.memory.scheduler_inputs import SchedulerInputs
from gpuq.domain.policy import SchedulerSettings
from gpuq.scheduler.priority import decayed, fairshare_factors

DAY = 86400.0
HALF_LIFE = 1000.0
T0 = 1_000_000.0


def state(half_life: float = HALF_LIFE) -> SchedulerInputs:
    settings = CoordinatorSettings(scheduler=SchedulerSettings(fairshare_half_life=half_life))
    return SchedulerInputs(settings)


def test_the_default_half_life_is_a_week() -> None:
    """README's [scheduler] example: fairshare_half_life = 604800 (seconds)."""
    assert SchedulerSettings().fairshare_half_life == 7 * DAY == 604800
    assert state(7 * DAY).half_life == 604800


@pytest.mark.parametrize(
    ("elapsed", "weight"),
    [(0.0, 1.0), (HALF_LIFE / 2, 2**-0.5), (HALF_LIFE, 0.5), (2 * HALF_LIFE, 0.25)],
)
def test_usage_halves_every_half_life(elapsed: float, weight: float) -> None:
    assert decayed(800.0, T0, T0 + elapsed, HALF_LIFE) == pytest.approx(800.0 * weight)


def test_a_clock_that_went_back_does_not_grow_usage() -> None:
    assert decayed(800.0, T0, T0 - 5000, HALF_LIFE) == 800.0


def test_the_coordinators_usage_decays_to_the_moment_asked() -> None:
    sched = state()
    sched.usage = {"alice": (800.0, T0), "bob": (800.0, T0 + HALF_LIFE)}
    assert sched.current_usage(T0) == {"alice": 800.0, "bob": 800.0}  # bob's is not grown
    now = sched.current_usage(T0 + HALF_LIFE)
    assert now == {"alice": pytest.approx(400.0), "bob": pytest.approx(800.0)}
    later = sched.current_usage(T0 + 2 * HALF_LIFE)
    assert later == {"alice": pytest.approx(200.0), "bob": pytest.approx(400.0)}


def test_a_charge_adds_to_the_decayed_usage() -> None:
    sched = state()
    sched.usage = {"alice": (800.0, T0)}
    assert sched.charge("alice", 100.0, T0) == pytest.approx(900.0)
    assert sched.charge("alice", 100.0, T0 + HALF_LIFE) == pytest.approx(500.0)
    assert sched.charge("alice", 100.0, T0 + 2 * HALF_LIFE) == pytest.approx(300.0)
    assert sched.charge("carol", 100.0, T0 + HALF_LIFE) == 100.0  # no usage before


def test_the_half_life_setting_is_the_one_used() -> None:
    sched = state(half_life=4 * HALF_LIFE)
    sched.usage = {"alice": (800.0, T0)}
    assert sched.current_usage(T0 + HALF_LIFE) == {"alice": pytest.approx(800.0 * 2**-0.25)}
    assert sched.current_usage(T0 + 4 * HALF_LIFE) == {"alice": pytest.approx(400.0)}


def test_factors_move_as_usage_decays() -> None:
    """Alice and Bob recorded the same GPU-seconds, Bob one half-life later: two half-lives
    after Alice's, hers weigh 200 and his 400 (Carol has none), so her factor is the higher,
    by the formula 2^(-U/S) with an equal share S of 1/3. Without decay they would tie."""
    sched = state()
    sched.usage = {"alice": (800.0, T0), "bob": (800.0, T0 + HALF_LIFE)}
    sched.refresh_shares(["alice", "bob", "carol"], T0 + 2 * HALF_LIFE)
    # alice 200, bob 400, carol 0 of 600; an equal share is 1/3
    assert sched.shares == {
        "alice": pytest.approx(2 ** (-(200 / 600) * 3)),
        "bob": pytest.approx(2 ** (-(400 / 600) * 3)),
        "carol": 1.0,
    }
    assert sched.ranked_at == T0 + 2 * HALF_LIFE

    # the same recorded usage with no decay would rank alice and bob alike
    undecayed = fairshare_factors({"alice": 800.0, "bob": 800.0}, ["alice", "bob", "carol"])
    assert undecayed["alice"] == undecayed["bob"]
    assert sched.shares["alice"] > sched.shares["bob"]


def test_old_usage_is_forgiven_over_many_half_lives() -> None:
    """A user who used a lot long ago gets almost a full factor back beside a light recent
    user: after 20 half-lives, a million GPU-seconds weigh about one."""
    sched = state()
    sched.usage = {"alice": (1_000_000.0, T0), "bob": (100.0, T0 + 20 * HALF_LIFE)}
    now = T0 + 20 * HALF_LIFE
    assert sched.current_usage(now)["alice"] == pytest.approx(1_000_000 / 2**20)
    sched.refresh_shares(["alice", "bob"], now)
    assert sched.shares["alice"] > 0.9 > 0.3 > sched.shares["bob"]
    left = 1_000_000 / 2**20
    assert math.isclose(sched.shares["alice"], 2 ** (-(left / (left + 100)) * 2))
