"""Delivery is acknowledged: each start has an attempt number; a start the agent never
received (it registers without the job, or hands it back NOT_STARTED) goes back to pending,
never node_fail; reports and stops for another attempt are ignored. Through the coordinator
and its agent link, on a real store (SQLite and PostgreSQL), with a stand-in agent stream."""

from __future__ import annotations

import asyncio

from harness import message_with, passes_ran, run, submit, until
from helpers import make_spec

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.nodes.agent_link import NOT_RECEIVED
from gpuq.coordinator.nodes.agent_session import AgentSession
from gpuq.coordinator.server import Coordinator, assemble
from gpuq.domain.policy import QosTier
from gpuq.domain.states import JobState
from gpuq.store.api import Store
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

GPU = pb.GpuUnit(uuid="GPU-1", index=0, name="fake", memory=1 << 30, pci_bus_id="0:1")


def register(jobs: list[apb.JobReport] | None = None) -> apb.Register:
    return apb.Register(node="n1", gpus=[GPU], cpus=4, mem=1 << 34, fake=True, jobs=jobs or [])


async def launched(session: AgentSession) -> list[apb.JobLaunch]:
    return list((await message_with(session, "start")).start)


def test_starts_carry_attempts_and_unreceived_starts_go_back_to_pending(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        link = co.link
        session = AgentSession("n1")
        await link.register(register(), session)
        link.heartbeat("n1", apb.Heartbeat())  # its units' health: they may be given out
        [job_id] = await submit(co, make_spec(gpus=1), "alice")
        [first] = await launched(session)
        assert (first.job_id, first.attempt) == (job_id, 1)

        # an end reported for another start is ignored (and acknowledged)
        stale = apb.JobReport(job_id=job_id, kind=apb.JobReport.ENDED, end_state="failed")
        stale.attempt = 7
        link.reports("n1", [stale])
        message = await message_with(session, "ack")
        assert list(message.ack) == [job_id]
        assert co.jobs.jobs[job_id].state is JobState.RUNNING

        # handed back unstarted: pending again, then started once more as attempt 2
        back = apb.JobReport(job_id=job_id, kind=apb.JobReport.NOT_STARTED, attempt=1)
        back.result.reason = "not started: n1 cannot start jobs (test)"
        link.reports("n1", [back])
        second = await launched(session)
        assert (second[0].job_id, second[0].attempt) == (job_id, 2)

        # the agent comes back without it: pending again (not node_fail), then attempt 3
        link.disconnected("n1", session)
        session = AgentSession("n1")
        await link.register(register(), session)
        link.heartbeat("n1", apb.Heartbeat())  # its units' health: they may be given out
        third = await launched(session)
        assert (third[0].job_id, third[0].attempt) == (job_id, 3)

        # a re-registration that reports an older start: that one is stopped, this one
        # (attempt 3, never received) is queued again; the node's only GPU, which the older
        # start holds, is offered again only once it is reported gone
        link.disconnected("n1", session)
        session = AgentSession("n1")
        old = apb.JobReport(job_id=job_id, kind=apb.JobReport.RUNNING, attempt=2)
        await link.register(register([old]), session)
        link.heartbeat("n1", apb.Heartbeat())  # its units' health: they may be given out
        message = await message_with(session, "stop")
        stops = [(s.job_id, s.attempt) for s in message.stop]
        assert stops == [(job_id, 2)]
        await until(lambda: co.jobs.jobs[job_id].state is JobState.PENDING)
        await passes_ran(co)  # the GPU is held: no pass starts it
        assert co.jobs.jobs[job_id].start_count == 3
        gone = apb.JobReport(job_id=job_id, kind=apb.JobReport.ENDED, end_state="cancelled")
        gone.attempt = 2
        link.reports("n1", [gone])
        await until(lambda: co.jobs.jobs[job_id].start_count == 4)

        # it ends for real
        done = apb.JobReport(job_id=job_id, kind=apb.JobReport.ENDED, end_state="completed")
        done.attempt = 4
        link.reports("n1", [done])
        await until(lambda: job_id not in co.jobs.jobs)

    run(store, body)
    job = store.get_job(job_id_of(store))
    assert job.state is JobState.COMPLETED and job.requeue_count == 0 and job.start_count == 4
    history = store.events(job.id)
    to_states = [e.to_state for e in history]
    assert JobState.NODE_FAIL not in to_states and JobState.PREEMPTED not in to_states
    reasons = [e.reason for e in history if e.to_state is JobState.PENDING]
    assert reasons[1:] == [
        "requeued: not started: n1 cannot start jobs (test)",
        NOT_RECEIVED,
        NOT_RECEIVED,
    ]
    assert store.live_allocations() == []
    assert store.usage().get("alice", (0.0, 0.0))[0] > 0  # only the real run is charged


def job_id_of(store: Store) -> int:
    from gpuq.store.records import JobQuery

    [job] = store.list_jobs(JobQuery())
    return job.id


def test_a_job_lost_with_its_node_is_requeued_as_often_as_its_qos_allows(store: Store) -> None:
    tiers = {"normal": QosTier("normal"), "never": QosTier("never", requeue_on_node_fail=0)}
    ids: dict[str, int] = {}

    async def body(co: Coordinator) -> None:
        link = co.link
        session = AgentSession("n1")
        two = apb.Register(node="n1", gpus=[GPU, pb.GpuUnit(uuid="GPU-2", index=1)], cpus=4)
        two.mem = 1 << 34
        await link.register(two, session)
        link.heartbeat("n1", apb.Heartbeat())  # its units' health: they may be given out
        ids["once"] = (await submit(co, make_spec("once", gpus=1), "alice"))[0]
        ids["never"] = (await submit(co, make_spec("never", gpus=1, qos="never"), "alice"))[0]
        await until(lambda: all(co.jobs.jobs[i].state is JobState.RUNNING for i in ids.values()))
        await co.endings.node_lost("n1", "no word from its agent for 300 s")
        assert co.jobs.jobs[ids["once"]].state is JobState.PENDING
        assert co.jobs.jobs[ids["once"]].requeue_count == 1
        assert ids["never"] not in co.jobs.jobs  # ended node_fail
        link.disconnected("n1", session)
        session = AgentSession("n1")
        await link.register(two, session)  # the node is back: the job starts again
        link.heartbeat("n1", apb.Heartbeat())  # its units' health: they may be given out
        await until(lambda: co.jobs.jobs[ids["once"]].state is JobState.RUNNING)
        await co.endings.node_lost("n1", "no word from its agent for 300 s")
        assert ids["once"] not in co.jobs.jobs  # its one requeue is spent

    run(store, body, CoordinatorSettings(qos=tiers))
    once, never = store.get_job(ids["once"]), store.get_job(ids["never"])
    assert once.state is JobState.NODE_FAIL and once.requeue_count == 1
    assert never.state is JobState.NODE_FAIL and never.requeue_count == 0
    assert [(e.to_state, e.reason) for e in store.events(once.id)][2:4] == [
        (JobState.NODE_FAIL, "no word from its agent for 300 s"),
        (JobState.PENDING, "requeued after node_fail (1 of 1 allowed by qos normal)"),
    ]
    assert store.live_allocations() == []


def test_a_nodes_units_wait_for_its_agents_first_word_on_their_health(store: Store) -> None:
    """Right after an agent registers (a coordinator restart, an agent restart) a unit an ended
    job left dirty must not look free: nothing starts on the node before its first heartbeat,
    and a unit that heartbeat says is dirty stays out."""

    async def main() -> None:
        co = assemble(store, CoordinatorSettings())
        link = co.link
        await co.start()

        def reasons(job_id: int) -> str:
            co.scheduling.forget_explanation()  # explain from the cluster as it is now
            detail = co.scheduling.pending_detail(co.jobs.jobs[job_id])
            return "; ".join(detail.waiting.reasons) if detail else ""

        try:
            session = AgentSession("n1")
            await link.register(register(), session)
            [job_id] = await submit(co, make_spec(gpus=1), "alice")
            await until(lambda: "has not reported" in reasons(job_id))
            dirty = pb.GpuUsage(uuid="GPU-1", health="dirty", health_reason="pid 7 still runs")
            link.heartbeat("n1", apb.Heartbeat(usage=[dirty]))
            await until(lambda: "pid 7 still runs" in reasons(job_id))
            assert co.jobs.jobs[job_id].state is JobState.PENDING
            link.heartbeat("n1", apb.Heartbeat(usage=[pb.GpuUsage(uuid="GPU-1", health="ok")]))
            [first] = await launched(session)
            assert first.job_id == job_id
        finally:
            await co.close()

    asyncio.run(main())
