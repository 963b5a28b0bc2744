"""Fencing where the job lives: a supervisor stops its job by itself when its lease runs out,
whether its agent is there or not (real fork server, supervisors, signals and processes).

Bounds: a fence on time is at the lease's end (SIGTERM) and the job is gone by the end plus
the kill grace; the room above that is for a loaded machine, and a fence one grace late
fails."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from supervisor_helpers import alive, cleanup, make_spec, read_pid, running_hub, wait_until

pytestmark = pytest.mark.timeout(60)

# the job ignores SIGTERM: only the SIGKILL after the grace ends it
STUBBORN = "trap '' TERM\necho $$ > main.pid\nwhile :; do sleep 0.05; done\n"
GRACE = 1.0


def test_a_job_whose_lease_runs_out_is_fenced_with_the_agents_reason(tmp_path: Path) -> None:
    state = tmp_path / "state"

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            hub.lease(time.monotonic() + 30.0)
            await hub.launch(make_spec(tmp_path, 1, STUBBORN, kill_grace=GRACE))
            await reports.wait(1, "running")
            # the agent lost the coordinator: no extension, and the reason a fence gives
            until = time.monotonic() + 1.0
            hub.lease(until, "no word from the coordinator for 8 s")
            end = await reports.wait(1, "ended", timeout=15)
            gone = time.monotonic()
            assert end.end_state == "node_fail"
            assert end.reason == "fenced: no word from the coordinator for 8 s"
            assert until + GRACE - 0.05 <= gone < until + GRACE + 2.0
            assert not alive(int((tmp_path / "main.pid").read_text()))

    with cleanup(state, tmp_path / "main.pid"):
        asyncio.run(scenario())


def test_a_lease_kept_up_keeps_the_job_and_a_stopped_one_fences_it(tmp_path: Path) -> None:
    state = tmp_path / "state"

    async def scenario() -> None:
        async with running_hub(state) as (hub, reports):
            hub.lease(time.monotonic() + 0.6)
            await hub.launch(make_spec(tmp_path, 1, STUBBORN, kill_grace=GRACE))
            await reports.wait(1, "running")
            started = time.monotonic()
            while time.monotonic() < started + 2.0:  # three leases' worth, kept up
                hub.lease(time.monotonic() + 0.6)
                await asyncio.sleep(0.1)
            assert not reports.of(1)[1:], reports.of(1)
            last = time.monotonic() + 0.6
            hub.lease(last)
            end = await reports.wait(1, "ended", timeout=15)
            assert end.end_state == "node_fail" and end.reason.startswith("fenced: ")
            assert last + GRACE - 0.05 <= time.monotonic() < last + GRACE + 2.0

    with cleanup(state, tmp_path / "main.pid"):
        asyncio.run(scenario())


def test_a_supervisor_whose_agent_is_gone_fences_by_itself(tmp_path: Path) -> None:
    """The agent dies with the job running: nobody extends the lease, and the supervisor
    stops the job on its own, recording why, so that the next agent reports it fenced (not
    lost). That agent gives no lease before its coordinator confirms it: it cannot save the
    job either."""
    state = tmp_path / "state"

    async def first_agent() -> float:
        async with running_hub(state) as (hub, reports):
            until = time.monotonic() + 2.0
            hub.lease(until)
            await hub.launch(make_spec(tmp_path, 1, STUBBORN, kill_grace=GRACE))
            await reports.wait(1, "running")
        return until  # the hub is closed: the supervisor's link is gone

    async def next_agent(until: float) -> None:
        async with running_hub(state) as (_hub, reports):
            end = await reports.wait(1, "ended", timeout=15)
            assert end.end_state == "node_fail"
            assert end.reason.startswith("fenced: the node's agent is gone")
            assert end.at >= time.time() - (time.monotonic() - until) - 0.05

    with cleanup(state, tmp_path / "main.pid"):
        until = asyncio.run(first_agent())
        pid = read_pid(tmp_path / "main.pid")
        while alive(pid):
            assert time.monotonic() < until + GRACE + 5.0, "the job outlived its lease"
            time.sleep(0.02)
        assert time.monotonic() >= until + GRACE - 0.05
        result_file = state / "jobs" / "1" / "result.json"
        wait_until(result_file.exists, 10.0, "the fenced job's result")
        assert json.loads(result_file.read_text())["end_state"] == "node_fail"
        asyncio.run(next_agent(until))


def test_a_restarted_agent_extends_an_adopted_jobs_lease(tmp_path: Path) -> None:
    """An agent restart inside fence_time costs no job: the new agent's first confirmed lease
    reaches the supervisor it adopts."""
    state = tmp_path / "state"

    async def first_agent() -> None:
        async with running_hub(state) as (hub, reports):
            hub.lease(time.monotonic() + 1.5)
            await hub.launch(make_spec(tmp_path, 1, STUBBORN, kill_grace=GRACE))
            await reports.wait(1, "running")

    async def next_agent() -> None:
        async with running_hub(state) as (hub, reports):
            hub.lease(time.monotonic() + 30.0)  # confirmed by its coordinator
            await reports.wait(1, "running")  # adopted: its hello came
            await asyncio.sleep(2.5)  # past the first agent's lease and its grace
            assert [r.kind for r in reports.of(1)] == ["running"]
            assert await hub.stop(1, "cancelled", "test over", 9, 0.0)
            end = await reports.wait(1, "ended", timeout=15)
            assert end.end_state == "cancelled"

    with cleanup(state, tmp_path / "main.pid"):
        asyncio.run(first_agent())
        asyncio.run(next_agent())
