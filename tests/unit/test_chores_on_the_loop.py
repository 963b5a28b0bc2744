"""The coordinator's periodic chores run on its event loop, never on a worker thread (its
memory and asyncio objects belong to the loop: APScheduler's AsyncIOExecutor runs a plain
function on a thread pool, where a rerank raced listings, "dictionary changed size during
iteration", and a periodic wake raced asyncio.Event), and by the loop's steady clock: after
the wall clock stepped back, APScheduler's interval jobs waited the step out."""

from __future__ import annotations

import asyncio
import datetime as real_datetime
import inspect
import threading
import time
from pathlib import Path
from unittest import mock

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from gpuq.config.loading import load_settings
from gpuq.coordinator.clock_chores import ClockChore, ClockChores
from gpuq.coordinator.serving import start_coordinator

STEP = 3600.0  # the wall clock goes back an hour


class SteppedBack(real_datetime.datetime):
    """datetime whose now() is an hour behind, as after NTP stepped the clock back."""

    @classmethod
    def now(cls, tz: real_datetime.tzinfo | None = None) -> SteppedBack:  # type: ignore[override]
        return real_datetime.datetime.now(tz) - real_datetime.timedelta(seconds=STEP)  # type: ignore[return-value]


def test_a_wall_clock_step_stalls_apschedulers_intervals_but_not_the_clock_chores() -> None:
    counts = {"apscheduler": 0, "clock chores": 0}

    def count(name: str) -> None:
        counts[name] += 1

    async def main() -> None:
        scheduler = AsyncIOScheduler()

        async def interval_job() -> None:
            count("apscheduler")

        scheduler.add_job(interval_job, "interval", seconds=0.05)
        scheduler.start()
        clock = ClockChores(0.05, [ClockChore(lambda: count("clock chores"), 0.05)])
        clock.start()
        try:
            while min(counts.values()) < 3:
                await asyncio.sleep(0.01)
            with (
                mock.patch("apscheduler.schedulers.base.datetime", SteppedBack),
                mock.patch("apscheduler.triggers.interval.datetime", SteppedBack),
                mock.patch("time.time", lambda: real_time() - STEP),
            ):
                before = dict(counts)
                await asyncio.sleep(0.6)
            after = dict(counts)
        finally:
            scheduler.shutdown(wait=False)
            await clock.stop()
        assert after["apscheduler"] - before["apscheduler"] <= 1  # the trap: it waits an hour
        assert after["clock chores"] - before["clock chores"] >= 5

    real_time = time.time
    asyncio.run(main())


def test_the_coordinators_periodic_chores_are_clock_chores_on_the_loop(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text(
        '[coordinator]\nlisten = ""\n[scheduler]\npriority_interval = 0.3\n'
    )

    async def main() -> None:
        running = await start_coordinator(load_settings(home=home))
        try:
            clock = running.clock
            assert clock is not None
            by_name = {getattr(c.run, "__qualname__", ""): c for c in clock.chores}
            for name in ("NodeAdmin.check_heartbeats", "JobEndings.check_time_limits"):
                assert name in by_name, sorted(by_name)
            # APScheduler keeps the cron entries only (wall-clock times), each a coroutine
            assert not [
                j.name
                for j in running.coordinator.chores.get_jobs()
                if not inspect.iscoroutinefunction(j.func)
            ]
            rerank = by_name["SchedulingLoop.rerank"]
            assert rerank.every == 0.3 and clock.tick <= 0.3  # as often as an admin set it
            threads: list[int] = []
            real = rerank.run
            rerank.run = lambda: (threads.append(threading.get_ident()), real())[1]
            deadline = time.monotonic() + 5
            while len(threads) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert len(threads) >= 3 and set(threads) == {threading.get_ident()}
        finally:
            await running.stop()

    asyncio.run(main())
