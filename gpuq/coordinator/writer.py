"""Group commit: every store write of the coordinator goes through one queue, in order.

Writes that arrive while a transaction is committing wait and then commit together, so under
load a hundred submissions or job ends cost one transaction, not a hundred; when idle, a write
commits at once. A write is a function of the transaction that reads what it needs inside it
and decides there (the database is the truth; the coordinator's memory follows it). If one
write of a batch raises, the batch is retried one write at a time so the others still land.

SQLite commits run on the event loop itself (a local commit is shorter than the hand-off to a
thread); PostgreSQL commits, which wait on the network, run in one writer thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from gpuq.store.api import Store, StoreTx

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_BATCH = 2000

_Item = tuple[Callable[[StoreTx], Any], "asyncio.Future[Any]"]


class StoreWriter:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="gpuq-store-writer")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="store-writer")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=True)

    async def write(self, fn: Callable[[StoreTx], T]) -> T:
        """Run fn in a transaction (shared with other writes); its result once committed."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((fn, future))
        return await future

    async def read(self, fn: Callable[[Store], T]) -> T:
        """Run a read off the event loop (reads do not queue behind writes)."""
        return await asyncio.to_thread(fn, self.store)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            if self.store.engine.dialect.name == "sqlite":
                outcomes = self._commit(batch)
            else:
                outcomes = await loop.run_in_executor(self._executor, self._commit, batch)
            for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
                if future.done():
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

    def _commit(self, batch: list[_Item]) -> list[tuple[bool, Any]]:
        try:
            with self.store.transaction() as tx:
                return [(True, fn(tx)) for fn, _ in batch]
        except Exception as exc:
            if len(batch) == 1:
                return [(False, exc)]
            log.debug("a batch of %d writes failed (%s); retrying one by one", len(batch), exc)
            return [self._commit([item])[0] for item in batch]
