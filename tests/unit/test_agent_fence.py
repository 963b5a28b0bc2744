"""The agent's side of fencing: it extends its supervisors' leases to exactly what the
coordinator has confirmed (the echoed mark plus fence_time), never beyond; a fresh agent gives
none until confirmed; a lost connection leaves the leases as they are, with the reason a fenced
job gives. The supervisors that act on the leases are tested with real processes
(tests/e2e/test_supervisor_lease.py); the coordinator's wait in test_limits_coordinator, and
both together in test_fencing_e2e."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from gpuq.agent.fencing import LEASE_STEP_MAX, Fence
from gpuq.agent.node_agent import KEEPALIVE_MAX, KEEPALIVE_MIN, Agent
from gpuq.config.settings import AgentSettings, CoordinatorSettings
from gpuq.domain.policy import FENCE_MARGIN, fence_wait


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class RecordingSupervisors:
    leases: list[tuple[float, str]] = field(default_factory=list)

    def lease(self, until: float, why: str = "") -> None:
        self.leases.append((until, why))


def fence(fence_time: float, clock: Clock) -> tuple[Fence, RecordingSupervisors]:
    hub = RecordingSupervisors()
    return Fence(fence_time, hub, clock), hub  # type: ignore[arg-type]


def test_a_fresh_agent_gives_no_lease_until_the_coordinator_confirms_it() -> None:
    """An agent that restarts must not extend the leases its supervisors hold from the last
    one: the coordinator may be counting down from that agent's last heartbeat."""
    clock = Clock()
    agent, hub = fence(8.0, clock)
    agent.lost()
    assert hub.leases == [] and agent.confirmed is None
    agent.confirm(999.5)
    assert hub.leases == [(1007.5, "")]


@pytest.mark.parametrize("fence_time", [0.5, 8.0, 240.0])
def test_a_lease_runs_to_the_confirmed_mark_plus_fence_time(fence_time: float) -> None:
    clock = Clock()
    agent, hub = fence(fence_time, clock)
    step = min(LEASE_STEP_MAX, fence_time / 10)
    agent.confirm(990.0)
    for mark in (990.0 + step / 2, 990.0 + 1.5 * step, 990.0 + 3 * step):
        clock.now = mark + 0.01
        agent.confirm(mark)
    given = [until for until, _ in hub.leases]
    # never beyond what was confirmed, and never further behind it than one step
    assert given[0] == 990.0 + fence_time
    assert all(b > a for a, b in itertools.pairwise(given))
    assert given[-1] == 990.0 + 3 * step + fence_time
    assert len(given) == 3  # the half step was not worth a message


@pytest.mark.parametrize("mark", [math.inf, math.nan, -1.0, 0.0, 1000.5, 990.0, 985.0])
def test_a_mark_that_cannot_be_a_newer_one_of_this_agent_changes_nothing(mark: float) -> None:
    """A mark in the future (the coordinator echoing something else), not a number, or not
    newer than the last confirmed one never moves a lease."""
    clock = Clock()
    agent, hub = fence(8.0, clock)
    agent.confirm(990.0)
    agent.confirm(mark)
    assert hub.leases == [(998.0, "")] and agent.confirmed == 990.0


def test_a_lost_connection_keeps_the_lease_and_gives_the_reason() -> None:
    """Cut off, the agent cannot extend anything: its jobs are fenced fence_time after the
    last confirmation (even one the step held back), saying why."""
    clock = Clock()
    agent, hub = fence(8.0, clock)
    agent.confirm(990.0)
    agent.confirm(990.4)  # within the step: not sent on its own
    clock.now = 995.0
    agent.lost()
    assert hub.leases[-1] == (998.4, "no word from the coordinator for 8 s")


def test_keepalive_pings_every_quarter_fence_time_within_bounds() -> None:
    for fence_time, every in ((2.0, KEEPALIVE_MIN), (8.0, 2.0), (240.0, KEEPALIVE_MAX)):
        settings = AgentSettings(node_name="n1", fence_time=fence_time)
        agent = SimpleNamespace(options=SimpleNamespace(settings=settings))
        assert Agent._keepalive(agent) == (every, every)  # type: ignore[arg-type]


def test_by_default_the_node_timeout_leaves_room_for_the_fence() -> None:
    """fence_time plus the kill grace (plus the margin) fits in the default node timeout, so
    a silent node's jobs are given up at heartbeat_timeout, once their supervisors stopped
    them."""
    fence_time = AgentSettings(node_name="n1").fence_time
    coordinator = CoordinatorSettings()
    assert (fence_time, coordinator.kill_grace, FENCE_MARGIN) == (240.0, 30.0, 1.0)
    assert fence_wait(fence_time, coordinator.kill_grace) == 271.0
    assert fence_wait(fence_time, coordinator.kill_grace) <= coordinator.heartbeat_timeout
