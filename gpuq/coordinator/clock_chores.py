"""The coordinator's periodic chores on one timer of its own, on the steady clock.

Each APScheduler interval job is a wake of the event loop of its own: the heartbeat check, the
time-limit check and the periodic pass, every 2 s each, and the terminal sweep every 5 s woke
an idle coordinator about 1.7 times a second (issue 27: idle CPU). On one timer they share one
wake per tick; each still runs at its own interval (to within half a tick), and one that fails
is logged without keeping the others from running.

The timer is the event loop's (asyncio.sleep: the monotonic clock), not APScheduler's, which
counts intervals on the wall clock: after the wall clock stepped back an hour (NTP on a fresh
VM, an admin's `date`), every interval job waited that hour out, so no silent node was given
up, no time limit enforced, and a standby's lost store lock went unnoticed. Cron entries,
whose times are wall-clock times, stay with APScheduler (gpuq.coordinator.cron_service)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ClockChore:
    run: Callable[[], Awaitable[None] | None]
    every: float  # seconds between two runs, at least the timer's tick
    next_at: float = 0.0  # time.monotonic() of the next run (0: at the first tick)
    # a coroutine chore still running: its next turn is skipped (one at a time, and a slow
    # one, a store read while PostgreSQL restarts, holds up no other chore)
    running: asyncio.Task[None] | None = None


class ClockChores:
    """Every `tick` seconds, on the event loop, the chores that are due: plain functions are
    called there (the coordinator's memory belongs to the loop), coroutines become tasks."""

    def __init__(self, tick: float, chores: list[ClockChore]) -> None:
        self.tick = tick
        self.chores = chores
        self._timer: asyncio.Task[None] | None = None

    def start(self) -> None:
        """The first tick now, then one every `tick` seconds until stop()."""
        self._timer = asyncio.get_running_loop().create_task(self._ticks())

    async def stop(self) -> None:
        """No more ticks; chores still running are cancelled."""
        tasks = [self._timer, *(c.running for c in self.chores)]
        for task in tasks:
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in tasks if t is not None), return_exceptions=True)
        self._timer = None

    async def _ticks(self) -> None:
        while True:
            self.run_due()
            await asyncio.sleep(self.tick)

    def run_due(self) -> None:
        """One tick: each chore due now (to within half a tick) and not still running."""
        now = time.monotonic()
        for chore in self.chores:
            if now + self.tick / 2 < chore.next_at:
                continue
            if chore.running is not None and not chore.running.done():
                continue
            chore.next_at = now + chore.every
            try:
                done = chore.run()
            except Exception:
                _failed(chore)
                continue
            if inspect.isawaitable(done):
                # the chore's own coroutine is the task: one cancelled before it ran (stop()
                # right after a tick) is closed by asyncio, never left "never awaited"
                chore.running = asyncio.ensure_future(done)
                chore.running.add_done_callback(functools.partial(_ended, chore))


def _ended(chore: ClockChore, task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        _failed(chore, task.exception())


def _failed(chore: ClockChore, error: BaseException | None = None) -> None:
    name = getattr(chore.run, "__qualname__", chore.run)
    log.error("chore %s failed", name, exc_info=error or True)
