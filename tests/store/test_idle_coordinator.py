"""Idle and hung jobs through the assembled coordinator in process, on a real store (SQLite and
PostgreSQL), with a clock moved by hand and an agent that runs nothing and says what its jobs'
GPUs do (Heartbeat.jobs): a job held idle past its QOS's window is flagged (on its record and
in its events) and, under a QOS that cancels idle jobs, cancelled with the reason; one whose
GPUs get busy loses the flag; a 2-GPU job whose GPUs stay at one figure with no output is
flagged possibly hung, and loses the flag once it writes. (These were end-to-end tests over a
raw agent stream; a real agent sampling a fake GPU stays in tests/e2e/test_idle_e2e.py.)"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from harness import GIB, Clock, FakeAgent, InProcessClient, eventually, run

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.server import Coordinator
from gpuq.domain.policy import QosTier
from gpuq.store.api import Store
from gpuq.v1 import agent_pb2 as apb

# normal: flag only; reaper: cancel idle jobs. Both: 2 s windows.
SETTINGS = CoordinatorSettings(
    qos={
        "normal": QosTier("normal", priority=1000, default_time=3600, idle_window=2, hung_window=2),
        "reaper": QosTier(
            "reaper",
            priority=1000,
            default_time=3600,
            idle_window=2,
            idle_action="cancel",
            hung_window=0,
        ),
    }
)


class SampledAgent:
    """A node that runs nothing and, at each `beat`, says for every job it runs what its GPUs
    did: `utils[job]` per unit (unset: 0 %; None: unknown) and, for jobs in `writing`, output
    that grew."""

    def __init__(self, agent: FakeAgent, clock: Clock) -> None:
        self.agent = agent
        self.clock = clock
        self.utils: dict[int, list[float | None]] = {}
        self.writing: set[int] = set()

    def beat(self) -> None:
        """A heartbeat one second after the last."""
        self.clock.advance(1.0)
        now = self.clock()
        samples = []
        for job_id, launch in self.agent.running.items():
            utils = self.utils.get(job_id, [0.0] * len(launch.gpus))
            units = [
                apb.UnitSample(uuid=u, memory=GIB, **({} if util is None else {"util": util}))
                for u, util in zip(launch.gpus, utils, strict=False)
            ]
            output = int(now * 1000) if job_id in self.writing else 0
            samples.append(
                apb.JobSample(
                    job_id=job_id,
                    at=now,
                    gpu_mem=GIB * len(units),
                    units=units,
                    output_bytes=output,
                )
            )
        self.agent.beat(samples)


async def flags(client: InProcessClient, job_id: int) -> list[str]:
    job, _ = await client.detail(job_id)
    return list(job.flags)


async def notes(client: InProcessClient, job_id: int) -> list[str]:
    _, events = await client.detail(job_id)
    return [e.reason for e in events if e.from_state == e.to_state]


Body = Callable[[Coordinator, SampledAgent, InProcessClient], Awaitable[None]]


def on_a_node(store: Store, gpus: int, body: Body) -> None:
    clock = Clock()

    async def main(co: Coordinator) -> None:
        agent = await FakeAgent(co, "raw", gpus).connect()
        await body(co, SampledAgent(agent, clock), InProcessClient(co, "alice"))

    run(store, main, SETTINGS, clock)


def test_idle_jobs_are_flagged_cleared_and_cancelled_by_qos(store: Store) -> None:
    async def body(co: Coordinator, sampled: SampledAgent, alice: InProcessClient) -> None:
        agent = sampled.agent
        watched = await alice.submit("sleep 600", gpus=1)
        reaped = await alice.submit("sleep 600", gpus=1, qos="reaper")
        unknown = await alice.submit("sleep 600", gpus=1)
        for job in (watched, reaped, unknown):
            await agent.started(job)
            await alice.wait_state(job, "running")
        sampled.utils[unknown] = [None]  # unknown is never idle
        sampled.utils[watched] = [0.0]

        # idle for less than the window: nothing yet
        for _ in range(2):
            sampled.beat()
        assert await flags(alice, watched) == await flags(alice, reaped) == []
        # the window is over: flagged (and the job keeps running), and cancelled by its QOS
        sampled.beat()
        [line] = await eventually(lambda: flags(alice, watched))
        assert line.startswith("idle since ") and line.endswith("below 5% for 2 s"), line
        assert await eventually(lambda: notes(alice, watched)) == [line]
        assert await alice.state(watched) == "running"

        done = await alice.wait_state(reaped, "cancelled")
        assert done.reason == "cancelled: idle: its GPUs below 5% for 2 s (qos reaper)"
        assert any(s.job_id == reaped and s.end_state == "cancelled" for s in agent.stops)
        assert (await notes(alice, reaped))[0].startswith("idle since ")
        assert await flags(alice, reaped) == []  # an ended job has none

        # the GPUs get busy: the flag goes, and that is in the events too
        sampled.utils[watched] = [80.0]
        sampled.beat()

        async def cleared() -> bool:
            return not await flags(alice, watched)

        async def both_notes() -> list[str] | None:
            found = await notes(alice, watched)
            return found if len(found) == 2 else None

        await eventually(cleared)
        assert await eventually(both_notes) == [line, f"flag cleared: {line}"]
        assert await flags(alice, unknown) == [] and await notes(alice, unknown) == []
        assert await alice.state(unknown) == "running"

    on_a_node(store, 4, body)


def test_a_multi_gpu_job_stuck_at_one_figure_is_possibly_hung(store: Store) -> None:
    async def body(co: Coordinator, sampled: SampledAgent, alice: InProcessClient) -> None:
        job = await alice.submit("sleep 600", gpus=2)
        sampled.utils[job] = [100.0, 100.0]
        await sampled.agent.started(job)
        await alice.wait_state(job, "running")
        for _ in range(3):
            sampled.beat()
        [line] = await eventually(lambda: flags(alice, job))
        assert line.startswith("possibly hung (NCCL?) since "), line
        assert line.endswith("2 GPUs at 100% with unchanged memory and no output for 2 s")
        # it writes output: not hung (and stays so while it writes)
        sampled.writing.add(job)
        sampled.beat()

        async def cleared() -> bool:
            return not await flags(alice, job)

        await eventually(cleared)
        for _ in range(3):  # past another window
            sampled.beat()
        assert await flags(alice, job) == [] and await alice.state(job) == "running"

    on_a_node(store, 2, body)
