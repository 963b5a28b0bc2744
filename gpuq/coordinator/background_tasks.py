"""Coroutines the coordinator starts and does not await (an agent's reports, a cancel, a
notification): asyncio keeps only weak references to tasks, so they are held here until they
end, and a failure is logged with what the task was for instead of vanishing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Background:
    def __init__(self, what: str) -> None:
        self.what = what  # "handling agent reports": said when one fails
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    async def cancel(self) -> None:
        """Cancel every task and wait until they are gone."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", self.what, exc_info=task.exception())
