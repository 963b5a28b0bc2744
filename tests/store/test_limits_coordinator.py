"""The coordinator's limits, each on both sides of its edge, on a fake clock and a real store
(SQLite and PostgreSQL), with a stand-in agent stream: a silent node is given up after
heartbeat_timeout and not before; the time-limit backstop stops a job only past its limit, the
kill grace and the slack; stops carry the configured kill grace; and the per-user and per-QOS
caps at submission refuse the first job over them, not the last one within; a submission's
request key holds for a day."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from harness import Clock, cancel, submit
from helpers import make_spec, until

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.memory.live_jobs import spec_size
from gpuq.coordinator.nodes.agent_link import AgentLink
from gpuq.coordinator.nodes.agent_session import AgentSession
from gpuq.coordinator.server import Coordinator, assemble
from gpuq.coordinator.workload.job_endings import TIME_LIMIT_SLACK
from gpuq.coordinator.workload.submissions import KEY_PURGE_EVERY, KEY_TTL
from gpuq.domain.array_specs import ArraySpec
from gpuq.domain.model import NodeState, Resources
from gpuq.domain.policy import QosTier
from gpuq.domain.states import JobState
from gpuq.errors import InvalidInput, Unsatisfiable
from gpuq.store.api import Store
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

T0 = 1_000_000.0
GPU = pb.GpuUnit(uuid="GPU-1", index=0, name="fake", memory=1 << 30, pci_bus_id="0:1")


Body = Callable[[Coordinator, AgentLink, AgentSession], Awaitable[None]]


def run(
    store: Store,
    clock: Clock,
    settings: CoordinatorSettings,
    body: Body,
    fence_time: float = 0,
    steady: Clock | None = None,
) -> None:
    """A coordinator on `clock` with node n1 (one GPU) registered and heard from at its start;
    `fence_time`: its agent's, as it registers (0: an agent that does not say); `steady`: the
    clock silences are measured by (None: `clock` itself, as if the wall clock never steps)."""

    async def main() -> None:
        co = assemble(store, settings, clock, steady=steady or clock)
        link = co.link
        await co.start()
        try:
            session = AgentSession("n1")
            register = apb.Register(
                node="n1", gpus=[GPU], cpus=4, mem=1 << 34, fake=True, fence_time=fence_time
            )
            await link.register(register, session)
            link.heartbeat("n1", apb.Heartbeat())  # its units' health: they may be given out
            await body(co, link, session)
        finally:
            await co.close()

    asyncio.run(main())


async def started(co: Coordinator, **spec: object) -> int:
    [job_id] = await submit(co, make_spec(gpus=1, **spec), "alice")
    await until(lambda: co.jobs.jobs[job_id].state is JobState.RUNNING)
    return job_id


async def next_stop(session: AgentSession) -> apb.StopJob:
    while True:
        message = await asyncio.wait_for(session.next_message(), 10)
        assert message is not None
        if message.stop:
            [stop] = message.stop
            return stop


# ---- heartbeat_timeout ----------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [300.0, 20.0])
def test_a_silent_node_is_given_up_after_heartbeat_timeout_not_before(
    store: Store, timeout: float
) -> None:
    clock = Clock(T0)
    ids: list[int] = []

    async def body(co: Coordinator, link: AgentLink, session: AgentSession) -> None:
        ids.append(await started(co, requeue=False))
        clock.now = T0 + timeout / 2
        link.heartbeat("n1", apb.Heartbeat())  # the last word from n1
        heard = clock.now
        clock.now = heard + timeout  # silent for exactly the timeout: still there
        await co.node_admin.check_heartbeats()
        assert co.nodes.nodes["n1"].node.state is NodeState.UP
        assert co.jobs.jobs[ids[0]].state is JobState.RUNNING and not session.closed
        clock.now = heard + timeout + 1  # a second more: given up
        await co.node_admin.check_heartbeats()
        assert co.nodes.nodes["n1"].node.state is NodeState.DOWN
        assert ids[0] not in co.jobs.jobs and session.closed

    run(store, clock, CoordinatorSettings(heartbeat_timeout=timeout), body)
    job = store.get_job(ids[0])
    assert job.state is JobState.NODE_FAIL
    assert job.reason == f"no word from its agent for {timeout:g} s"
    assert {n.name: n.state for n in store.list_nodes()} == {"n1": NodeState.DOWN}


@pytest.mark.parametrize(
    ("timeout", "fence_time", "allowed"),
    [
        (300.0, 240.0, 300.0),  # the defaults: the timeout leaves room for the fence
        (20.0, 8.0, 20.0),  # 8 + 5 + 1 fits in 20
        (20.0, 100.0, 106.0),  # an agent whose fence outlasts the timeout: wait for it
    ],
)
def test_a_silent_nodes_jobs_are_given_up_only_once_its_fence_has_stopped_them(
    store: Store, timeout: float, fence_time: float, allowed: float
) -> None:
    """Every job's own supervisor stops it fence_time after the coordinator last confirmed
    hearing from the node, and kills it after the kill grace: the coordinator requeues the
    node's jobs no sooner than the last sign of life plus both (plus a second's margin)."""
    clock = Clock(T0)
    ids: list[int] = []

    async def body(co: Coordinator, link: AgentLink, session: AgentSession) -> None:
        ids.append(await started(co, requeue=True))
        link.heartbeat("n1", apb.Heartbeat(), session)
        heard = clock.now
        clock.now = heard + allowed
        await co.node_admin.check_heartbeats()
        assert co.jobs.jobs[ids[0]].state is JobState.RUNNING and not session.closed
        clock.now = heard + allowed + 0.5
        await co.node_admin.check_heartbeats()
        assert co.nodes.nodes["n1"].node.state is NodeState.DOWN
        assert co.jobs.jobs[ids[0]].state is JobState.PENDING  # requeued once fenced

    settings = CoordinatorSettings(heartbeat_timeout=timeout, kill_grace=5.0)
    run(store, clock, settings, body, fence_time=fence_time)
    assert store.get_job(ids[0]).reason.startswith("requeued after node_fail")


@pytest.mark.parametrize("step", [3600.0, -3600.0])
def test_a_step_of_the_wall_clock_neither_hastens_nor_holds_a_silent_nodes_give_up(
    store: Store, step: float
) -> None:
    """NTP (or an admin's `date`) may step the coordinator's wall clock either way, while the
    node's supervisors count their fence on their own host's monotonic clock. So a silence is
    measured on the coordinator's steady clock: a step forward must not requeue a node's jobs
    while they may still run there (one job on two nodes), nor a step back keep them from
    being requeued once they are fenced."""
    wall, steady = Clock(T0), Clock(5_000.0)
    allowed = 20.0  # the timeout: it leaves room for the fence (8 + 5 + 1)
    ids: list[int] = []

    async def body(co: Coordinator, link: AgentLink, session: AgentSession) -> None:
        ids.append(await started(co, requeue=True))
        link.heartbeat("n1", apb.Heartbeat(), session)
        heard = steady.now
        wall.advance(step)  # the wall clock steps; no time passes
        assert co.node_admin.out_of_touch(["n1"]) == []  # just heard from
        steady.now = heard + allowed
        wall.advance(allowed)
        await co.node_admin.check_heartbeats()
        assert co.nodes.nodes["n1"].node.state is NodeState.UP
        assert co.jobs.jobs[ids[0]].state is JobState.RUNNING and not session.closed
        steady.now = heard + allowed + 0.5
        wall.advance(0.5)
        await co.node_admin.check_heartbeats()
        assert co.nodes.nodes["n1"].node.state is NodeState.DOWN
        assert co.jobs.jobs[ids[0]].state is JobState.PENDING  # requeued once fenced

    settings = CoordinatorSettings(heartbeat_timeout=allowed, kill_grace=5.0)
    run(store, wall, settings, body, fence_time=8.0, steady=steady)
    assert store.get_job(ids[0]).reason.startswith("requeued after node_fail")


def test_a_nodes_fence_time_outlives_a_coordinator_restart(store: Store) -> None:
    """The coordinator keeps each node's fence_time: restarted, it still waits for the fence
    of a node that has not registered again (from its own start, the node's last sign of life
    it can vouch for)."""
    clock = Clock(T0)
    settings = CoordinatorSettings(heartbeat_timeout=20.0, kill_grace=5.0)

    async def first(co: Coordinator, link: AgentLink, session: AgentSession) -> None:
        await started(co, requeue=True)

    run(store, clock, settings, first, fence_time=100.0)
    ids: list[int] = []

    async def main() -> None:
        clock.now = T0 + 50  # the coordinator restarts; n1 never comes back
        co = assemble(store, settings, clock, steady=clock)
        await co.start()
        try:
            [ids[:]] = [[j.id for j in co.jobs.running_on("n1")]]
            clock.now = T0 + 50 + 106  # 100 + 5 + 1 after the restart: not yet
            await co.node_admin.check_heartbeats()
            assert co.nodes.nodes["n1"].node.state is NodeState.UP
            clock.now = T0 + 50 + 106.5
            await co.node_admin.check_heartbeats()
            assert co.nodes.nodes["n1"].node.state is NodeState.DOWN
        finally:
            await co.close()

    asyncio.run(main())
    assert len(ids) == 1 and store.get_job(ids[0]).state is JobState.PENDING


def test_the_coordinator_echoes_what_counts_as_a_sign_of_life(store: Store) -> None:
    """The agent extends its jobs' leases only to a mark the coordinator echoed after taking
    the message as the node's last sign of life: its registration's, then each heartbeat's.
    A mark from a stream that is no longer the node's is not echoed."""
    clock = Clock(T0)

    async def seen(session: AgentSession) -> float:
        while True:
            message = await asyncio.wait_for(session.next_message(), 10)
            assert message is not None
            if message.seen:
                return message.seen

    async def main() -> None:
        co = assemble(store, CoordinatorSettings(), clock, steady=clock)
        await co.start()
        try:
            session = AgentSession("n1")
            register = apb.Register(node="n1", gpus=[GPU], cpus=4, mem=1 << 34, sent=41.5)
            await co.link.register(register, session)
            assert await seen(session) == 41.5
            co.link.heartbeat("n1", apb.Heartbeat(sent=42.25), session)
            co.link.heartbeat("n1", apb.Heartbeat(sent=47.25), session)
            assert await seen(session) == 47.25  # the latest of those waiting
            for mark in (float("nan"), float("inf"), -3.0):
                co.link.heartbeat("n1", apb.Heartbeat(sent=mark), session)
            stale = AgentSession("n1")
            co.link.heartbeat("n1", apb.Heartbeat(sent=99.0), stale)
            session.stop([])
            message = await asyncio.wait_for(session.next_message(), 10)
            assert message is not None and message.seen == 0
            assert co.nodes.nodes["n1"].last_seen == T0
        finally:
            await co.close()

    asyncio.run(main())


# ---- the time-limit backstop ----------------------------------------------------------------


@pytest.mark.parametrize(("limit", "grace"), [(600, 30.0), (None, 5.0)])
def test_the_time_limit_backstop_stops_a_job_past_limit_grace_and_slack_not_before(
    store: Store, limit: int | None, grace: float
) -> None:
    """Supervisors enforce time limits; the coordinator steps in only when one did not: past
    the limit (the job's, else its QOS default: a day), the kill grace and TIME_LIMIT_SLACK."""
    clock = Clock(T0)
    assert TIME_LIMIT_SLACK == 10.0
    edge = T0 + (limit or 86400) + grace + 10.0

    async def body(co: Coordinator, link: AgentLink, session: AgentSession) -> None:
        job_id = await started(co, resources=Resources(gpus=1, time_limit=limit))
        assert co.jobs.jobs[job_id].start_time == T0
        clock.now = edge
        await co.endings.check_time_limits()
        assert co.jobs.jobs[job_id].stop is None
        clock.now = edge + 1
        await co.endings.check_time_limits()
        stop = await next_stop(session)
        assert (stop.job_id, stop.end_state, stop.reason) == (
            job_id,
            "timeout",
            "time limit reached",
        )
        assert stop.grace == 0.0  # past its grace already: killed at once
        await co.endings.check_time_limits()  # asked once
        assert co.jobs.jobs[job_id].stop is not None

    run(store, clock, CoordinatorSettings(kill_grace=grace), body)


# ---- kill_grace ----------------------------------------------------------------------------


@pytest.mark.parametrize("grace", [30.0, 45.0, 0.0])
def test_a_cancelled_jobs_stop_carries_the_kill_grace(store: Store, grace: float) -> None:
    clock = Clock(T0)

    async def body(co: Coordinator, link: AgentLink, session: AgentSession) -> None:
        job_id = await started(co)
        [outcome] = await cancel(co, [str(job_id)], "alice")
        assert outcome.message == f"stopping (SIGTERM, then SIGKILL after {grace:g} s)"
        stop = await next_stop(session)
        assert (stop.job_id, stop.end_state, stop.grace) == (job_id, "cancelled", grace)

    run(store, clock, CoordinatorSettings(kill_grace=grace), body)


# ---- caps at submission ---------------------------------------------------------------------


def submit_run(
    store: Store, settings: CoordinatorSettings, body: Callable[[Coordinator], Awaitable[None]]
) -> None:
    """A coordinator without nodes: what is submitted waits."""

    async def main() -> None:
        co = assemble(store, settings, Clock(T0))
        await co.start()
        try:
            await body(co)
        finally:
            await co.close()

    asyncio.run(main())


def test_max_queued_per_user_counts_array_tasks_up_to_the_limit(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        await submit(co, make_spec(array=ArraySpec(tuple(range(8)))), "alice")
        with pytest.raises(Unsatisfiable, match="per user; alice has 8 and this adds 3"):
            await submit(co, make_spec(array=ArraySpec((0, 1, 2))), "alice")
        await submit(co, make_spec(array=ArraySpec((0, 1))), "alice")  # 10: the limit
        with pytest.raises(Unsatisfiable, match="at most 10 queued or running jobs and array"):
            await submit(co, make_spec(), "alice")
        await submit(co, make_spec(), "bob")  # per user

    submit_run(store, CoordinatorSettings(max_queued_per_user=10), body)


def test_max_queued_bytes_per_user_up_to_the_limit(store: Store) -> None:
    spec = make_spec(env={"DATA": "x" * 1000})
    size = spec_size(spec)
    assert size > 1000

    async def body(co: Coordinator) -> None:
        for _ in range(3):
            await submit(co, spec, "alice")  # 3 x size: the limit
        with pytest.raises(Unsatisfiable, match="may hold at most"):
            await submit(co, spec, "alice")
        await submit(co, spec, "bob")

    submit_run(store, CoordinatorSettings(max_queued_bytes_per_user=3 * size), body)


def test_a_qos_max_submitted_jobs_up_to_the_limit(store: Store) -> None:
    tiers = {"normal": QosTier("normal", max_submitted_jobs=3), "other": QosTier("other")}

    async def body(co: Coordinator) -> None:
        await submit(co, make_spec(), "alice")
        await submit(co, make_spec(array=ArraySpec((0, 1))), "alice")  # 3: the limit
        with pytest.raises(
            Unsatisfiable,
            match="qos normal allows 3 queued or running jobs per user; alice has 3 and this adds",
        ):
            await submit(co, make_spec(), "alice")
        await submit(co, make_spec(qos="other"), "alice")  # per QOS
        await submit(co, make_spec(), "bob")  # per user

    submit_run(store, CoordinatorSettings(qos=tiers), body)


def test_a_qos_max_time_up_to_the_limit(store: Store) -> None:
    tiers = {"normal": QosTier("normal", max_time=7200)}

    async def body(co: Coordinator) -> None:
        await submit(co, make_spec(resources=Resources(time_limit=7200)), "alice")
        with pytest.raises(
            InvalidInput, match="--time '02:00:01': qos normal allows at most 02:00:00"
        ):
            await submit(co, make_spec(resources=Resources(time_limit=7201)), "alice")

    submit_run(store, CoordinatorSettings(qos=tiers), body)


# ---- request keys ---------------------------------------------------------------------------


def test_a_request_key_holds_for_a_day_and_is_forgotten_after(store: Store) -> None:
    """A repeat with the same key within KEY_TTL (a day) is the first submission; after it,
    once the keys are purged (the first submission past the hourly purge), a new job."""
    assert KEY_TTL == 86400.0 and KEY_PURGE_EVERY == 3600.0
    clock = Clock(T0)

    async def main() -> None:
        co = assemble(store, CoordinatorSettings(), clock, steady=clock)
        await co.start()
        try:
            first = await submit(co, make_spec(hold=True), "alice", "k")
            clock.now = T0 + KEY_TTL - 1
            assert await submit(co, make_spec(hold=True), "alice", "k") == first
            clock.now = T0 + KEY_TTL + 1
            again = await submit(co, make_spec(hold=True), "alice", "k")
            assert again != first and len(again) == 1
        finally:
            await co.close()

    asyncio.run(main())
