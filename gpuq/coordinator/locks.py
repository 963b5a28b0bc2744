"""One coordinator per GPUQ_HOME and per store: before it binds or opens anything it takes an
flock on GPUQ_HOME/coordinator.lock, and a lock on the store (a PostgreSQL advisory lock, or an
flock beside an SQLite file outside GPUQ_HOME). A second coordinator is refused with the first
one's pid and addresses; a standby (`gpuq coordinator --standby`, PostgreSQL only) waits
instead, listening nowhere, until the store lock is free, then starts as any coordinator does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuq.config.settings import Settings
from gpuq.config.value_checks import redact_url
from gpuq.coordinator.listening import prepare_home
from gpuq.errors import GpuqError, StoreInUse
from gpuq.identity import serves_every_user
from gpuq.store.engine import FileLock, PgLock, parse_database_url

log = logging.getLogger(__name__)
ADDRESS_FILE = "coordinator.json"
LOCK_FILE = "coordinator.lock"
LOCK_CHECK = 5.0  # seconds between checks that a PostgreSQL lock is still held
STANDBY_POLL = 1.0  # seconds between a standby's tries for the store lock


class StandbyStopped(Exception):
    """A standby was told to stop before it took over."""


@dataclass(slots=True)
class Locks:
    """This coordinator's claim on its home and its store, and what it tells others."""

    info: dict[str, Any]
    home: FileLock
    store: FileLock | PgLock | None = None

    def update(self, **info: Any) -> None:
        self.info.update(info)
        for lock in (self.home, self.store):
            if lock is not None:
                lock.update(self.info)

    def release(self) -> None:
        if self.store is not None:
            self.store.release()
            self.store = None
        self.home.release()


def take_locks(settings: Settings, stop: threading.Event | None = None) -> Locks:
    """The home lock, then the store lock (StoreInUse naming the holder when taken). Blocking:
    a PostgreSQL store is connected to here (StorageUnavailable when it cannot be). A standby
    waits for the store lock instead of being refused; StandbyStopped when `stop` is set
    first."""
    standby = settings.coordinator.standby
    prepare_home(settings.home, shared=serves_every_user(settings.coordinator.service_user))
    info: dict[str, Any] = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "unix": f"unix:{settings.socket_path}",
        "tcp": settings.coordinator.listen,
        "store": redact_url(settings.database_url),
    }
    url = settings.database_url
    parsed = parse_database_url(url)  # a bad URL fails before anything is locked
    postgres = parsed.get_backend_name() == "postgresql"
    if standby and not postgres:
        raise GpuqError(
            "a standby coordinator needs a PostgreSQL store ([coordinator] database_url = "
            "postgresql://...); on SQLite only one coordinator can serve the queue"
        )
    home = FileLock.acquire(settings.home / LOCK_FILE, f"GPUQ_HOME {settings.home}", info)
    locks = Locks(info, home)
    try:
        if postgres and standby:
            # this home's lock is ours: an address file here is a dead coordinator's
            (settings.home / ADDRESS_FILE).unlink(missing_ok=True)
            locks.store = PgLock.wait(
                url,
                info,
                stop or threading.Event(),
                lambda line: log.info("standing by: %s; taking over when it stops", line),
                poll=STANDBY_POLL,
            )
            if locks.store is None:
                raise StandbyStopped
            log.info("took the store lock: this standby is now the coordinator")
        elif postgres:
            locks.store = PgLock.acquire(url, info)
        elif settings.coordinator.database_url is not None and parsed.database:
            # an SQLite file outside this home: other homes may name it too
            database = Path(parsed.database).absolute()
            database.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            locks.store = FileLock.acquire(
                database.with_name(database.name + ".lock"), f"the SQLite store {database}", info
            )
    except BaseException:
        locks.release()
        raise
    return locks


async def watch_lock(
    locks: Locks,
    settings: Settings,
    on_fatal: Callable[[GpuqError], None] | None,
) -> None:
    """A PostgreSQL lock lives as long as its session: when the connection was lost (the
    server restarted, the network broke), take the lock again, or stop if another coordinator
    took it meanwhile (two coordinators must never share a store)."""
    if not isinstance(locks.store, PgLock):
        return
    if await asyncio.to_thread(locks.store.holds):
        return
    log.warning("the connection that holds the store lock was lost; taking the lock again")
    try:
        fresh = await asyncio.to_thread(PgLock.acquire, settings.database_url, locks.info)
    except StoreInUse as exc:
        log.error("lost the store lock to another session, so this coordinator stops: %s", exc)
        if on_fatal is not None:
            on_fatal(exc)
        return
    except GpuqError as exc:
        log.warning("cannot take the store lock again yet: %s", exc)
        return
    old, locks.store = locks.store, fresh
    await asyncio.to_thread(old.release)
