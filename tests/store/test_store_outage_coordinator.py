"""A store that cannot take a write (disk full, a database that does not answer), through the
coordinator's front door, on SQLite and PostgreSQL: a user's submission or edit is answered
"storage unavailable" with the cause, within store_write_timeout; reads keep working; nothing
acknowledged is lost, and writes resume once the store is back, with no restart."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from harness import InProcessClient, eventually, run
from sqlalchemy.exc import OperationalError

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.server import Coordinator
from gpuq.errors import StorageUnavailable
from gpuq.store.api import Store, StoreTx
from gpuq.store.records import JobQuery


class FailingStore(Store):
    """A real store whose transactions can fail as a full disk fails them, or hang first."""

    def __init__(self, store: Store) -> None:
        super().__init__(store.engine)
        self.full = False
        self.slow = 0.0

    @contextmanager
    def transaction(self) -> Iterator[StoreTx]:
        if self.slow:
            time.sleep(self.slow)
        with super().transaction() as tx:
            yield tx
            if self.full:  # the commit's write fails: nothing of it lands
                raise OperationalError(
                    "COMMIT", {}, sqlite3.OperationalError("database or disk is full")
                )


def test_a_full_disk_fails_user_writes_fast_and_reads_keep_working(store: Store) -> None:
    failing = FailingStore(store)

    async def body(co: Coordinator) -> None:
        alice = InProcessClient(co, "alice")
        kept = await alice.submit(hold=True)
        failing.full = True
        began = time.monotonic()
        with pytest.raises(StorageUnavailable, match="storage unavailable: disk full"):
            await alice.submit()
        for edit in (
            lambda: alice.cancel(kept),
            lambda: alice.release(kept),
            lambda: alice.update(kept, name="renamed"),
        ):
            with pytest.raises(StorageUnavailable, match="storage unavailable: disk full"):
                await edit()
        assert time.monotonic() - began < 5.0  # each at once, not after the default 5 s
        assert [j.id for j in await alice.list_raw()] == [kept]  # reads keep working
        assert (await alice.get(kept)).state.value == "held"
        failing.full = False  # the disk has room again: no restart needed
        second = await alice.submit(hold=True)
        outcome = await alice.release(kept)
        assert outcome[0].done
        assert await alice.state(kept) == "pending"
        assert sorted(j.id for j in await alice.list_raw()) == [kept, second]

    run(failing, body)
    assert len(store.list_jobs(JobQuery())) == 2


def test_a_store_that_does_not_answer_fails_a_submission_in_store_write_timeout(
    store: Store,
) -> None:
    """The commit hangs longer than store_write_timeout: the user is answered in about that
    time; the submission, landing after all, reaches memory, and its retry with the same key
    is the same job."""
    failing = FailingStore(store)
    settings = CoordinatorSettings(store_write_timeout=0.3)

    async def body(co: Coordinator) -> None:
        co.writer.commits_on_loop = False  # a hanging SQLite commit must not hold the loop
        alice = InProcessClient(co, "alice")
        from gpuq.submission import build_spec

        spec = build_spec(wrap="true", hold=True, environ={}, chdir="/tmp")
        failing.slow = 1.0
        began = time.monotonic()
        with pytest.raises(StorageUnavailable, match=r"storage unavailable: .*0\.3 s"):
            await alice.submit_spec(spec, request_key="k1")
        assert 0.25 < time.monotonic() - began < 0.9
        failing.slow = 0.0

        async def landed() -> list[int]:
            return [j.id for j in await alice.list_raw()]

        [job_id] = await eventually(landed)  # the late commit reached memory
        assert await alice.submit_spec(spec, request_key="k1") == [job_id]  # no second job

    run(failing, body, settings)
    assert len(store.list_jobs(JobQuery())) == 1
