"""Group commit: every store write of the coordinator goes through one queue, in order.

Writes that arrive while a transaction is committing wait and then commit together, so under
load a hundred submissions or job ends cost one transaction, not a hundred; when idle, a write
commits at once. A write is a function of the transaction that reads what it needs inside it
and decides there (the database is the truth; the coordinator's memory follows it). If one
write of a batch raises, the batch is retried one write at a time so the others still land.

The store may blink (PostgreSQL restarted, the network broke): a write lost to a storage error
(see is_storage_error) is tried again, with the writes that queued meanwhile, after a backoff
(RETRY_FIRST doubling to RETRY_MOST seconds) until it lands; the outage is logged once when it
starts and once when it ends. A write is a function that decides inside its transaction, so
trying it again is safe. A write made with fail_fast=True (a user's call, who can retry) is not
tried again: it raises StorageUnavailable at once, and is refused while the store is known down.
A write whose caller went away (its future cancelled) is dropped instead of tried again.

SQLite commits run on the event loop itself (a local commit is shorter than the hand-off to a
thread); PostgreSQL commits, which wait on the network, run in one writer thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from gpuq.errors import StorageUnavailable
from gpuq.store.api import Store, StoreTx

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_BATCH = 2000
RETRY_FIRST = 0.1  # seconds before a write lost to a storage error is tried again...
RETRY_MOST = 5.0  # ...doubling up to this


def is_storage_error(error: BaseException) -> bool:
    """The database went away or could not be used (not the write's fault): trying the same
    write again later may succeed. Integrity errors and gpuq's own errors are not."""
    if isinstance(error, OperationalError | InterfaceError):
        return True
    return isinstance(error, DBAPIError) and error.connection_invalidated


def storage_error_line(error: BaseException) -> str:
    orig = getattr(error, "orig", None) or error
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    return lines[0] if lines else type(orig).__name__


@dataclass(slots=True)
class _Item:
    fn: Callable[[StoreTx], Any]
    future: asyncio.Future[Any]
    fail_fast: bool


class StoreWriter:
    def __init__(self, store: Store, on_commit: Callable[[float], None] = lambda s: None) -> None:
        self.store = store
        # told how long each commit took, as the writer waited for it (the event bus)
        self.on_commit = on_commit
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="gpuq-store-writer")
        self._task: asyncio.Task[None] | None = None
        self.down_since: float | None = None  # monotonic time the current outage began
        self.outages = 0  # outages seen since the start (tests and diagnostics)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="store-writer")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=True)

    async def write(self, fn: Callable[[StoreTx], T], fail_fast: bool = False) -> T:
        """Run fn in a transaction (shared with other writes); its result once committed.

        A storage error is waited out (the write lands once the store is back), unless
        fail_fast: then it raises StorageUnavailable (at once while the store is known down)."""
        if fail_fast and self.down_since is not None:
            raise self._unavailable(None)
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Item(fn, future, fail_fast))
        return await future

    async def read(self, fn: Callable[[Store], T]) -> T:
        """Run a read off the event loop (reads do not queue behind writes)."""
        return await asyncio.to_thread(fn, self.store)

    def _unavailable(self, error: BaseException | None) -> StorageUnavailable:
        why = storage_error_line(error) if error is not None else "it is reconnecting"
        return StorageUnavailable(f"the job store cannot be written now ({why})")

    def _take(self, batch: list[_Item]) -> None:
        while len(batch) < MAX_BATCH and not self._queue.empty():
            batch.append(self._queue.get_nowait())

    async def _run(self) -> None:
        batch: list[_Item] = []
        try:
            await self._loop(batch)
        finally:  # closing: whoever still waits is told, not left hanging
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(StorageUnavailable("the coordinator is stopping"))

    async def _loop(self, batch: list[_Item]) -> None:
        loop = asyncio.get_running_loop()
        delay = RETRY_FIRST
        while True:
            if not batch:
                batch.append(await self._queue.get())
            self._take(batch)  # writes queued during a backoff join, after the earlier ones
            batch[:] = [item for item in batch if not item.future.done()]  # callers gone
            if not batch:  # nothing waits any more: the next write tries the store afresh
                self.down_since = None
                delay = RETRY_FIRST
                continue
            started = time.perf_counter()
            if self.store.engine.dialect.name == "sqlite":
                outcomes = self._commit(batch)
            else:
                outcomes = await loop.run_in_executor(self._executor, self._commit, batch)
            self.on_commit(time.perf_counter() - started)
            again: list[_Item] = []
            lost: BaseException | None = None
            for item, (ok, value) in zip(batch, outcomes, strict=True):
                if item.future.done():  # the caller went away
                    continue
                if ok:
                    item.future.set_result(value)
                elif not is_storage_error(value):
                    item.future.set_exception(value)
                elif item.fail_fast:
                    item.future.set_exception(self._unavailable(value))
                else:
                    again.append(item)
                    lost = value
            batch[:] = again
            if lost is None:
                if self.down_since is not None and not batch:
                    log.warning(
                        "the job store is back after %.1f s; the writes that waited have landed",
                        time.monotonic() - self.down_since,
                    )
                    self.down_since = None
                delay = RETRY_FIRST
                continue
            if self.down_since is None:
                self.down_since = time.monotonic()
                self.outages += 1
                log.error(
                    "the job store failed (%s); %d writes wait and are tried again until it is "
                    "back (every %g s at most)",
                    storage_error_line(lost),
                    len(batch),
                    RETRY_MOST,
                )
            else:
                log.debug("the job store is still down (%s)", storage_error_line(lost))
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MOST)

    def _commit(self, batch: list[_Item]) -> list[tuple[bool, Any]]:
        try:
            with self.store.transaction() as tx:
                return [(True, item.fn(tx)) for item in batch]
        except Exception as exc:
            if len(batch) == 1 or is_storage_error(exc):
                return [(False, exc)] * len(batch)  # the store, not a write: all of them wait
            log.debug("a batch of %d writes failed (%s); retrying one by one", len(batch), exc)
            return [self._commit([item])[0] for item in batch]
