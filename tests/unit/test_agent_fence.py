"""An agent cut off from its coordinator fences its jobs (stops them, node_fail) once
fence_time has passed since the coordinator was last known to be there: not before, and not
much after (within one look: a tenth of fence_time, at most a second apart). Driven on a fake
clock: the fence loop's sleeps advance the clock instead of waiting, so a fence four times late
(or early) fails here in milliseconds. Only gpuq.agent.fencing's `time` and `asyncio` names are
replaced, for the loop alone; the Fence stops jobs through recording supervisors.

The e2e tests (test_faults_e2e, test_network_cut_e2e) check the same with real processes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from gpuq.agent import fencing as fencing_module
from gpuq.agent.fencing import FENCE_GRACE, Fence
from gpuq.agent.node_agent import KEEPALIVE_MAX, KEEPALIVE_MIN, Agent
from gpuq.config.settings import AgentSettings, CoordinatorSettings


class Horizon(Exception):
    """The drive is over: the fake clock reached its end."""


@dataclass
class FakeClock:
    """time.monotonic for the fencing module, and asyncio.sleep for its fence loop: a sleep
    moves the clock on at once; `at` runs an action once the clock reaches a moment."""

    now: float = 0.0
    horizon: float = float("inf")
    actions: list[tuple[float, Callable[[], None]]] = field(default_factory=list)
    sleeps: list[float] = field(default_factory=list)

    def monotonic(self) -> float:
        return self.now

    def at(self, moment: float, action: Callable[[], None]) -> None:
        self.actions.append((moment, action))
        self.actions.sort(key=lambda pair: pair[0])

    async def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds
        while self.actions and self.actions[0][0] <= self.now:
            self.actions.pop(0)[1]()
        if self.now > self.horizon:
            raise Horizon


@dataclass
class RecordingHub:
    clock: FakeClock
    running: list[int] = field(default_factory=list)
    stops: list[tuple[float, int, str, str, int, float]] = field(default_factory=list)

    def running_jobs(self) -> list[int]:
        return list(self.running)

    async def stop(self, job_id: int, end_state: str, reason: str, sig: int, grace: float) -> None:
        self.stops.append((self.clock.now, job_id, end_state, reason, sig, grace))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(fencing_module, "time", SimpleNamespace(monotonic=fake.monotonic))
    monkeypatch.setattr(fencing_module, "asyncio", SimpleNamespace(sleep=fake.sleep))
    return fake


def keepalive(fence_time: float) -> tuple[float, float]:
    """The agent's keepalive for a fence_time (what it gives its Fence)."""
    settings = AgentSettings(node_name="n1", fence_time=fence_time)
    return Agent._keepalive(SimpleNamespace(options=SimpleNamespace(settings=settings)))  # type: ignore[arg-type]


def stand_in(clock: FakeClock, fence_time: float, jobs: list[int]) -> Any:
    """A Fence as an agent makes it, over recording supervisors."""
    hub = RecordingHub(clock, list(jobs))
    return Fence(fence_time, keepalive(fence_time), asyncio.Event(), hub)  # type: ignore[arg-type]


def drive(agent: Any, clock: FakeClock, until: float) -> None:
    """Run the agent's fence loop until the fake clock passes `until`."""
    clock.horizon = until

    async def main() -> None:
        with pytest.raises(Horizon):
            await agent.run()

    asyncio.run(main())


def look_every(fence_time: float) -> float:
    """How often the loop looks: a tenth of fence_time, at most once a second."""
    return min(1.0, fence_time / 10)


@pytest.mark.parametrize("fence_time", [0.5, 1.5, 30.0, 100.5, 240.0])
def test_a_cut_off_agent_fences_its_jobs_at_fence_time_not_before(
    clock: FakeClock, fence_time: float
) -> None:
    agent = stand_in(clock, fence_time, jobs=[4, 9])
    drive(agent, clock, until=3 * fence_time)
    stops = agent.supervisors.stops
    assert [job for _, job, *_ in stops] == [4, 9]  # each once, though the loop looked on
    reason = f"fenced: no word from the coordinator for {fence_time:g} s"
    for at, _, end_state, why, sig, grace in stops:
        assert fence_time <= at <= fence_time + look_every(fence_time) + 1e-9, at
        assert (end_state, why, sig, grace) == ("node_fail", reason, 0, FENCE_GRACE)
    assert agent.fenced == {4, 9}
    assert max(clock.sleeps) == look_every(fence_time)


def test_the_fence_counts_from_the_last_contact_not_from_the_loops_start(
    clock: FakeClock,
) -> None:
    agent = stand_in(clock, 240.0, jobs=[1])
    agent.last_contact = -100.0  # known there last 100 s before the loop began
    drive(agent, clock, until=400)
    [(at, *_)] = agent.supervisors.stops
    assert 140 <= at <= 141


