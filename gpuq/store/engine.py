"""Engines for the two backends, set up the way the store relies on.

SQLite: WAL, foreign keys on, a busy timeout, and write transactions opened with
`BEGIN IMMEDIATE` so that a writer takes the lock up front instead of failing on upgrade
(reads stay deferred and run beside the writer). pysqlite's own transaction handling is turned
off so these BEGINs are the only ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection, make_url

WRITE = {"gpuq_write": True}  # execution option that makes a transaction BEGIN IMMEDIATE


def sqlite_url(path: Path | str) -> str:
    return f"sqlite:///{Path(path).absolute()}"


def make_engine(url: str, *, sqlite_synchronous: str = "NORMAL") -> Engine:
    """An engine for `url`; SQLite files get their folder created (mode 0700)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(url, parsed.database, sqlite_synchronous)
    if parsed.get_backend_name() == "postgresql" and parsed.drivername == "postgresql":
        url = str(parsed.set(drivername="postgresql+psycopg").render_as_string(False))
    return create_engine(url, pool_pre_ping=True)


def _sqlite_engine(url: str, database: str | None, synchronous: str) -> Engine:
    if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
        raise ValueError(
            f"sqlite synchronous must be OFF, NORMAL, FULL or EXTRA, not {synchronous}"
        )
    if database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous.upper()}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # straight to the driver: SQLAlchemy's execution path costs more than the BEGIN itself
        write = conn.get_execution_options().get("gpuq_write", False)
        driver = conn.connection.driver_connection
        assert driver is not None  # a pysqlite connection, checked out
        driver.execute("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine
