"""An interactive job through a real agent: a stub coordinator (a bare AgentLink server in this
test) launches a job with a terminal, types into it with PtyInput and reads PtyOutput.

The agent is the real `gpuq agent` process (fake GPUs), with its fork server and supervisors.
What the coordinator side relies on is checked on the wire: output comes promptly (before any
heartbeat is due), in PtyOutputs of at most 64 KiB, ends with one `closed`, all of it before
the job's ENDED report; input for another attempt is ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from helpers import skip_or_fail

from gpuq.convert import spec_to_proto
from gpuq.domain.interactive_jobs import Terminal
from gpuq.domain.model import JobSpec, Resources
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import agent_pb2_grpc

pytestmark = pytest.mark.timeout(90)
HEARTBEAT = 30.0  # seconds: far longer than the test, so no output waits for one


class StubCoordinator(agent_pb2_grpc.AgentLinkServicer):
    """Registers one agent, sends what the test queues, records what the agent sends."""

    def __init__(self) -> None:
        self.outbox: asyncio.Queue[apb.CoordinatorMessage] = asyncio.Queue()
        self.received: list[tuple[float, apb.AgentMessage]] = []
        self.changed = asyncio.Event()

    async def Connect(
        self, request_iterator: AsyncIterator[apb.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[apb.CoordinatorMessage]:
        first = await anext(aiter(request_iterator))
        assert first.HasField("register")
        yield apb.CoordinatorMessage(
            registered=apb.Registered(heartbeat_interval=HEARTBEAT, node_timeout=300)
        )
        reader = asyncio.ensure_future(self._read(request_iterator))
        try:
            while True:
                yield await self.outbox.get()
        finally:
            reader.cancel()

    async def _read(self, messages: AsyncIterator[apb.AgentMessage]) -> None:
        async for message in messages:
            self.received.append((time.monotonic(), message))
            self.changed.set()

    def pty(self, job_id: int) -> list[tuple[float, apb.PtyOutput]]:
        return [(at, out) for at, m in self.received for out in m.pty if out.job_id == job_id]

    def output(self, job_id: int) -> bytes:
        return b"".join(out.data for _, out in self.pty(job_id))

    def ended(self, job_id: int) -> apb.JobReport | None:
        for _, message in self.received:
            for report in message.reports:
                if report.job_id == job_id and report.kind == apb.JobReport.ENDED:
                    return report
        return None

    async def wait(self, what: str, predicate: object, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():  # type: ignore[operator]
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {what}; got {self.received}")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.1))


@contextlib.asynccontextmanager
async def stub_and_agent(tmp_path: Path) -> AsyncIterator[StubCoordinator]:
    stub = StubCoordinator()
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentLinkServicer_to_server(stub, server)
    address = f"unix:{tmp_path}/c.sock"
    server.add_insecure_port(address)
    await server.start()
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text("[agent]\nallow_root_jobs = true\n")
    env = {**os.environ, "GPUQ_HOME": str(home)}
    env.pop("GPUQ_CONFIG", None)
    command = [sys.executable, "-m", "gpuq.cli.main", "--home", str(home), "agent"]
    command += ["--node-name", "n1", "--fake-gpus", "1", "--coordinator", address]
    log = open(tmp_path / "agent.log", "wb")  # noqa: SIM115 - lives with the process
    agent = subprocess.Popen(  # cwd: not the checkout, whose gpuq has no compiled part in CI
        [*command, "--log-level", "debug"],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        await stub.wait("the registration", lambda: agent.poll() is None and stub.received, 30)
        yield stub
    finally:
        agent.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(agent.wait, 20)
        if agent.poll() is None:
            agent.kill()
        log.close()
        await server.stop(0)


def launch(tmp_path: Path, job_id: int, script: str) -> apb.CoordinatorMessage:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TERM": "dumb"}
    spec = JobSpec(
        name="interactive",
        script="#!/bin/sh\n" + script,
        workdir=str(tmp_path),
        env=env,
        resources=Resources(cpus=1),
        terminal=Terminal(rows=25, cols=90, term="xterm-256color"),
    )
    order = apb.JobLaunch(
        job_id=job_id, spec=spec_to_proto(spec), user="root", kill_grace=2.0, attempt=3
    )
    return apb.CoordinatorMessage(start=[order])


def test_terminal_output_reaches_the_coordinator_before_the_end(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        skip_or_fail("runs the agent as root (CI does)")
    script = (
        'echo "term=$TERM size=$(stty size)"\n'
        "read line\n"
        'echo "got $line"\n'
        "head -c 200000 /dev/zero | tr '\\0' x\n"
        "echo\n"
        "exit 4\n"
    )

    async def scenario() -> None:
        async with stub_and_agent(tmp_path) as stub:
            await stub.outbox.put(launch(tmp_path, 5, script))
            await stub.wait("the first output", lambda: b"size=25 90" in stub.output(5))
            assert b"term=xterm-256color" in stub.output(5)
            # another start's input is ignored; this start's arrives
            other = apb.PtyInput(job_id=5, attempt=2, data=b"wrong\n")
            typed_at = time.monotonic()
            mine = apb.PtyInput(job_id=5, attempt=3, data=b"right\n")
            await stub.outbox.put(apb.CoordinatorMessage(pty=[other, mine]))
            await stub.wait("the echo", lambda: b"got right" in stub.output(5))
            echoed = next(at for at, out in stub.pty(5) if b"right" in out.data)
            assert echoed - typed_at < 2.0  # promptly, not with a heartbeat (30 s)
            await stub.wait("the end", lambda: stub.ended(5) is not None)
            end = stub.ended(5)
            assert end is not None and end.result.exit_code == 4 and end.attempt == 3
            outputs = stub.pty(5)
            assert b"wrong" not in stub.output(5)
            assert stub.output(5).split(b"got right\r\n")[1] == b"x" * 200000 + b"\r\n"
            assert all(len(out.data) <= 65536 and out.attempt == 3 for _, out in outputs)
            assert [out.closed for _, out in outputs].count(True) == 1 and outputs[-1][1].closed
            # every PtyOutput left in a message before the one with the end
            end_index = next(i for i, (_, m) in enumerate(stub.received) if end in m.reports)
            last_pty = max(i for i, (_, m) in enumerate(stub.received) if m.pty)
            assert last_pty < end_index

    asyncio.run(scenario())
