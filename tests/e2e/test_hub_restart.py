"""The agent dies, the jobs do not: a new hub re-adopts running jobs and collects ended ones."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from supervisor_helpers import alive, cleanup, make_spec, read_pid, running_hub, wait_until

from gpuq.agent.jobs.job_folder import supervisor_alive
from gpuq.agent.jobs.launch_spec import LaunchSpec

pytestmark = pytest.mark.timeout(60)

HUB_OWNER = """
import asyncio, json, sys
from pathlib import Path
from gpuq.agent.jobs.supervisors import Supervisors
from gpuq.agent.jobs.launch_spec import LaunchSpec

async def main():
    hub = Supervisors(Path(sys.argv[1]), lambda r: print(r.kind, flush=True), ack_wait=20)
    await hub.start()
    print("forkserver", hub.forks.fork_server.process.pid, flush=True)
    await hub.launch(LaunchSpec.from_dict(json.loads(sys.argv[2])))
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def start_hub_owner(state: Path, spec: LaunchSpec) -> tuple[subprocess.Popen[str], int]:
    """A separate process that owns a hub and launched `spec`; returns it once the job runs."""
    command = [sys.executable, "-c", HUB_OWNER, str(state), json.dumps(spec.to_dict())]
    # not from the checkout: `-c` would import its gpuq, which CI's (non-editable) install built
    # the C part for elsewhere
    owner = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=state.parent)
    assert owner.stdout is not None
    fork_server = int(owner.stdout.readline().split()[1])
    assert owner.stdout.readline().strip() == "running"
    return owner, fork_server


def test_sigkilled_hub_owner_then_new_hub_readopts_running_job(tmp_path: Path) -> None:
    state = tmp_path / "state"
    script = "echo $$ > main.pid\nwhile [ ! -e go ]; do sleep 0.02; done\nexit 7\n"
    spec = make_spec(tmp_path, 1, script)
    with cleanup(state, tmp_path / "main.pid"):
        owner, fork_server = start_hub_owner(state, spec)
        main_pid = read_pid(tmp_path / "main.pid")
        supervisor = supervisor_alive(state / "jobs" / "1")
        assert supervisor is not None
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        # the fork server sees EOF and leaves; supervisor and job run on
        wait_until(lambda: not alive(fork_server), what="the fork server to exit")
        assert alive(supervisor) and alive(main_pid)

        async def scenario() -> None:
            async with running_hub(state) as (hub, reports):
                running = await reports.wait(1, "running")
                assert hub.running_jobs() == [1] and running.end_state is None
                (tmp_path / "go").touch()
                end = await reports.wait(1, "ended")
                assert (end.end_state, end.exit_code) == ("failed", 7)
                await hub.ack(1)
                await asyncio.to_thread(
                    wait_until, lambda: not (state / "jobs" / "1").exists(), 10, "folder removal"
                )

        asyncio.run(scenario())
        wait_until(lambda: not alive(supervisor), what="the supervisor to exit after its ack")


def test_end_while_no_hub_listens_is_delivered_later(tmp_path: Path) -> None:
    """Job 1's supervisor still waits for an ack and reconnects; job 2's has given up and left
    only result.json. The next hub reports both ends."""
    state = tmp_path / "state"
    script = "while [ ! -e go ]; do sleep 0.02; done\nexit 0\n"

    async def first_hub() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(make_spec(tmp_path, 1, script))
        async with running_hub(state, ack_wait=0.5) as (hub, reports):
            await hub.launch(make_spec(tmp_path, 2, script))
            await reports.wait(2, "running")

    async def second_hub() -> None:
        async with running_hub(state) as (hub, reports):
            first, second = [await reports.wait(j, "ended") for j in (1, 2)]
            assert first.end_state == second.end_state == "completed"
            assert [r.kind for r in reports.of(2)] == ["ended"]
            for job_id in (1, 2):
                await hub.ack(job_id)
            await asyncio.to_thread(
                wait_until, lambda: not any((state / "jobs").iterdir()), 10, "folder removal"
            )

    with cleanup(state):
        asyncio.run(first_hub())
        (tmp_path / "go").touch()
        wait_until(lambda: (state / "jobs" / "2" / "result.json").exists(), what="job 2's end")
        wait_until(lambda: supervisor_alive(state / "jobs" / "2") is None, what="give-up")
        assert supervisor_alive(state / "jobs" / "1") is not None
        asyncio.run(second_hub())


def test_lost_supervisor_is_reported_failed(tmp_path: Path) -> None:
    """A supervisor killed outright leaves no result: the hub says so instead of waiting."""
    state = tmp_path / "state"

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            await hub.launch(make_spec(tmp_path, 1, "echo $$ > main.pid; exec sleep 1000\n"))
            await reports.wait(1, "running")
            supervisor = supervisor_alive(state / "jobs" / "1")
            assert supervisor is not None
            os.kill(supervisor, signal.SIGKILL)
            os.kill(read_pid(tmp_path / "main.pid"), signal.SIGKILL)
            end = await reports.wait(1, "ended")
            assert end.end_state == "failed" and "supervisor lost" in end.reason

    with cleanup(state, tmp_path / "main.pid"):
        asyncio.run(scenario())
