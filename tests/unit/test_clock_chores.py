"""The coordinator's clock chores on one timer (gpuq.coordinator.clock_chores): each runs at its
own interval, plain functions on the event loop's thread, and one that fails stops no other."""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings
from unittest import mock

import pytest

from gpuq.coordinator.clock_chores import ClockChore, ClockChores


def test_each_chore_runs_at_its_own_interval_on_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []
    threads: set[int] = set()

    def plain() -> None:
        threads.add(threading.get_ident())
        ran.append("plain")

    async def often() -> None:
        ran.append("often")

    def broken() -> None:
        raise RuntimeError("boom")

    clock = ClockChores(
        2.0,
        [ClockChore(often, 2.0), ClockChore(broken, 2.0), ClockChore(plain, 5.0)],
    )
    now = [1000.0]

    async def ticks() -> int:
        with mock.patch("gpuq.coordinator.clock_chores.time.monotonic", lambda: now[0]):
            for _ in range(6):  # t = 1000, 1002, ... 1010
                clock.run_due()
                await asyncio.sleep(0)  # the coroutine chores' tasks run
                now[0] += 2.0
        return threading.get_ident()

    loop_thread = asyncio.run(ticks())
    assert ran.count("often") == 6  # every tick, although `broken` failed before it each time
    # every 5 s to within half a tick: at 1000, 1004 (due 1005), 1008 (due 1009)
    assert ran.count("plain") == 3
    assert threads == {loop_thread}
    assert len([r for r in caplog.records if "broken failed" in r.getMessage()]) == 6


def test_a_failing_coroutine_chore_is_logged_and_a_stop_right_after_a_tick_leaves_no_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def failing() -> None:
        raise RuntimeError("boom")

    async def later() -> None:
        await asyncio.sleep(0)

    async def scenario() -> None:
        clock = ClockChores(60.0, [ClockChore(failing, 60.0)])
        clock.run_due()
        await asyncio.sleep(0)  # its task runs, and fails
        await asyncio.sleep(0)
        stopped = ClockChores(60.0, [ClockChore(later, 60.0)])
        stopped.run_due()
        await stopped.stop()  # its task is cancelled before it ever ran

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(scenario())
        gc.collect()
    assert len([r for r in caplog.records if "failing failed" in r.getMessage()]) == 1
    assert not [w for w in caught if "never awaited" in str(w.message)], caught
