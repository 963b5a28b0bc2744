"""The coordinator's clock chores on one timer (gpuq.coordinator.clock_chores): each runs at its
own interval, plain functions on the event loop's thread, and one that fails stops no other."""

from __future__ import annotations

import asyncio
import threading
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
