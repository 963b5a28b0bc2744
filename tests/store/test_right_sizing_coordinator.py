"""Right-sizing through the assembled coordinator in process, on a real store (SQLite and
PostgreSQL), with a clock moved by hand and an agent that runs nothing and reports what its
jobs' GPUs did: a seeded history where alice's jobs asked --gpu-mem 40G and peaked at 10G gets
`report --advice` suggesting a smaller --gpu-mem and a --time; bob, who held a GPU idle for
two hours, is named; `eff` of a finished job says what it used; the estimated start of
alice's next job without --time follows her measured run times, not the QOS default of a day;
an unknown job and another user's private usage are refused."""

from __future__ import annotations

import pytest
from harness import GIB, Clock, FakeAgent, InProcessClient, eventually, run

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.memory.scheduler_inputs import RUN_TIMES_NEW
from gpuq.coordinator.server import Coordinator
from gpuq.errors import NotFound, PermissionDenied
from gpuq.store.api import Store
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import queue_pb2
from gpuq.v1 import types_pb2 as pb

DAY = 86400


async def run_measured(
    co: Coordinator,
    agent: FakeAgent,
    client: InProcessClient,
    clock: Clock,
    seconds: float,
    peak_gib: float,
    util: float,
    host_gib: float = 3.0,
    **options: object,
) -> int:
    """Submit a job, let it run `seconds` on the clock, and end it completed with what its
    GPUs did (peak memory per GPU, utilisation)."""
    job_id = await client.submit("python train.py", **options)
    launch = await agent.started(job_id)
    clock.advance(seconds)
    del agent.running[job_id]
    peak = int(peak_gib * GIB)
    telemetry = pb.GpuTelemetry(
        peak_gpu_mem=peak * len(launch.gpus),
        util_mean=util,
        util_p95=util,
        energy=seconds * 300.0,
        samples=int(seconds),
        seconds=seconds,
        units=[
            pb.UnitTelemetry(uuid=u, peak_mem=peak, util_mean=util, util_p95=util)
            for u in launch.gpus
        ],
    )
    report = apb.JobReport(
        job_id=job_id,
        kind=apb.JobReport.ENDED,
        end_state="completed",
        result=pb.JobResult(exit_code=0, reason="exit code 0"),
        at=clock(),
        attempt=launch.attempt,
        telemetry=telemetry,
        peak_mem=int(host_gib * GIB),
    )
    co.link.reports(agent.node, [report])
    await client.wait_state(job_id, "completed")
    return job_id


async def report(client: InProcessClient, **fields: object) -> queue_pb2.ReportReply:
    return await client.co.queries.report(client.caller, queue_pb2.ReportRequest(**fields))  # type: ignore[arg-type]


def test_advice_eff_and_estimates_from_a_seeded_history(store: Store) -> None:
    clock = Clock()

    async def main(co: Coordinator) -> None:
        agent = await FakeAgent(co, "n1", 1).connect()  # one 80 GiB GPU
        alice, bob = InProcessClient(co, "alice"), InProcessClient(co, "bob")
        train = {"gpus": 1, "gpu_mem": "40G", "mem": "32G", "name": "train"}  # no --time
        history = [
            await run_measured(co, agent, alice, clock, 1800.0, peak, 85.0, **train)
            for peak in (9.0, 10.0, 8.0, 9.5)
        ]
        await run_measured(co, agent, bob, clock, 7200.0, 1.0, 2.0, gpus=1, name="idle")

        # report --advice: alice's "train" peaked at 10 GiB of 40: --gpu-mem 12G; 30 min runs
        # of a day's limit: --time 00:40:00; bob held a GPU for 2 hours at 2 %
        reply = await report(alice, advice=True)
        [advice] = reply.advice
        assert (advice.user, advice.name, advice.jobs, advice.measured) == ("alice", "train", 4, 4)
        assert advice.asked_gpu_mem == 40 * GIB and advice.peak_gpu_mem == 10 * GIB
        assert advice.gpu_mem == 12 * GIB and advice.gpu_mem < advice.asked_gpu_mem
        assert advice.asked_time == DAY and advice.run_p95 == pytest.approx(1800.0, abs=1)
        assert list(advice.suggestions) == ["--gpu-mem 12G", "--time 00:40:00"]
        assert [(h.user, round(h.util_mean)) for h in reply.idle] == [("bob", 2)]
        assert {r.user for r in reply.rows} == {"alice", "bob"}
        # bob's own advice, and alice's asked for by name
        [bobs] = (await report(bob, advice=True)).advice
        assert bobs.name == "idle" and list(bobs.suggestions) == ["--time 02:30:00"]
        assert [a.name for a in (await report(bob, advice=True, user="alice")).advice] == ["train"]

        # eff of a finished job: what it asked for against what it used
        eff = (await report(alice, job_id=history[1])).efficiency
        assert eff.job.id == history[1] and eff.job.state == "completed"
        assert eff.time_limit == DAY and eff.card_mem == 80 * GIB
        assert list(eff.verdicts) == [
            "Time: ran 00:30:00 of 1-00:00:00 (2%): --time 00:40:00 would fit",
            "GPU memory: peak 10 GiB of 40 GiB asked (25%): --gpu-mem 12G would fit",
            "Host memory: peak 3 GiB of 32 GiB asked (9%): --mem 4G would fit",
        ]
        assert eff.mem_peak == 3 * GIB  # what its agent reported with the end
        with pytest.raises(NotFound, match="no job 99999"):
            await report(alice, job_id=99999)
        # usage is not private here: bob sees alice's figures, as gpuq show shows them, but
        # not her script
        seen = (await report(bob, job_id=history[1])).efficiency
        assert list(seen.verdicts) == list(eff.verdicts) and seen.job.spec.script == ""

        # the estimated start of alice's next "train" (no --time) behind one running: the
        # measured 30 minutes, not the QOS default of a day
        running = await alice.submit("python train.py", **train)
        await agent.started(running)
        started = (await alice.get(running)).start_time
        assert started is not None
        waiting = await alice.submit("python train.py", **train)

        async def estimate() -> float | None:
            co.wake()
            job, _ = await alice.detail(waiting)
            found = job.pending.estimated_start if job.HasField("pending") else None
            return found if found is not None and found < started + 3600 else None

        clock.advance(RUN_TIMES_NEW)  # a (user, name) not read yet is read this soon
        assert await eventually(estimate) == pytest.approx(started + 1800.0, abs=2)
        # only the estimate moved: the limit enforced is still the QOS default
        assert agent.running[running].time_limit == DAY

    run(store, main, CoordinatorSettings(), clock)


def test_private_usage_is_refused_to_other_users(store: Store) -> None:
    clock = Clock()

    async def main(co: Coordinator) -> None:
        agent = await FakeAgent(co, "n1", 1).connect()
        alice = InProcessClient(co, "alice")
        bob, admin = InProcessClient(co, "bob"), InProcessClient(co, "root", admin=True)
        job = await run_measured(co, agent, alice, clock, 600.0, 10.0, 80.0, gpus=1, gpu_mem="40G")
        assert (await report(alice, job_id=job)).efficiency.verdicts
        assert (await report(admin, job_id=job)).efficiency.verdicts
        with pytest.raises(PermissionDenied, match="usage is private"):
            await report(bob, job_id=job)
        with pytest.raises(PermissionDenied, match="usage is private"):
            await report(bob, advice=True, user="alice")
        assert (await report(admin, advice=True, user="alice")).advice

    run(store, main, CoordinatorSettings(private_data=("usage",)), clock)
