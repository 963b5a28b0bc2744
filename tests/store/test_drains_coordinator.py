"""Drain and resume through the coordinator on a real store (SQLite and PostgreSQL), and unit
health from agents' heartbeats as the scheduler sees it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from harness import save_node, submit
from helpers import make_spec

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.memory.node_table import NodeEntry
from gpuq.coordinator.nodes.agent_session import AgentSession
from gpuq.coordinator.scheduling.scheduling_pass import started_reason
from gpuq.coordinator.server import Coordinator, assemble
from gpuq.domain.model import GpuUnit, Node, NodeState, Resources
from gpuq.errors import InvalidInput, NotFound, Unsatisfiable
from gpuq.store.api import Store
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

GiB = 1 << 30
UNITS = (
    GpuUnit("GPU-a-0", 0, "NVIDIA H100", 80 * GiB, "0:1b"),
    GpuUnit("GPU-a-1", 1, "NVIDIA H100", 80 * GiB, "0:1e"),
    GpuUnit("MIG-a-2-0", 2, "NVIDIA H100 MIG 3g.40gb", 40 * GiB, "0:21", "GPU-a-2", "3g.40gb"),
    GpuUnit("MIG-a-2-1", 2, "NVIDIA H100 MIG 3g.40gb", 40 * GiB, "0:21", "GPU-a-2", "3g.40gb"),
)


def run(store: Store, body: Callable[[Coordinator], Awaitable[None]]) -> None:
    async def main() -> None:
        co = assemble(store, CoordinatorSettings())
        await co.start()
        try:
            node = Node("a", UNITS, 16, 64 * GiB, NodeState.UP, isolation="advisory: not root")
            if "a" not in co.nodes.nodes:
                await save_node(co, node)
            co.nodes.nodes["a"] = NodeEntry(
                node, co.clock(), AgentSession("a"), heard=True, heard_at=co.steady()
            )
            await body(co)
        finally:
            await co.close()

    asyncio.run(main())


def unhealthy(co: Coordinator) -> dict[str, str]:
    [view] = co.scheduling.views()
    return dict(view.unhealthy)


def test_drain_a_gpu_survives_a_restart_and_resume_undoes_it(store: Store) -> None:
    async def first(co: Coordinator) -> None:
        units, message = await co.node_admin.drain("a", "1", "fan", "root")
        assert units == ["GPU-a-1"]
        assert message == "node a GPU 1 drained: fan"
        assert unhealthy(co) == {"GPU-a-1": "drained by admin: fan"}
        units, _ = await co.node_admin.drain(
            "a", "2", "ECC", "root"
        )  # an index: every slice of GPU 2
        assert units == ["MIG-a-2-0", "MIG-a-2-1"]
        await co.node_admin.drain("a", "MIG-a-2-1", "ECC again", "root")  # a UUID: that slice

    async def second(co: Coordinator) -> None:
        assert unhealthy(co) == {
            "GPU-a-1": "drained by admin: fan",
            "MIG-a-2-0": "drained by admin: ECC",
            "MIG-a-2-1": "drained by admin: ECC again",
        }
        drain = co.nodes.drains[("a", "GPU-a-1")]
        assert (drain.by, drain.reason) == ("root", "fan")
        units, message = await co.node_admin.resume("a", "GPU-a-1", "root")
        assert (units, message) == (["GPU-a-1"], "node a GPU 1 resumed")
        _, message = await co.node_admin.resume("a", "1", "root")
        assert message == "node a GPU 1 was not drained"
        await co.node_admin.resume("a", "2", "root")
        assert unhealthy(co) == {}

    run(store, first)
    run(store, second)
    assert store.drains() == []


def test_a_drained_node_takes_no_work_but_its_gpus_still_count(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        _, message = await co.node_admin.drain("a", "", "rack work", "root")
        assert message == "node a drained: rack work"
        [view] = co.scheduling.views()
        assert not view.up and view.down_reason == "drained by admin: rack work"
        # a drained node can come back: a job that fits it is accepted and waits
        [job_id] = await submit(co, make_spec(gpus=2), "root")
        assert job_id in co.jobs.jobs
        with pytest.raises(Unsatisfiable, match=r"no node has a MIG 1g\.10gb slice"):
            await submit(co, make_spec(resources=Resources(mig="1g.10gb")), "root")
        _, message = await co.node_admin.resume("a", "", "root")
        assert message == "node a resumed"
        assert co.scheduling.views()[0].up

    run(store, body)


def test_unknown_nodes_and_gpus_are_one_clear_error(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        with pytest.raises(NotFound, match=r"no node b \(known nodes: a\)"):
            await co.node_admin.drain("b", "", "x", "root")
        with pytest.raises(NotFound, match="node a has no GPU 7 \\(it has GPUs 0, 1, 2"):
            await co.node_admin.drain("a", "7", "x", "root")
        with pytest.raises(NotFound, match="node a has no GPU GPU-zzz"):
            await co.node_admin.resume("a", "GPU-zzz", "root")
        with pytest.raises(InvalidInput, match="--reason"):
            await co.node_admin.drain("a", "1", "  ", "root")

    run(store, body)


def test_heartbeat_health_reaches_the_scheduler_and_resume_says_it_stays(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        link = co.link
        dirty = "pid 4242 (python) still holds 2.0 GiB after job 17"
        link.heartbeat(
            "a",
            apb.Heartbeat(
                usage=[
                    pb.GpuUsage(uuid="GPU-a-0", health="dirty", health_reason=dirty),
                    pb.GpuUsage(uuid="GPU-a-1", health="unhealthy", health_reason="XID 79"),
                    pb.GpuUsage(uuid="MIG-a-2-0", health="", notes=["foreign process pid 9"]),
                ]
            ),
        )
        assert unhealthy(co) == {"GPU-a-0": f"dirty: {dirty}", "GPU-a-1": "unhealthy: XID 79"}
        await co.node_admin.drain("a", "1", "fan", "root")
        assert unhealthy(co)["GPU-a-1"] == "drained by admin: fan; unhealthy: XID 79"
        _, message = await co.node_admin.resume("a", "1", "root")
        assert message == "node a GPU 1 resumed; GPU 1 stays unhealthy per its agent: XID 79"
        link.heartbeat("a", apb.Heartbeat(usage=[pb.GpuUsage(uuid="GPU-a-0", health="ok")]))
        assert unhealthy(co) == {}

    run(store, body)


def test_the_start_reason_flags_advisory_isolation() -> None:
    assert started_reason("a", "advisory: not root") == (
        "started on a (GPU isolation advisory: not root)"
    )
    assert started_reason("a", "devices cgroup v1") == "started on a"
    assert started_reason("a", "") == "started on a"


def test_a_unit_left_dirty_by_an_ending_job_is_not_given_to_the_next(store: Store) -> None:
    """One agent message carries a job's end and the heartbeat that marks its unit dirty: the
    heartbeat is applied first, so the pass the end wakes does not hand the unit out."""
    from gpuq.coordinator.front.grpc_agents import AgentLinkServicer

    async def body(co: Coordinator) -> None:
        link = co.link

        async def waits_because(job_id: int, text: str) -> None:
            """Until a pass over the cluster as it is now says the job waits for `text`."""
            for _ in range(200):
                co.scheduling.forget_explanation()
                detail = co.scheduling.pending_detail(co.jobs.jobs[job_id])
                if detail is not None and text in "; ".join(detail.waiting.reasons):
                    return
                await asyncio.sleep(0.02)
            raise AssertionError(f"job {job_id} never waited for {text!r}")

        for unit in ("1", "2"):
            await co.node_admin.drain("a", unit, "keep the test on GPU 0", "root")

        async def state(job_id: int, wanted: str) -> None:
            for _ in range(200):
                job = co.jobs.jobs.get(job_id)
                if (job.state.value if job else "gone") == wanted:
                    return
                await asyncio.sleep(0.02)
            raise AssertionError(f"job {job_id} never {wanted}")

        [first] = await submit(co, make_spec(gpus=1), "root")
        await state(first, "running")
        assert co.jobs.jobs[first].gpus == ("GPU-a-0",)
        [second] = await submit(co, make_spec(gpus=1), "root")
        await waits_because(second, "drained by admin")
        assert co.jobs.jobs[second].state.value == "pending"

        why = "pid 4242 (python) still holds 2.0 GiB after job 1"
        message = apb.AgentMessage(
            heartbeat=apb.Heartbeat(
                usage=[pb.GpuUsage(uuid="GPU-a-0", health="dirty", health_reason=why)]
            ),
            reports=[
                apb.JobReport(
                    job_id=first,
                    kind=apb.JobReport.ENDED,
                    end_state="completed",
                    result=pb.JobResult(exit_code=0),
                    attempt=co.jobs.jobs[first].start_count,
                )
            ],
        )

        async def messages():  # type: ignore[no-untyped-def]
            yield message

        servicer = AgentLinkServicer(link)
        await servicer._read("a", messages(), AgentSession("a"))
        for _ in range(100):
            if first not in co.jobs.jobs:
                break
            await asyncio.sleep(0.02)
        assert first not in co.jobs.jobs
        await waits_because(second, why)  # a pass ran after the end: it kept the unit out
        assert co.jobs.jobs[second].state.value == "pending"
        assert unhealthy(co)["GPU-a-0"] == f"dirty: {why}"
        link.heartbeat("a", apb.Heartbeat(usage=[pb.GpuUsage(uuid="GPU-a-0", health="ok")]))
        await state(second, "running")

    run(store, body)
