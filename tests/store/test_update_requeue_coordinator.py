"""Editing queued jobs (`gpuq update`), `gpuq requeue` and the bulk verbs (`-u`, `--state`,
`--name`), through the front door of the assembled coordinator in process (as gpuq.client
calls it), on a real store (SQLite and PostgreSQL), with an agent that runs nothing
(tests/harness.py). Root is an admin; alice and bob are not. (These were end-to-end tests;
what the command line prints of these answers stays in tests/e2e/test_update_requeue_e2e.py,
and who a caller is across processes in tests/e2e/test_identity_e2e.py.)"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from harness import FakeAgent, InProcessClient, run, until

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.server import Coordinator
from gpuq.errors import InvalidInput, PermissionDenied, Unsatisfiable
from gpuq.store.api import Store

ROOT_JOBS = CoordinatorSettings(allow_root_jobs=True)  # root submits, as in CI

Body = Callable[[Coordinator, FakeAgent, InProcessClient], Awaitable[None]]


def one_node(store: Store, body: Body) -> None:
    """A coordinator with node n1 (two GPUs) and root, an admin, to call it."""

    async def main(co: Coordinator) -> None:
        agent = await FakeAgent(co, "n1", "2xA100-80GB").connect()
        await body(co, agent, InProcessClient(co, "root", admin=True))

    run(store, main, ROOT_JOBS)


async def reasons(client: InProcessClient, job: int) -> list[str]:
    return [e.reason for e in (await client.detail(job))[1]]


def test_update_changes_a_pending_jobs_limit_and_it_is_enforced_at_start(store: Store) -> None:
    async def body(co: Coordinator, agent: FakeAgent, root: InProcessClient) -> None:
        job = await root.submit("sleep 30", hold=True, time="1:00:00")
        [outcome] = await root.update_as_typed(job, time="0:00:03")
        assert (outcome.job_id, outcome.done) == (str(job), True)
        assert outcome.message == "updated: time 01:00:00 -> 00:00:03"
        assert (await root.get(job)).spec.resources.time_limit == 3
        events = await reasons(root, job)
        assert any("updated by root: time 01:00:00 -> 00:00:03" in r for r in events)
        # the new limit is the one enforced: released, its start carries it to the agent
        # (whose supervisor ends it as timeout: tests/e2e/test_queue_e2e.py)
        assert all(o.done for o in await root.release(job))
        assert (await agent.started(job)).time_limit == 3

    one_node(store, body)


def test_update_nice_qos_after_name_hold_and_bad_input(store: Store) -> None:
    async def body(co: Coordinator, agent: FakeAgent, root: InProcessClient) -> None:
        first = await root.submit(hold=True)
        job = await root.submit(hold=True, name="before")
        outcomes = await root.update_as_typed(
            job, nice="5", qos="low", after=str(first), name="after"
        )
        assert all(o.done for o in outcomes), outcomes
        got = await root.get(job)
        assert (got.spec.nice, got.qos, got.spec.name) == (5, "low", "after")
        assert [d.job_id for d in got.spec.dependencies] == [first]
        # --after none clears; --release releases it too (it then waits for nothing)
        outcomes = await root.update_as_typed(job, after="none", hold=False)
        assert all(o.done for o in outcomes), outcomes
        assert (await root.get(job)).spec.dependencies == ()
        await agent.started(job)
        agent.end(job)
        await root.wait_state(job, "completed")
        # a cycle, an unknown qos, a bad time: refused, nothing changed
        other = await root.submit(hold=True, after=[str(first)])
        with pytest.raises(InvalidInput, match=f"it waits for job {first} .a cycle never starts"):
            await root.update_as_typed(first, after=str(other))
        [outcome] = await root.update_as_typed(first, qos="nosuch")
        assert not outcome.done and "nosuch" in outcome.message, outcome
        with pytest.raises(InvalidInput, match="--time 'soon'"):
            await root.update_as_typed(first, time="soon")  # by the command line's parser
        assert (await root.get(first)).spec.dependencies == ()
        assert (await root.get(first)).qos == "normal"

    one_node(store, body)


def test_a_running_job_is_not_updated_but_requeued(store: Store) -> None:
    async def body(co: Coordinator, agent: FakeAgent, root: InProcessClient) -> None:
        job = await root.submit("sleep 60")
        first = await agent.started(job)
        [outcome] = await root.update_as_typed(job, time="10")
        assert not outcome.done
        # the outcome names the job once, by its job_id (the CLI: "job 1: is running: ...")
        assert (outcome.job_id, outcome.message) == (
            str(job),
            "is running: only pending or held jobs can be updated",
        )
        # requeue: stopped, back to the queue with the same id, and it runs again
        assert all(o.done for o in await root.requeue(job))
        await until(lambda: agent.stops)
        [stop] = agent.stops
        assert (stop.job_id, stop.end_state, stop.attempt) == (job, "preempted", first.attempt)
        again = await agent.started(job)
        assert again.attempt == first.attempt + 1 and len(agent.launches) == 2
        got = await root.wait_state(job, "running")
        assert got.requeue_count == 1
        assert any(r.startswith("requeued by root") for r in await reasons(root, job))
        # --hold: stopped, and back in the queue held
        assert all(o.done for o in await root.requeue(job, hold=True))
        got = await root.wait_state(job, "held")
        assert got.requeue_count == 2
        assert all(o.done for o in await root.cancel(job))
        await root.wait_state(job, "cancelled")

    one_node(store, body)


def test_updating_an_array_updates_its_unstarted_tasks(store: Store) -> None:
    async def body(co: Coordinator, agent: FakeAgent, root: InProcessClient) -> None:
        array = await root.submit(hold=True, array="0-99", time="1:00:00")
        assert all(o.done for o in await root.release(f"{array}_3"))  # a task of its own now
        task = (await root.get(f"{array}_3")).id
        await agent.started(task)
        agent.end(task)  # `true`
        await root.wait_state(task, "completed")
        await root.wait_state(array, "held")
        outcomes = await root.update_as_typed(array, time="10:00", nice="3")
        assert outcomes and all(o.done for o in outcomes), outcomes
        record = await root.get(array)
        assert (record.spec.resources.time_limit, record.spec.nice) == (600, 3)

    one_node(store, body)


def test_requeue_of_a_failed_job_and_held(store: Store) -> None:
    async def body(co: Coordinator, agent: FakeAgent, root: InProcessClient) -> None:
        job = await root.submit("exit 3")
        await agent.started(job)
        agent.end(job, exit_code=3)
        await root.wait_state(job, "failed")
        assert all(o.done for o in await root.requeue(job, hold=True))
        got = await root.wait_state(job, "held")
        assert got.requeue_count == 1 and got.result is None
        assert all(o.done for o in await root.release(job))
        await agent.started(job)
        agent.end(job, exit_code=3)
        await root.wait_state(job, "failed")
        # --no-requeue: refused, as SLURM refuses it
        never = await root.submit("exit 1", no_requeue=True)
        await agent.started(never)
        agent.end(never, exit_code=1)
        await root.wait_state(never, "failed")
        [outcome] = await root.requeue(never)
        assert not outcome.done and "--no-requeue" in outcome.message

    one_node(store, body)


def test_bulk_cancel_by_state_and_name_is_one_request(store: Store) -> None:
    async def body(co: Coordinator, agent: FakeAgent, root: InProcessClient) -> None:
        sweep = [await root.submit(hold=True, name=f"sweep-{i}") for i in range(30)]
        keep = await root.submit(hold=True, name="keep")
        assert await root.hold(name="nomatch*") == []  # `gpuq hold`: no jobs matched
        outcomes = await root.cancel(states=["HD"], name="sweep-*")
        assert [(o.job_id, o.done, o.message) for o in outcomes] == [
            (str(j), True, "cancelled") for j in sweep
        ]  # `gpuq cancel`: cancelled 30 jobs: cancelled
        assert {(await root.get(j)).state.value for j in sweep} == {"cancelled"}
        assert (await root.get(keep)).state.value == "held"
        outcomes = await root.release(user="root")
        assert [(o.job_id, o.message) for o in outcomes] == [(str(keep), "pending")]
        # nothing to select
        with pytest.raises(InvalidInput, match="name jobs, or select them"):
            await root.cancel()

    one_node(store, body)


def test_owners_may_only_lower_and_others_jobs_are_refused_as_a_whole(store: Store) -> None:
    async def body(co: Coordinator, agent: FakeAgent, root: InProcessClient) -> None:
        alice = InProcessClient(co, "alice")
        bob = InProcessClient(co, "bob")
        job = await alice.submit(hold=True, time="1:00:00")
        mine = await bob.submit(hold=True, time="1:00:00")
        # an owner cannot raise the limit: refused, nothing changed
        with pytest.raises(PermissionDenied, match="only admins may raise a time limit"):
            await alice.update_as_typed(job, time="2:00:00")
        # nor lower nice below its value
        with pytest.raises(PermissionDenied, match="only admins may lower nice"):
            await alice.update_as_typed(job, nice="-5")
        assert (await root.get(job)).spec.resources.time_limit == 3600
        # but may lower it
        assert all(o.done for o in await alice.update_as_typed(job, time="30:00"))
        assert (await root.get(job)).spec.resources.time_limit == 1800
        # a request naming bob's job is refused as a whole: alice's own is not changed either
        with pytest.raises(PermissionDenied, match="belongs to bob"):
            await alice.update_as_typed(job, mine, nice="9")
        assert (await root.get(job)).spec.nice == 0
        # -u other: admins only; without -u, alice's filters match only her own jobs
        with pytest.raises(PermissionDenied, match="only admins"):
            await alice.cancel(user="bob")
        assert all(o.done for o in await alice.cancel(states=["HD"]))
        assert (await root.get(job)).state.value == "cancelled"
        assert (await root.get(mine)).state.value == "held"
        # an admin (root) may raise it
        assert all(o.done for o in await root.update_as_typed(mine, time="3:00:00"))
        assert (await root.get(mine)).spec.resources.time_limit == 3 * 3600

    one_node(store, body)


def test_an_unsatisfiable_update_is_refused(store: Store) -> None:
    """Not in the end-to-end tests this file replaces, but the other refusal a request may
    meet: a change no node could ever run."""

    async def body(co: Coordinator, agent: FakeAgent, root: InProcessClient) -> None:
        job = await root.submit(hold=True, gpus=1)
        with pytest.raises(Unsatisfiable, match=f"job {job}: "):
            await root.update_as_typed(job, gpus="3")
        assert (await root.get(job)).spec.resources.gpus == 1

    one_node(store, body)
