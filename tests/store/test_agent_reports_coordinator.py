"""A node speaks only for itself, and its text is data: through the assembled coordinator's
AgentLink in process, on a real store (SQLite and PostgreSQL). A hostile registration is
refused, naming what is wrong, and the node is not listed; a node's reports (in its
registration, or later) on a job dispatched to another node change nothing. (Were
tests/e2e/test_hostile_text_e2e.py's; that a refused registration ends the stream
INVALID_ARGUMENT over gRPC, and what the command line prints of hostile text, stay there.)"""

from __future__ import annotations

from typing import Any

import pytest
from harness import FakeAgent, InProcessClient, message_with, passes_ran, run

from gpuq.coordinator.nodes.agent_session import AgentSession
from gpuq.coordinator.server import Coordinator
from gpuq.domain.limits import CONTROL_RE
from gpuq.errors import InvalidInput
from gpuq.store.api import Store
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

OSC = "\x1b]0;pwned\x07"  # sets a terminal's title; OSC 8 and 52 do worse


def gpu(uuid: str = "GPU-raw-0", name: str = "Raw GPU") -> pb.GpuUnit:
    return pb.GpuUnit(uuid=uuid, index=0, name=name, memory=16 << 30)


def registration(**fields: Any) -> apb.Register:
    return apb.Register(**{"node": "raw", "cpus": 4, "mem": 8 << 30, **fields})


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"gpus": [gpu(name=f"H100{OSC}")]}, "name"),
        ({"gpus": [gpu(uuid=f"GPU-{OSC}")]}, "GPU uuid"),
        ({"driver": f"550{OSC}"}, "driver"),
        ({"gpu_problem": "no driver\x1b[2J"}, "gpu_problem"),
        ({"isolation": "advisory: \u202eevil"}, "isolation"),
    ],
)
def test_a_hostile_registration_is_refused(
    store: Store, fields: dict[str, Any], named: str
) -> None:
    async def body(co: Coordinator) -> None:
        with pytest.raises(InvalidInput) as caught:
            await co.link.register(registration(**fields), AgentSession("raw"))
        message = str(caught.value)
        assert "registration" in message and named in message, message
        assert not CONTROL_RE.search(message)
        assert "raw" not in {n.name for n in InProcessClient(co, "alice").nodes()}

    run(store, body)


def test_a_node_reports_only_on_its_own_jobs(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", "2xA100-80GB").connect()
        alice = InProcessClient(co, "alice")
        job_id = await alice.submit("sleep 60", gpus=1)
        await agent.started(job_id)
        job = await alice.wait_state(job_id, "running")
        ended = apb.JobReport(
            job_id=job_id,
            kind=apb.JobReport.ENDED,
            end_state="completed",
            result=pb.JobResult(exit_code=0, reason="forged"),
            at=co.clock(),
            attempt=job.start_count,
        )
        # in its registration (as if it ran the job before a restart), then as reports
        raw = AgentSession("raw")
        await co.link.register(registration(gpus=[gpu()], jobs=[ended]), raw)
        reports = [
            ended,
            apb.JobReport(job_id=job_id, kind=apb.JobReport.NOT_STARTED),
            apb.JobReport(job_id=job_id, kind=apb.JobReport.ENDED, attempt=0),
        ]
        for report in reports:
            co.link.reports("raw", [report])
        acked: list[int] = []  # each report handled: acknowledged (and forgotten by the node)
        while len(acked) < 1 + len(reports):
            acked += (await message_with(raw, "ack")).ack
        assert acked == [job_id] * 4
        await passes_ran(co)
        after = await alice.get(job_id)
        assert after.state.value == "running" and after.node == job.node
        assert after.start_count == job.start_count
        assert "forged" not in after.reason
        assert not agent.stops
        await alice.cancel(job_id)
        assert (await alice.wait_state(job_id, "cancelled")).state.value == "cancelled"

    run(store, body)
