"""Every change says what caused it (Dask's stimulus id): a request and its caller, an agent's
report, a scheduling pass, a chore. The cause is kept with each event in the store (gpuq show's
history) and travels with the events watchers get. Through the assembled coordinator, in
process, on a real store (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import re

from harness import cancel, message_with, run, submit, until
from helpers import make_spec

from gpuq.coordinator.nodes.agent_session import AgentSession
from gpuq.coordinator.server import Coordinator
from gpuq.domain.model import JobEvent
from gpuq.domain.states import JobState
from gpuq.store.api import Store
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

GPU = pb.GpuUnit(uuid="GPU-1", index=0, name="fake", memory=1 << 30, pci_bus_id="0:1")


def test_history_and_watchers_say_what_caused_each_change(store: Store) -> None:
    ids: list[int] = []
    watched: list[JobEvent] = []

    async def body(co: Coordinator) -> None:
        async def watch() -> None:
            async for batch in co.watchers.watch(()):
                watched.extend(batch)

        watching = asyncio.create_task(watch())
        session = AgentSession("n1")
        register = apb.Register(node="n1", gpus=[GPU], cpus=4, mem=1 << 34, fake=True)
        await co.link.register(register, session)
        co.link.heartbeat("n1", apb.Heartbeat())
        [ran] = await submit(co, make_spec(gpus=1), "alice")
        [waits] = await submit(co, make_spec(gpus=1, hold=True), "alice")
        ids.extend((ran, waits))
        [launch] = (await message_with(session, "start")).start
        end = apb.JobReport(job_id=ran, kind=apb.JobReport.ENDED, end_state="completed")
        end.attempt = launch.attempt
        co.link.reports("n1", [end])
        await until(lambda: ran not in co.jobs.jobs)
        await cancel(co, [str(waits)], "alice")
        await until(
            lambda: any(e.job_id == waits and e.cause == "Cancel by alice" for e in watched)
        )
        watching.cancel()

    run(store, body)
    ran, waits = ids
    history = [(e.to_state, e.cause) for e in store.events(ran)]
    assert history[0] == (JobState.PENDING, "test")  # the harness's own submissions
    assert history[1][0] is JobState.RUNNING
    if store.engine.dialect.name == "sqlite":  # it started with its submission, on an idle node
        assert history[1][1] == "test"
    else:  # PostgreSQL's commits run in a thread: a pass started it
        assert re.fullmatch(r"scheduling pass \d+", history[1][1])
    assert history[2] == (JobState.COMPLETED, "report from node n1")
    final = store.events(waits)[-1]
    assert (final.to_state, final.cause) == (JobState.CANCELLED, "Cancel by alice")
    told = {(e.job_id, e.to_state): e.cause for e in watched}
    assert told[(ran, JobState.COMPLETED)] == "report from node n1"
    assert told[(waits, JobState.CANCELLED)] == "Cancel by alice"
