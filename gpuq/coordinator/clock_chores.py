"""The coordinator's frequent clock chores on one timer.

Each APScheduler interval job is a wake of the event loop of its own: the heartbeat check, the
time-limit check and the periodic pass, every 2 s each, and the terminal sweep every 5 s woke
an idle coordinator about 1.7 times a second (issue 27: idle CPU). On one timer they share one
wake per tick; each still runs at its own interval (to within half a tick), and one that fails
is logged without keeping the others from running."""

from __future__ import annotations

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


class ClockChores:
    """`run` every `tick` seconds (max_instances=1), on the event loop: the chores that are
    due run in order (plain functions too, on the loop, as the coordinator's memory needs)."""

    def __init__(self, tick: float, chores: list[ClockChore]) -> None:
        self.tick = tick
        self.chores = chores

    async def run(self) -> None:
        """A coroutine function, so that APScheduler's AsyncIOExecutor awaits it on the loop
        (a plain callable, an object with an async __call__ included, goes to a thread)."""
        now = time.monotonic()
        for chore in self.chores:
            if now + self.tick / 2 < chore.next_at:
                continue
            chore.next_at = now + chore.every
            try:
                done = chore.run()
                if inspect.isawaitable(done):
                    await done
            except Exception:
                log.exception("chore %s failed", getattr(chore.run, "__qualname__", chore.run))
