"""StoreWriter through a store outage: writes lost to a storage error wait and land once the
store is back (logged once per outage); a fail-fast write raises StorageUnavailable; a write's
own error is not tried again; a write whose caller went away is dropped.

The outage is a stateful fake around a real SQLite store: while `down`, opening a transaction
raises the OperationalError a lost PostgreSQL connection raises."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from harness import record_ends
from helpers import make_spec
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.changes import store_writer as writer_module
from gpuq.coordinator.changes.store_writer import StoreWriter, is_storage_error
from gpuq.coordinator.memory.node_table import NodeEntry
from gpuq.coordinator.nodes.agent_session import AgentSession
from gpuq.coordinator.server import assemble
from gpuq.domain.model import GpuUnit, JobResult, Node, NodeState
from gpuq.domain.states import JobState
from gpuq.errors import IllegalTransition, NotFound, StorageUnavailable
from gpuq.store.api import Store, StoreTx
from gpuq.store.records import NewJob


def _lost() -> OperationalError:
    return OperationalError("BEGIN", {}, ConnectionError("server closed the connection"))


class BlinkingStore(Store):
    def __init__(self, store: Store) -> None:
        super().__init__(store.engine)
        self.down = False
        self.lose_answers = 0  # commits that land but whose answer is lost (raise after)
        self.tries = 0
        self.slow = 0.0  # seconds each commit hangs first (a database that does not answer)
        self.failure: Exception | None = None  # what each commit raises instead (disk full)

    @contextmanager
    def transaction(self) -> Iterator[StoreTx]:
        self.tries += 1
        if self.down:
            raise _lost()
        if self.slow:
            time.sleep(self.slow)
        if self.failure is not None:
            raise OperationalError("COMMIT", {}, self.failure)
        with super().transaction() as tx:
            yield tx
        if self.lose_answers:
            self.lose_answers -= 1
            raise _lost()


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[BlinkingStore]:
    monkeypatch.setattr(writer_module, "RETRY_FIRST", 0.01)
    monkeypatch.setattr(writer_module, "RETRY_MOST", 0.04)
    real = Store.open(f"sqlite:///{tmp_path / 'gpuq.db'}")
    try:
        yield BlinkingStore(real)
    finally:
        real.close()


async def _until(condition: object, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_storage_errors_are_told_from_others() -> None:
    orig = ConnectionError("gone")
    assert is_storage_error(OperationalError("x", {}, orig))
    invalidated = DBAPIError("x", {}, orig, connection_invalidated=True)
    assert is_storage_error(invalidated)
    assert not is_storage_error(DBAPIError("x", {}, orig))
    assert not is_storage_error(IntegrityError("x", {}, orig))
    assert not is_storage_error(IllegalTransition(1, "running", "pending"))


def test_a_write_waits_out_an_outage_and_it_is_logged_once(
    store: BlinkingStore, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        writer = StoreWriter(store)
        writer.start()
        try:
            store.down = True
            first = asyncio.ensure_future(writer.write(lambda tx: "first"))
            await _until(lambda: store.tries >= 5)  # tried again and again
            assert not first.done()
            assert writer.down_since is not None
            tries = store.tries
            later = asyncio.ensure_future(writer.write(lambda tx: "later"))
            # it is tried during the outage (two more tries: one may have begun without it)
            await _until(lambda: store.tries > tries + 1)
            assert not later.done()
            store.down = False
            assert await asyncio.wait_for(first, 5) == "first"
            assert await asyncio.wait_for(later, 5) == "later"
            assert writer.down_since is None and writer.outages == 1
            assert await writer.write(lambda tx: "after") == "after"
        finally:
            await writer.close()

    with caplog.at_level(logging.INFO, logger="gpuq.coordinator.changes.store_writer"):
        asyncio.run(main())
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("the job store failed" in m for m in messages) == 1, messages
    assert sum("the job store is back" in m for m in messages) == 1, messages


def test_a_fail_fast_write_raises_storage_unavailable(store: BlinkingStore) -> None:
    async def main() -> None:
        writer = StoreWriter(store)
        writer.start()
        try:
            store.down = True
            with pytest.raises(StorageUnavailable, match="server closed the connection"):
                await writer.write(lambda tx: 1, fail_fast=True)
            waiting = asyncio.ensure_future(writer.write(lambda tx: 2))
            await _until(lambda: writer.down_since is not None)
            tries = store.tries
            with pytest.raises(StorageUnavailable):  # known down: refused without a try
                await writer.write(lambda tx: 3, fail_fast=True)
            store.down = False
            assert await asyncio.wait_for(waiting, 5) == 2
            assert store.tries > tries
            assert await writer.write(lambda tx: 4, fail_fast=True) == 4
        finally:
            await writer.close()

    asyncio.run(main())


def test_a_writes_own_error_is_not_tried_again(store: BlinkingStore) -> None:
    calls: list[int] = []

    def broken(tx: StoreTx) -> None:
        calls.append(1)
        raise NotFound("no job 7")

    async def main() -> None:
        writer = StoreWriter(store)
        writer.start()
        try:
            with pytest.raises(NotFound):
                await writer.write(broken)
            assert calls == [1]
        finally:
            await writer.close()

    asyncio.run(main())


def test_a_write_whose_caller_went_away_is_dropped(store: BlinkingStore) -> None:
    ran: list[str] = []

    async def main() -> None:
        writer = StoreWriter(store)
        writer.start()
        try:
            store.down = True
            gone = asyncio.ensure_future(writer.write(lambda tx: ran.append("gone")))
            kept = asyncio.ensure_future(writer.write(lambda tx: ran.append("kept")))
            await _until(lambda: store.tries >= 2)
            gone.cancel()
            store.down = False
            await asyncio.wait_for(kept, 5)
            assert ran == ["kept"]
            assert writer.down_since is None
        finally:
            await writer.close()

    asyncio.run(main())


def test_writes_whose_commit_landed_but_answer_was_lost(store: BlinkingStore) -> None:
    """Tried again, a write finds its own work done: memory must still follow (a started job
    is started, an ended one is ended), or the job would hold its node for good."""
    unit = GpuUnit("GPU-a-0", 0, "NVIDIA A100", 80 << 30, "0000:01:00.0")
    node = Node("a", (unit,), cpus=8, mem=64 << 30, state=NodeState.UP, last_seen=time.time())
    with store.transaction() as tx:
        tx.save_node(node)
        [[job_id]] = tx.add_jobs([NewJob(make_spec(gpus=1), "alice", "normal", 0)], time.time())
    started: list[int] = []

    async def main() -> None:
        co = assemble(store, CoordinatorSettings())
        co.agents.send_starts = lambda jobs: started.extend(j.id for j in jobs)
        store.lose_answers = 1  # the pass's start
        await co.start()
        co.nodes.nodes["a"] = NodeEntry(
            node,
            last_seen=time.time(),
            heard_at=co.steady(),
            session=AgentSession("a"),
            heard=True,
        )
        co.wake()
        await _until(lambda: started == [job_id])
        assert co.jobs.jobs[job_id].state is JobState.RUNNING
        store.lose_answers = 1  # the end's
        result = JobResult(exit_code=0)
        await record_ends(co, "a", [(job_id, JobState.COMPLETED, result, None)])
        assert job_id not in co.jobs.jobs  # ended in memory too: nothing holds the GPU
        await co.close()

    asyncio.run(main())
    assert store.get_job(job_id).state is JobState.COMPLETED


def test_storage_errors_are_named_by_their_cause() -> None:
    import sqlite3

    from gpuq.store.failures import is_storage_error, storage_cause, storage_unavailable

    full = OperationalError("COMMIT", {}, sqlite3.OperationalError("database or disk is full"))
    assert is_storage_error(full) and storage_cause(full) == "disk full"
    assert str(storage_unavailable(full)) == (
        "storage unavailable: disk full (database or disk is full)"
    )
    raw = sqlite3.OperationalError("database or disk is full")  # not wrapped by SQLAlchemy
    assert is_storage_error(raw) and storage_cause(raw) == "disk full"
    pg_full = OperationalError(
        "INSERT", {}, Exception('could not extend file "base/16384/16385": No space left on device')
    )
    assert storage_cause(pg_full) == "disk full"
    refused = OperationalError(
        "connect",
        {},
        Exception(
            'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
            "Connection refused\n\tIs the server running on that host?"
        ),
    )
    assert is_storage_error(refused) and storage_cause(refused) == "database unreachable"
    assert storage_cause(_lost()) == "database unreachable"
    assert storage_cause(OperationalError("x", {}, Exception("database is locked"))) == (
        "database busy"
    )
    assert not is_storage_error(IntegrityError("x", {}, Exception("UNIQUE constraint failed")))


def test_a_fail_fast_write_the_store_does_not_answer_fails_in_bounded_time(
    store: BlinkingStore,
) -> None:
    """A commit that hangs (a database that does not answer): the user's write is answered
    StorageUnavailable after write_timeout, and what landed after all reaches on_late; a write
    that waited its turn behind it all that time is dropped and never lands."""
    store.slow = 1.0
    late: list[int] = []
    ran: list[str] = []

    async def main() -> None:
        writer = StoreWriter(store, write_timeout=0.3)
        writer.commits_on_loop = False  # a hanging commit must not hold the event loop
        writer.start()
        try:
            began = time.monotonic()
            first = writer.write(
                lambda tx: ran.append("hung") or 1, fail_fast=True, on_late=late.append
            )
            hung = asyncio.ensure_future(first)
            await asyncio.sleep(0.05)  # its commit is under way
            queued = asyncio.ensure_future(
                writer.write(lambda tx: ran.append("queued") or 2, fail_fast=True)
            )
            for task in (hung, queued):
                with pytest.raises(StorageUnavailable, match=r"storage unavailable: .*0\.3 s"):
                    await task
            assert time.monotonic() - began < 0.9  # about write_timeout, not the commit's 1 s
            await _until(lambda: late == [1])  # the hung commit landed: its follow-up ran
            store.slow = 0.0
            assert await writer.write(lambda tx: 3, fail_fast=True) == 3
            assert ran == ["hung"]  # the queued one was dropped
        finally:
            await writer.close()

    asyncio.run(main())


def test_a_fail_fast_write_names_a_full_disk_and_writes_resume(store: BlinkingStore) -> None:
    import sqlite3

    async def main() -> None:
        writer = StoreWriter(store)
        writer.start()
        try:
            store.failure = sqlite3.OperationalError("database or disk is full")
            began = time.monotonic()
            with pytest.raises(StorageUnavailable, match="storage unavailable: disk full"):
                await writer.write(lambda tx: 1, fail_fast=True)
            assert time.monotonic() - began < 1.0
            waiting = asyncio.ensure_future(writer.write(lambda tx: 2))  # waits it out
            await _until(lambda: writer.down_since is not None)
            assert writer.down_cause == "disk full"
            with pytest.raises(StorageUnavailable, match="storage unavailable: disk full"):
                await writer.write(lambda tx: 3, fail_fast=True)  # known down: no try
            store.failure = None
            assert await asyncio.wait_for(waiting, 5) == 2
            assert await writer.write(lambda tx: 4, fail_fast=True) == 4
            assert writer.down_since is None and writer.down_cause == ""
        finally:
            await writer.close()

    asyncio.run(main())


def test_a_fail_fast_write_whose_caller_went_away(store: BlinkingStore) -> None:
    """Not started yet: dropped. Its commit under way: what lands still reaches on_late."""
    store.slow = 0.3
    late: list[int] = []
    ran: list[str] = []

    async def main() -> None:
        writer = StoreWriter(store, write_timeout=5.0)
        writer.commits_on_loop = False
        writer.start()
        try:
            first = writer.write(
                lambda tx: ran.append("under way") or 1, fail_fast=True, on_late=late.append
            )
            under_way = asyncio.ensure_future(first)
            await asyncio.sleep(0.05)
            queued = asyncio.ensure_future(
                writer.write(lambda tx: ran.append("queued") or 2, fail_fast=True)
            )
            await asyncio.sleep(0.01)
            under_way.cancel()
            queued.cancel()
            await _until(lambda: late == [1])
            store.slow = 0.0
            assert await writer.write(lambda tx: 3, fail_fast=True) == 3
            assert ran == ["under way"]
        finally:
            await writer.close()

    asyncio.run(main())
