"""What a SLURM user relies on, through the front door of the assembled coordinator in process
(as gpuq.client calls it), on a real store (SQLite and PostgreSQL), with agents that run
nothing (tests/harness.py): a held array is one record, listed as one entry, that survives a
restart and runs within its %N limit once released; one bad stored job never stops the queue;
listings take SLURM's state codes and refuse oversized requests; listings never carry scripts.
(These were end-to-end tests; what the command line prints of them stays in
tests/e2e/test_queue_semantics_e2e.py and test_edge_limits_e2e.py.)"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from harness import FakeAgent, InProcessClient, eventually, run, until
from sqlalchemy import select, update

from gpuq.cli.render import job_id_text
from gpuq.coordinator.server import Coordinator
from gpuq.domain.limits import MAX_SCRIPT_BYTES
from gpuq.domain.model import JobSpec
from gpuq.domain.states import JobState
from gpuq.errors import InvalidInput
from gpuq.store.api import Store
from gpuq.store.tables import jobs as jobs_table
from gpuq.submission import build_spec


async def listed(client: InProcessClient) -> list[str]:
    """The live listing's entries as `gpuq queue` shows their ids."""
    return [job_id_text(j) for j in await client.list_raw()]


def test_held_array_is_one_record_that_survives_a_restart(store: Store) -> None:
    ids: list[int] = []

    async def before(co: Coordinator) -> None:
        alice = InProcessClient(co, "alice")
        array = await alice.submit("echo $GPUQ_ARRAY_TASK_ID", array="0-999%3", hold=True)
        ids.append(array)
        assert await listed(alice) == [f"{array}_[0-999%3]"]  # the array's one line
        [outcome] = await alice.cancel(f"{array}_5")
        assert (outcome.job_id, outcome.done, outcome.message) == (
            f"{array}_5",
            True,
            "cancelled",
        )
        assert await listed(alice) == [f"{array}_[0-4,6-999%3]"]

    async def after(co: Coordinator) -> None:  # a coordinator started again on the store
        [array] = ids
        alice = InProcessClient(co, "alice")
        assert await alice.array_states(array) == {"held": 999, "cancelled": 1}
        agents = [
            await FakeAgent(co, "a", "4xA100-80GB").connect(),
            await FakeAgent(co, "b", "2xL4-24GB").connect(),
        ]
        await alice.release(array)
        completed = 0
        while completed < 6:  # tasks run after the release, three at a time
            await until(lambda: any(a.running for a in agents))
            assert sum(len(a.running) for a in agents) <= 3
            completed += sum(len(a.end_all()) for a in agents)
        await alice.cancel(array)

        async def over() -> dict[str, int] | None:
            states = await alice.array_states(array)
            return states if states.get("running", 0) == 0 else None

        states = await eventually(over)
        assert states.get("pending", 0) == states.get("held", 0) == 0
        assert sum(states.values()) == 1000

    run(store, before)
    run(store, after)


def test_a_stored_job_that_breaks_scheduling_is_set_aside(store: Store) -> None:
    """A job stored before today's checks (a begin time in year 33658) cannot stop the
    queue: the pass holds it with the error as its reason and everyone else runs."""
    ids: list[int] = []

    async def before(co: Coordinator) -> None:
        ids.append(await InProcessClient(co, "alice").submit(hold=True))

    run(store, before)
    [bad] = ids
    with store.engine.begin() as db:
        [spec_text] = db.execute(select(jobs_table.c.spec).where(jobs_table.c.id == bad)).one()
        spec = json.loads(spec_text)
        spec["begin_time"] = 1e15
        db.execute(
            update(jobs_table)
            .where(jobs_table.c.id == bad)
            .values(spec=json.dumps(spec), state="pending")
        )

    async def after(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", "2xA100-80GB").connect()
        alice = InProcessClient(co, "alice")
        good = await alice.submit(gpus=1)
        await agent.started(good)
        agent.end(good)
        assert (await alice.wait_state(good, "completed")).state is JobState.COMPLETED
        held = await alice.wait_state(bad, "held")
        assert "scheduling failed on this job" in held.reason
        # and it lists: the queue, the history, the job itself
        assert bad in {j.id for j in await alice.list_raw()}
        assert good in {j.id for j in await alice.list_raw(finished=True)}
        assert (await alice.detail(bad))[0].id == bad

    run(store, after)


def test_listings_take_slurm_state_codes_and_refuse_oversized_requests(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "a", "4xA100-80GB").connect()
        alice = InProcessClient(co, "alice")
        running = await alice.submit("sleep 600")
        held = await alice.submit(hold=True)
        await agent.started(running)
        await alice.wait_state(running, "running")
        for codes, expected in (("R", {running}), ("PD,HD", {held}), ("r,held", {running, held})):
            assert {j.id for j in await alice.list_raw([codes])} == expected
        with pytest.raises(InvalidInput, match="not a job state"):
            await alice.list_raw(["XX"])
        with pytest.raises(InvalidInput, match="at most 10000 in one request"):
            await alice.cancel(*range(1, 10_002))
        with pytest.raises(InvalidInput, match="at most 10000 in one request"):
            await alice.list_raw(job_ids=range(1, 10_002))
        with pytest.raises(InvalidInput, match="--reason"):
            await alice.cancel(held, reason="x" * 5000)
        assert await alice.state(held) == "held"  # a refused request changes nothing
        agent.end(running)
        await alice.wait_state(running, "completed")

    run(store, body)


def big_spec(index: int) -> JobSpec:
    """A held job whose script is exactly MAX_SCRIPT_BYTES, with an argument and a variable."""
    head = "#!/bin/sh\necho ok\n"
    script = head + "#" * (MAX_SCRIPT_BYTES - len(head))
    spec = build_spec(wrap="true", environ={"BIG": "v" * 1000}, hold=True)
    return replace(spec, script=script, args=(str(index),))


def test_a_queue_of_large_scripts_lists_small(store: Store) -> None:
    """Listings never carry scripts, arguments or environments: one user's large scripts
    cannot make `gpuq queue` large for everyone (the end-to-end test listed 66 jobs of 4 MiB
    over gRPC, more than a client takes in one reply; the size of each entry is the point)."""

    async def body(co: Coordinator) -> None:
        alice = InProcessClient(co, "alice")
        ids = [(await alice.submit_spec(big_spec(i)))[0] for i in range(3)]
        jobs = await alice.list_raw()
        assert sorted(j.id for j in jobs) == sorted(ids)
        assert all(not j.spec.script and not j.spec.env and not j.spec.args for j in jobs)
        assert sum(j.ByteSize() for j in jobs) < len(ids) * 2048
        # the owner still sees the script in full (gpuq show / GetJob)
        assert len((await alice.get(ids[0])).spec.script.encode()) == MAX_SCRIPT_BYTES
        assert len(await alice.list_raw(finished=True)) == 0
        await alice.cancel(*ids)
        assert await alice.list_raw() == []
        ended = await alice.list_raw(finished=True)
        assert sorted(j.id for j in ended) == sorted(ids)
        assert sum(j.ByteSize() for j in ended) < len(ids) * 2048

    run(store, body)
