"""Fair share through the coordinator, on a fake clock and a real store (SQLite and
PostgreSQL): a job's GPU-seconds are charged to its user when it ends, on top of what that user
had, decayed by [scheduler] fairshare_half_life to the end; the store keeps the figure and its
moment, a restarted coordinator decays on from there, and the fair-share factors follow."""

from __future__ import annotations

import asyncio

import pytest
from harness import Clock, record_ends, submit
from helpers import make_spec, until

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.nodes.agent_session import AgentSession
from gpuq.coordinator.server import Coordinator, assemble
from gpuq.domain.model import JobResult
from gpuq.domain.policy import SchedulerSettings
from gpuq.domain.states import JobState
from gpuq.store.api import Store
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

HALF_LIFE = 1000.0
T0 = 1_000_000.0
SETTINGS = CoordinatorSettings(scheduler=SchedulerSettings(fairshare_half_life=HALF_LIFE))
GPU = pb.GpuUnit(uuid="GPU-1", index=0, name="fake", memory=1 << 30, pci_bus_id="0:1")


async def run_job(co: Coordinator, clock: Clock, user: str, seconds: float) -> None:
    """A one-GPU job of `user` that starts now and ends completed `seconds` later."""
    [job_id] = await submit(co, make_spec(gpus=1), user)
    await until(lambda: co.jobs.jobs[job_id].state is JobState.RUNNING)
    assert co.jobs.jobs[job_id].start_time == clock.now
    clock.now += seconds
    await record_ends(co, "n1", [(job_id, JobState.COMPLETED, JobResult(exit_code=0), None)])
    assert job_id not in co.jobs.jobs


def test_usage_is_charged_decayed_kept_and_decays_on_after_a_restart(store: Store) -> None:
    clock = Clock(T0)
    first_end = T0 + 400
    second_end = first_end + HALF_LIFE
    bobs_end = second_end + 300

    async def main() -> None:
        co = assemble(store, SETTINGS, clock)
        link = co.link
        await co.start()
        try:
            register = apb.Register(node="n1", gpus=[GPU], cpus=4, mem=1 << 34, fake=True)
            await link.register(register, AgentSession("n1"))
            link.heartbeat("n1", apb.Heartbeat())  # its units' health: they may be given out

            await run_job(co, clock, "alice", 400)
            assert co.inputs.current_usage(clock.now) == {"alice": 400}
            # one half-life after her first end, her 400 weigh 200; the second adds its 100
            clock.now = second_end - 100
            await run_job(co, clock, "alice", 100)
            assert clock.now == second_end
            assert co.inputs.current_usage(clock.now) == {"alice": pytest.approx(300)}
            # Bob's 300 end later: after one more half-life his weigh 150, hers less
            await run_job(co, clock, "bob", 300)
            clock.now = bobs_end + HALF_LIFE
            usage = co.inputs.current_usage(clock.now)
            alice = 300 * 0.5 ** ((clock.now - second_end) / HALF_LIFE)
            assert usage == {"alice": pytest.approx(alice), "bob": pytest.approx(150)}
            co.loop.rerank()
            shares = co.inputs.shares
            total = alice + 150
            assert shares == {
                "alice": pytest.approx(2 ** (-(alice / total) * 2)),
                "bob": pytest.approx(2 ** (-(150 / total) * 2)),
            }
            assert shares["alice"] > shares["bob"]  # undecayed, their 300 each would tie
        finally:
            await co.close()

    asyncio.run(main())
    kept = store.usage()
    assert kept == {
        "alice": (pytest.approx(300), second_end),
        "bob": (pytest.approx(300), bobs_end),
    }

    async def restarted() -> None:
        co = assemble(store, SETTINGS, Clock(bobs_end + 2 * HALF_LIFE))
        await co.start()
        try:
            usage = co.inputs.current_usage(co.clock())
            alice = 300 * 0.5 ** ((bobs_end + 2 * HALF_LIFE - second_end) / HALF_LIFE)
            assert usage == {"alice": pytest.approx(alice), "bob": pytest.approx(75)}
        finally:
            await co.close()

    asyncio.run(restarted())
