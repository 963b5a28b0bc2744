"""Faults lose nothing, agent side: nothing a job started outlives it, supervisor or not, and an
agent whose fork server dies heals itself instead of failing every later job."""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import signal
import uuid
from pathlib import Path

import pytest
from e2e_cluster import Cluster, pid_alive, wait_for
from supervisor_helpers import alive, await_until, cleanup, make_spec, read_pid, running_hub

from gpuq.agent import launcher as launcher_module
from gpuq.agent import node_agent as agent_module
from gpuq.agent.end_reports import EndReports, report_message
from gpuq.agent.fake.gpu_backend import FakeGpuBackend
from gpuq.agent.gpu.node_gpus import NodeGpus
from gpuq.agent.jobs import process_tree
from gpuq.agent.jobs.fork_server import ForkServer
from gpuq.agent.jobs.fork_server_link import LaunchRefused
from gpuq.agent.jobs.job_folder import supervisor_alive
from gpuq.agent.jobs.launch_spec import NodePolicy
from gpuq.agent.jobs.mps_daemons import MpsDaemons
from gpuq.config.settings import AgentSettings
from gpuq.convert import spec_to_proto
from gpuq.domain.model import JobSpec
from gpuq.domain.states import JobState
from gpuq.v1 import agent_pb2 as apb

pytestmark = pytest.mark.timeout(90)


def marked(name: str, value: str) -> list[int]:
    """Live processes whose environment has name=value."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            environ = process_tree.read_proc(f"/proc/{entry}/environ").split(b"\0")
            if needle in environ and alive(int(entry)):
                found.append(int(entry))
    return found


def parent_of(pid: int) -> int:
    stat = process_tree.read_proc(f"/proc/{pid}/stat")
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


def fork_server_of(agent_pid: int) -> int | None:
    """The agent's fork server: its child that runs the C loop."""
    for child in process_tree.children_of(agent_pid):
        if b"_supervise.serve" in process_tree.read_proc(f"/proc/{child}/cmdline") and alive(child):
            return child
    return None


def test_sigkilled_supervisor_takes_its_job_with_it(cluster: Cluster) -> None:
    mark = uuid.uuid4().hex
    pid_file = cluster.root / "main.pid"
    # the job's shell and two children of it, one of which ignores SIGTERM: SIGKILL follows
    # after the kill grace (2 s in the test cluster)
    script = (
        f"sleep 300 & (trap '' TERM; while :; do sleep 0.05; done) & echo $$ > {pid_file}; wait"
    )
    job_id = cluster.submit(script, gpus=4, environ={**cluster.env, "HEAL_MARK": mark})
    assert cluster.wait_state(job_id, "running").node == "a"
    shell = read_pid(pid_file)
    wait_for(lambda: len(marked("HEAL_MARK", mark)) >= 3, what="the job's processes")
    processes = marked("HEAL_MARK", mark)
    supervisor = parent_of(shell)
    assert supervisor not in processes  # the supervisor does not carry the job's environment

    os.kill(supervisor, signal.SIGKILL)
    job = cluster.wait_state(job_id, "failed", "node_fail", timeout=15)
    # its end is recorded (and its GPUs freed) only once none of its processes is left
    assert marked("HEAL_MARK", mark) == []
    assert not any(pid_alive(pid) for pid in processes)
    assert job.state is JobState.FAILED
    assert "supervisor lost" in job.reason and "killed by signal 9" in job.reason
    assert "processes were stopped" in job.reason
    # the same GPUs take the next job
    after = cluster.submit("true", gpus=4)
    assert cluster.wait_state(after, "completed", "failed").node == "a"
    assert cluster.job(after).state is JobState.COMPLETED


def test_sigkilled_fork_server_is_restarted(cluster: Cluster) -> None:
    agent = cluster.agents["a"]
    first = wait_for(lambda: fork_server_of(agent.pid), what="the fork server")
    gate = cluster.root / "gate"
    # --gpu-mem 40G: node a's A100s, not b's L4s
    running = cluster.submit(f"while [ ! -e {gate} ]; do sleep 0.05; done", gpus=1, gpu_mem="40G")
    assert cluster.wait_state(running, "running").node == "a"

    os.kill(first, signal.SIGKILL)
    # at once, while the fork server may not be back yet: it waits for it, it does not fail
    jobs = [cluster.submit("echo ran", gpus=3, gpu_mem="40G") for _ in range(3)]
    for job_id in jobs:
        job = cluster.wait_state(job_id, "completed", "failed", timeout=30)
        assert job.state is JobState.COMPLETED and job.node == "a", job.reason
        assert (cluster.root / f"gpuq-{job_id}.out").read_text() == "ran\n"
    second = wait_for(lambda: fork_server_of(agent.pid), what="a new fork server")
    assert second != first and agent.poll() is None
    # the job that ran meanwhile was not touched
    gate.touch()
    assert cluster.wait_state(running, "completed", "failed").state is JobState.COMPLETED


