"""Late reports are history, not noise: a node given up for silence comes back and reports how
its jobs' starts ended meanwhile. In process, on a real store (SQLite and PostgreSQL), with a
clock moved by hand.

- The job waits for its next start: a start that ran to an end (completed, failed) withdraws
  the requeue, and the job ends as that start did, with its exit code.
- The job started again elsewhere, or the start was stopped (fenced): its history notes the
  old start's end with its figures.
- A report from a node that did not run that start changes nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from harness import Clock, FakeAgent, InProcessClient, passes_ran, run

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.nodes.agent_session import AgentSession
from gpuq.coordinator.server import Coordinator
from gpuq.domain.model import JobEvent
from gpuq.store.api import Store
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

TIMEOUT = 40.0
SETTINGS = CoordinatorSettings(heartbeat_timeout=TIMEOUT, kill_grace=5.0)


def ended(
    job_id: int, attempt: int, state: str, exit_code: int | None, reason: str, at: float
) -> apb.JobReport:
    return apb.JobReport(
        job_id=job_id,
        kind=apb.JobReport.ENDED,
        end_state=state,
        result=pb.JobResult(exit_code=exit_code, reason=reason),
        at=at,
        attempt=attempt,
    )


async def back(co: Coordinator, node: str, reports: list[apb.JobReport]) -> AgentSession:
    """The node's agent registers again, with the ends it kept (as after a cut or a freeze)."""
    register = apb.Register(node=node, cpus=16, mem=64 << 30, fake=True, jobs=reports)
    session = AgentSession(node)
    await co.link.register(register, session)
    return session


def history(events: list[JobEvent]) -> list[tuple[str, str]]:
    return [(e.to_state.value, e.reason) for e in events]


Scenario = Callable[[Coordinator, InProcessClient, Clock, int], Awaitable[None]]


def given_up_on_b(store: Store, scenario: Scenario) -> None:
    """Job 1 GPU starts on node b; b goes silent and is given up (the job is requeued, and
    nothing else can run it); then `scenario`."""
    clock = Clock()

    async def body(co: Coordinator) -> None:
        b = await FakeAgent(co, "b", 1).connect()
        alice = InProcessClient(co, "alice")
        job_id = await alice.submit("sleep 60", gpus=1)
        await b.started(job_id)
        b.disconnect()
        clock.advance(TIMEOUT + 1)
        await co.node_admin.check_heartbeats()
        job = await alice.wait_state(job_id, "pending")
        assert job.requeue_count == 1
        await scenario(co, alice, clock, job_id)

    run(store, body, SETTINGS, clock)


@pytest.mark.parametrize(
    ("state", "code", "reason"), [("completed", 0, ""), ("failed", 3, "exit code 3")]
)
def test_a_start_that_ended_while_its_node_was_away_withdraws_the_requeue(
    store: Store, state: str, code: int, reason: str
) -> None:
    async def scenario(co: Coordinator, alice: InProcessClient, clock: Clock, job_id: int) -> None:
        at = clock.now - 20  # while b was silent
        await back(co, "b", [ended(job_id, 1, state, code, reason, at)])
        job = await alice.wait_state(job_id, state)
        assert job.result is not None and job.result.exit_code == code
        assert job.end_time == at and job.requeue_count == 1
        _, events = await alice.detail(job_id)
        states = [s for s, _ in history(events)]
        assert states == ["pending", "running", "node_fail", "pending", state]
        assert "start 1 on node b, reported late: its requeue is withdrawn" in events[-1].reason
        await passes_ran(co)
        assert (await alice.get(job_id)).state.value == state  # and it never starts again

    given_up_on_b(store, scenario)


def test_a_late_end_of_a_job_that_started_again_is_noted_in_its_history(store: Store) -> None:
    async def scenario(co: Coordinator, alice: InProcessClient, clock: Clock, job_id: int) -> None:
        a = await FakeAgent(co, "a", 1).connect()
        await a.started(job_id)
        await alice.wait_state(job_id, "running")
        await back(co, "b", [ended(job_id, 1, "completed", 0, "", clock.now - 20)])
        _, events = await alice.detail(job_id)
        noted = [r for s, r in history(events) if "reported late" in r]
        assert noted and noted[0].startswith("start 1 on node b ended completed at ")
        assert noted[0].endswith("(exit 0), reported late by its node"), noted
        job = await alice.get(job_id)
        assert (job.state.value, job.node, job.start_count) == ("running", "a", 2)
        a.end(job_id)
        assert (await alice.wait_state(job_id, "completed")).node == "a"

    given_up_on_b(store, scenario)


def test_a_fenced_start_reported_late_leaves_the_requeue_and_is_noted(store: Store) -> None:
    async def scenario(co: Coordinator, alice: InProcessClient, clock: Clock, job_id: int) -> None:
        why = "fenced: no word from the coordinator for 8 s"
        await back(co, "b", [ended(job_id, 1, "node_fail", None, why, clock.now - 30)])
        _, events = await alice.detail(job_id)
        assert history(events)[-1][1].startswith("start 1 on node b ended node_fail at ")
        assert why in history(events)[-1][1]
        assert (await alice.get(job_id)).state.value == "pending"

    given_up_on_b(store, scenario)


def test_a_late_report_from_a_node_that_did_not_run_the_start_changes_nothing(
    store: Store,
) -> None:
    async def scenario(co: Coordinator, alice: InProcessClient, clock: Clock, job_id: int) -> None:
        _, before = await alice.detail(job_id)
        await back(co, "c", [ended(job_id, 1, "completed", 0, "forged", clock.now)])
        await back(co, "b", [ended(job_id, 2, "completed", 0, "another start", clock.now)])
        await passes_ran(co)
        _, after = await alice.detail(job_id)
        assert history(after) == history(before)
        assert (await alice.get(job_id)).state.value == "pending"

    given_up_on_b(store, scenario)


def test_a_late_report_after_a_coordinator_restart_still_counts(store: Store) -> None:
    """The given-up start is kept in the store: a coordinator that restarted while node b was
    away still takes b's late report as that start's end (here: the requeue is withdrawn),
    and only once."""
    clock = Clock()
    ids: list[int] = []

    async def lost(co: Coordinator, alice: InProcessClient, clock: Clock, job_id: int) -> None:
        ids.append(job_id)

    given_up_on_b(store, lost)
    [job_id] = ids

    async def after_restart(co: Coordinator) -> None:
        alice = InProcessClient(co, "alice")
        report = ended(job_id, 1, "completed", 0, "", clock.now - 5)
        session = await back(co, "b", [report])
        job = await alice.wait_state(job_id, "completed")
        assert job.result is not None and job.result.exit_code == 0
        co.link.disconnected("b", session)
        await back(co, "b", [report])  # said again (an agent that missed the ack): nothing
        _, events = await alice.detail(job_id)
        assert [e.to_state.value for e in events].count("completed") == 1
        assert not [e for e in events if "reported late by its node" in e.reason]

    run(store, after_restart, SETTINGS, clock)
    assert store.given_up_starts() == []
