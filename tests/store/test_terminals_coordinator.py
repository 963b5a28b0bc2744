"""Interactive jobs' lifetime on the coordinator (gpuq.coordinator.terminal_relay), with a short
grace: a job nobody attaches to is cancelled when the grace is over, one that is attached is
not; after a restart (a new Coordinator on the same store) every interactive job starts
detached, with a full grace to be attached again. On a real store, with no agent."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest
from harness import Clock, submit
from helpers import make_spec

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.server import Coordinator, assemble
from gpuq.coordinator.terminal_relay import NEVER_ATTACHED, check_interactive_spec
from gpuq.domain.array_specs import ArraySpec
from gpuq.domain.interactive_jobs import Terminal
from gpuq.domain.states import JobState
from gpuq.errors import InvalidInput
from gpuq.store.api import Store

GRACE = 60.0  # the real one; the tests move the coordinator's clock past it


def interactive(**kwargs: object) -> object:
    return replace(make_spec(gpus=1, **kwargs), terminal=Terminal())


def run(
    store: Store, body: Callable[[Coordinator], Awaitable[None]], wall: Clock | None = None
) -> None:
    """`wall`: a wall clock of its own (else the one clock, moved by hand, is both)."""

    async def main() -> None:
        steady = Clock(1_800_000_000.0)
        co = assemble(store, CoordinatorSettings(), wall or steady, steady=steady)
        co.terminals.grace = GRACE
        await co.start()
        try:
            await body(co)
        finally:
            await co.close()

    asyncio.run(main())


async def ended(co: Coordinator, job_id: int) -> None:
    for _ in range(500):
        if job_id not in co.jobs.jobs:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"job {job_id} did not end")


def test_the_grace_is_counted_on_the_steady_clock(store: Store) -> None:
    """The wall clock stepped back an hour (NTP, `date`): a job nobody attached to is still
    cancelled when the grace is over, not an hour later, holding its GPUs meanwhile."""
    wall = Clock(1_800_000_000.0)

    async def body(co: Coordinator) -> None:
        [lonely] = await submit(co, interactive(), "alice")  # type: ignore[arg-type]
        await co.terminals.sweep()
        wall.advance(-3600.0)
        co.terminals.clock.advance(GRACE + 1)  # type: ignore[attr-defined]
        wall.advance(GRACE + 1)
        await co.terminals.sweep()
        await ended(co, lonely)

    run(store, body, wall)


def test_the_grace_cancels_a_job_nobody_attached_to(store: Store) -> None:
    kept: list[int] = []

    async def body(co: Coordinator) -> None:
        [lonely] = await submit(co, interactive(), "alice")  # type: ignore[arg-type]
        [attached] = await submit(co, interactive(), "alice")  # type: ignore[arg-type]
        state = await co.terminals.open(attached, "alice")
        # attached when the coordinator goes down (its client reattaches after the restart)
        [restarted] = await submit(co, interactive(), "alice")  # type: ignore[arg-type]
        await co.terminals.open(restarted, "alice")
        kept.append(restarted)
        await co.terminals.sweep()
        assert lonely in co.jobs.jobs  # within the grace
        co.terminals.clock.advance(GRACE + 1)  # type: ignore[attr-defined]
        await co.terminals.sweep()
        await ended(co, lonely)
        job = await co.writer.read(lambda s: s.get_job(lonely))
        assert (job.state, job.reason) == (JobState.CANCELLED, NEVER_ATTACHED)
        assert co.jobs.jobs[attached].state is JobState.PENDING
        co.terminals.close(state)  # its stream went away: cancelled at once
        await ended(co, attached)

    run(store, body)

    async def after_restart(co: Coordinator) -> None:
        job_id = kept[0]
        assert co.jobs.jobs[job_id].state is JobState.PENDING
        await co.terminals.sweep()  # detached since now: a full grace
        assert job_id in co.jobs.jobs
        co.terminals.clock.advance(GRACE + 1)  # type: ignore[attr-defined]
        await co.terminals.sweep()
        await ended(co, job_id)

    run(store, after_restart)


def test_an_interactive_job_is_one_job() -> None:
    with pytest.raises(InvalidInput, match="one job"):
        check_interactive_spec(interactive(array=ArraySpec.parse("0-3")))  # type: ignore[arg-type]
    check_interactive_spec(interactive())  # type: ignore[arg-type]