def test_a_connected_agent_never_fences_and_forgets_its_fenced_jobs(clock: FakeClock) -> None:
    agent = stand_in(clock, 10.0, jobs=[1])
    agent.connected.set()
    agent.last_contact = -1e6  # stale, but a connection is up: the coordinator is there
    clock.at(50, lambda: agent.fenced.add(1))

    def lose() -> None:  # the connection goes at 100 (last known there then), a job starts
        assert agent.supervisors.stops == []
        assert agent.fenced == set()  # cleared while connected
        agent.connected.clear()
        agent.last_contact = 100.0
        agent.supervisors.running.append(2)

    clock.at(100, lose)
    drive(agent, clock, until=130)
    assert [(job, state) for _, job, state, *_ in agent.supervisors.stops] == [
        (1, "node_fail"),
        (2, "node_fail"),
    ]
    assert all(110 <= at <= 111 for at, *_ in agent.supervisors.stops)


def test_a_job_started_after_the_fence_is_fenced_at_the_next_look(clock: FakeClock) -> None:
    agent = stand_in(clock, 20.0, jobs=[1])
    clock.at(25, lambda: agent.supervisors.running.append(2))
    drive(agent, clock, until=40)
    assert [(job, round(at)) for at, job, *_ in agent.supervisors.stops] == [(1, 20), (2, 25)]


# ---- when the coordinator was last known to be there -----------------------------------------


def rpc_error(details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, details=details)


@pytest.mark.parametrize(
    ("fence_time", "every"),
    [(1.0, KEEPALIVE_MIN), (2.0, KEEPALIVE_MIN), (8.0, 2.0), (20.0, KEEPALIVE_MAX), (240.0, 5.0)],
)
def test_keepalive_pings_every_quarter_fence_time_within_bounds(
    clock: FakeClock, fence_time: float, every: float
) -> None:
    assert keepalive(fence_time) == (every, every)


@pytest.mark.parametrize(
    ("error", "earlier"),
    [
        (None, 0.0),  # the stream ended: the coordinator was there until now
        (rpc_error("Socket closed"), 0.0),
        (rpc_error("Connection reset by peer"), 0.0),
        (rpc_error("GOAWAY received"), 0.0),
        # given up by keepalive (a silent cut): last known there a ping and its timeout ago
        (rpc_error("ping timeout"), 10.0),
        (rpc_error("keepalive watchdog timeout"), 10.0),
        # a failure this agent cannot tell: rather fence early than late
        (rpc_error("failed to connect to all addresses"), 10.0),
    ],
)
def test_a_lost_connection_dates_the_last_contact(
    clock: FakeClock, error: grpc.aio.AioRpcError | None, earlier: float
) -> None:
    agent = stand_in(clock, 240.0, jobs=[])  # pings every 5 s, 5 s to answer
    agent.last_heard = 900.0
    clock.now = 1000.0
    agent.lost(error)
    assert agent.last_contact == 1000.0 - earlier


def test_a_silent_cut_is_never_dated_before_the_last_message_heard(clock: FakeClock) -> None:
    agent = stand_in(clock, 240.0, jobs=[])
    agent.last_heard = 996.0
    clock.now = 1000.0
    agent.lost(rpc_error("ping timeout"))
    assert agent.last_contact == 996.0


def test_a_silently_cut_agent_fences_fence_time_after_its_last_answered_ping(
    clock: FakeClock,
) -> None:
    """As test_network_cut_e2e sees it, in milliseconds: cut at 1000, the keepalive gives up
    at 1010 (5 s pings, 5 s to answer), the loss is dated 1000, the job fenced at 1240."""
    agent = stand_in(clock, 240.0, jobs=[3])
    agent.last_heard = 990.0
    agent.connected.set()

    def given_up() -> None:
        agent.lost(rpc_error("keepalive watchdog timeout"))
        agent.connected.clear()

    clock.at(1010.0, given_up)
    drive(agent, clock, until=1400)
    [(at, job, state, *_)] = agent.supervisors.stops
    assert (job, state) == (3, "node_fail")
    assert 1240 <= at <= 1241


def test_a_fenced_job_is_stopped_before_the_coordinator_gives_its_node_up() -> None:
    """By default: fence_time plus the fenced job's grace stays under the node timeout, so a
    job the coordinator requeues after heartbeat_timeout never runs in two places."""
    fence_time = AgentSettings(node_name="n1").fence_time
    assert fence_time == 240.0
    assert fence_time + FENCE_GRACE < CoordinatorSettings().heartbeat_timeout == 300.0
