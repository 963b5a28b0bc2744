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
tried again: it raises StorageUnavailable at once, naming the store's problem ("storage
unavailable: disk full"), and is refused while the store is known down. It also waits at most
`write_timeout` seconds (`[coordinator] store_write_timeout`) for its turn and its commit, so a
user's call answers in bounded time whatever the store does: a write that had not started when
its time ran out is dropped (it never lands); one whose commit was under way when it did (a
PostgreSQL server that does not answer) is answered StorageUnavailable, and if it lands after
all, `on_late` is given its result (memory takes the change: the store is the truth).
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

from gpuq.errors import StorageUnavailable
from gpuq.store.api import Store, StoreTx
from gpuq.store.failures import (
    is_storage_error,
    storage_cause,
    storage_error_line,
    storage_unavailable,
)

__all__ = ["StoreWriter", "is_storage_error", "storage_error_line"]

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_BATCH = 2000
RETRY_FIRST = 0.1  # seconds before a write lost to a storage error is tried again...
RETRY_MOST = 5.0  # ...doubling up to this
WRITE_TIMEOUT = 5.0  # seconds a fail-fast write waits at most (CoordinatorSettings' default)


@dataclass(slots=True)
class _Item:
    fn: Callable[[StoreTx], Any]
    future: asyncio.Future[Any]
    fail_fast: bool
    started: bool = False  # its commit has begun (it may land)


class StoreWriter:
    def __init__(
        self,
        store: Store,
        on_commit: Callable[[float], None] = lambda s: None,
        write_timeout: float = WRITE_TIMEOUT,
    ) -> None:
        self.store = store
        self.write_timeout = write_timeout  # a fail-fast write's longest wait
        # SQLite's commits run on the event loop, others in the writer thread (a test may send
        # SQLite's there too, to stand for a database that does not answer)
        self.commits_on_loop = store.engine.dialect.name == "sqlite"
        # told how long each commit took, as the writer waited for it (the event bus)
        self.on_commit = on_commit
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="gpuq-store-writer")
        self._task: asyncio.Task[None] | None = None
        self.down_since: float | None = None  # monotonic time the current outage began
        self.down_cause = ""  # what the store's problem is, in a few words ("disk full")
        self._fast_cause = ""  # the last one a fail-fast write met (logged once)
        self.outages = 0  # outages seen since the start (tests and diagnostics)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="store-writer")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=True)

    async def write(
        self,
        fn: Callable[[StoreTx], T],
        fail_fast: bool = False,
        on_late: Callable[[T], None] | None = None,
    ) -> T:
        """Run fn in a transaction (shared with other writes); its result once committed.

        A storage error is waited out (the write lands once the store is back), unless
        fail_fast: then it raises StorageUnavailable, at once while the store is known down,
        and after write_timeout seconds at most (see the module docstring for `on_late`)."""
        if fail_fast and self.down_since is not None:
            raise self._unavailable(None)
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        item = _Item(fn, future, fail_fast)
        self._queue.put_nowait(item)
        if not fail_fast:
            return await future
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.write_timeout)
        except TimeoutError:
            pass
        except asyncio.CancelledError:  # the caller went away
            _abandon(item, on_late)
            raise
        if future.done():  # answered as the time ran out
            return future.result()
        _abandon(item, on_late)
        log.warning(
            "a write waited %g s for the job store (%s); its caller is told it failed",
            self.write_timeout,
            "its commit is under way" if item.started else "it had not started",
        )
        cause = self.down_cause or "the job store did not answer"
        raise StorageUnavailable(
            f"storage unavailable: {cause} (no answer in {self.write_timeout:g} s)"
        )

    async def read(self, fn: Callable[[Store], T]) -> T:
        """Run a read off the event loop (reads do not queue behind writes)."""
        return await asyncio.to_thread(fn, self.store)

    def _unavailable(self, error: BaseException | None) -> StorageUnavailable:
        if error is not None:
            return storage_unavailable(error)
        down = time.monotonic() - (self.down_since or time.monotonic())
        cause = self.down_cause or "the job store is reconnecting"
        return StorageUnavailable(f"storage unavailable: {cause} (for {down:.0f} s now)")

    def _fast_failed(self, error: BaseException) -> None:
        """A user's write failed on the store: logged when the problem is new."""
        cause = storage_cause(error)
        if cause != self._fast_cause:
            self._fast_cause = cause
            log.error(
                "a write failed: the job store is unavailable (%s)", storage_error_line(error)
            )

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
                self.down_cause = ""
                delay = RETRY_FIRST
                continue
            started = time.perf_counter()
            for item in batch:
                item.started = True
            if self.commits_on_loop:
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
                    self._fast_failed(value)
                else:
                    again.append(item)
                    lost = value
            batch[:] = again
            if lost is None:
                if any(ok for ok, _ in outcomes):
                    self._fast_cause = ""
                if self.down_since is not None and not batch:
                    log.warning(
                        "the job store is back after %.1f s; the writes that waited have landed",
                        time.monotonic() - self.down_since,
                    )
                    self.down_since = None
                    self.down_cause = ""
                delay = RETRY_FIRST
                continue
            self.down_cause = storage_cause(lost)
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


def _abandon(item: _Item, on_late: Callable[[Any], None] | None) -> None:
    """Its caller no longer waits: dropped if its commit has not begun, else what lands is
    given to on_late."""
    future = item.future
    if future.done():
        return
    if not item.started:
        future.cancel()  # dropped: it never lands
    elif on_late is not None:
        future.add_done_callback(lambda f: _late(f, on_late))
    else:
        future.add_done_callback(_quiet)


def _late(future: asyncio.Future[Any], on_late: Callable[[Any], None]) -> None:
    """A timed-out write's commit ended after all: if it landed, its caller's follow-up."""
    if future.cancelled() or future.exception() is not None:
        return
    try:
        on_late(future.result())
    except Exception:
        log.exception("applying a write that landed after its caller was told it failed")


def _quiet(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: no "exception was never retrieved" at exit