def test_hub_refuses_launches_while_no_fork_server_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork server that cannot be restarted: launches raise LaunchRefused (nothing started,
    no folder, no report), and work again once a restart succeeds."""
    state = tmp_path / "state"
    real_start = ForkServer.start

    def broken(*_: object, **__: object) -> ForkServer:
        raise OSError("no fork server today")

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            assert hub.forks.fork_server is not None
            monkeypatch.setattr(ForkServer, "start", broken)
            os.kill(hub.forks.fork_server.process.pid, signal.SIGKILL)
            await await_until(lambda: hub.forks.refusing is not None, 10)
            with pytest.raises(LaunchRefused, match="no fork server today"):
                await hub.launch(make_spec(tmp_path, 1, "exit 0\n"))
            assert not (state / "jobs" / "1").exists() and reports.of(1) == []
            assert hub.running_jobs() == []

            monkeypatch.setattr(ForkServer, "start", real_start)
            await await_until(hub.forks.ready.is_set, 15)
            assert hub.forks.refusing is None and hub.forks.restarts >= 1
            await hub.launch(make_spec(tmp_path, 1, "echo $$ > main.pid; exit 3\n"))
            end = await reports.wait(1, "ended")
            assert (end.end_state, end.exit_code) == ("failed", 3)
            await hub.ack(1)

    with cleanup(state, tmp_path / "main.pid"):
        asyncio.run(scenario())


def test_hub_stops_the_job_of_a_dead_supervisor_after_its_grace(tmp_path: Path) -> None:
    """A job that ignores SIGTERM gets its kill grace, then SIGKILL; only then the end."""
    state = tmp_path / "state"
    script = "trap '' TERM\necho $$ > main.pid\nwhile :; do sleep 0.05; done\n"

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(make_spec(tmp_path, 1, script, kill_grace=1.0))
            await reports.wait(1, "running")
            main = read_pid(tmp_path / "main.pid")
            supervisor = supervisor_alive(state / "jobs" / "1")
            assert supervisor is not None
            loop = asyncio.get_running_loop()
            os.kill(supervisor, signal.SIGKILL)
            killed_at = loop.time()
            await await_until(lambda: not alive(main), 10)
            assert loop.time() - killed_at >= 0.9  # SIGTERM was ignored: it took the grace
            end = await reports.wait(1, "ended")
            assert end.end_state == "failed" and "killed by signal 9" in end.reason
            assert re.search(r"its (\d+ processes were|process was) stopped", end.reason)
            await hub.ack(1)

    with cleanup(state, tmp_path / "main.pid"):
        asyncio.run(scenario())


def test_agent_hands_a_refused_launch_back_to_the_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch the hub refuses is reported NOT_STARTED (back to the queue) after a hold, not
    `failed`, with its attempt; a stop that comes during the hold ends it as the stop says
    instead, and a stop of another start of the job is ignored."""
    monkeypatch.setattr(launcher_module, "REFUSE_HOLD", 0.2)

    class RefusingHub:
        async def launch(self, spec: object) -> int:
            raise LaunchRefused("the fork server cannot be restarted: test")

        async def stop(self, *args: object) -> bool:
            return False

        def running_jobs(self) -> list[int]:
            return []

        def attempt_of(self, job_id: int) -> int:
            return 0

        def launch_spec_of(self, job_id: int) -> None:
            return None

    async def no_stop(*args: object) -> None:
        return None

    async def scenario() -> None:
        agent = agent_module.Agent.__new__(agent_module.Agent)
        agent.supervisors = RefusingHub()  # type: ignore[assignment]
        gpus = NodeGpus(
            FakeGpuBackend("1", "n1", state_dir=tmp_path / "fake-gpus"),
            AgentSettings(node_name="n1"),
            agent.supervisors,
            beat_now=lambda: None,
            units_changed=lambda: None,
            stop_job=no_stop,
        )
        mps = MpsDaemons(tmp_path, fake=True)
        agent._beat_due, agent._flush, agent._fresh_units = False, asyncio.Event(), set()
        agent.reports = EndReports(gpus, mps, agent._send_soon)
        agent.launcher = launcher_module.Launcher(
            agent.supervisors,
            gpus,
            mps,
            agent.reports,
            settings=AgentSettings(node_name="n1", allow_root_jobs=True),
            address="127.0.0.1:1",
            cgroup_key="x",
        )
        agent.launcher.policy = NodePolicy(node="n1", units={})
        spec = JobSpec(name="j", script="#!/bin/sh\ntrue\n", workdir=str(tmp_path))
        user = pwd.getpwuid(os.geteuid()).pw_name
        for job_id in (1, 2):
            launch = apb.JobLaunch(job_id=job_id, spec=spec_to_proto(spec), attempt=3, user=user)
            await agent.launcher.launch(launch)
        assert agent.reports.unacked == {} and sorted(agent.launcher.held) == [1, 2]
        stale = apb.StopJob(job_id=1, end_state="cancelled", attempt=2)
        await agent._handle(
            apb.CoordinatorMessage(
                stop=[stale, apb.StopJob(job_id=2, end_state="cancelled", attempt=3)]
            )
        )
        assert 1 in agent.launcher.held  # the stop of start 2 was not for it
        await await_until(lambda: 1 in agent.reports.unacked, 5)
        held, stopped = agent.reports.unacked[1], agent.reports.unacked[2]
        assert held.kind == "not_started" and "not started" in held.reason
        assert "cannot be restarted" in held.reason and held.attempt == 3
        message = report_message(held)
        assert message.kind == apb.JobReport.NOT_STARTED and message.attempt == 3
        assert stopped.end_state == "cancelled"
        assert agent.launcher.held == {} and agent.launcher.held_attempts == {}

    asyncio.run(scenario())
