"""Engines for the two backends, set up the way the store relies on.

SQLite: WAL, foreign keys on, a busy timeout, and write transactions opened with
`BEGIN IMMEDIATE` so that a writer takes the lock up front instead of failing on upgrade
(reads stay deferred and run beside the writer). pysqlite's own transaction handling is turned
off so these BEGINs are the only ones.

Also the coordinator's locks (one coordinator per GPUQ_HOME and per store): an flock on a file,
or a PostgreSQL session-level advisory lock on a connection of its own. Both end with the
process however it ends (the kernel drops the flock, PostgreSQL the session), so a coordinator
killed with SIGKILL never blocks the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.pool import NullPool

from gpuq.config.value_checks import redact_url
from gpuq.errors import GpuqError, InvalidInput, StorageUnavailable, StoreInUse

WRITE = {"gpuq_write": True}  # execution option that makes a transaction BEGIN IMMEDIATE


def sqlite_url(path: Path | str) -> str:
    return f"sqlite:///{Path(path).absolute()}"


def make_engine(url: str, *, sqlite_synchronous: str = "NORMAL") -> Engine:
    """An engine for `url`; SQLite files get their folder created (mode 0700)."""
    parsed = parse_database_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(url, parsed.database, sqlite_synchronous)
    return create_engine(_psycopg_url(parsed), pool_pre_ping=True)


PG_DRIVERS = ("postgresql", "postgresql+psycopg")
POSTGRES_EXTRA = "pip install 'lab-gpu-queue[postgres]'"


def parse_database_url(url: str) -> URL:
    """`url` parsed, or one clear error: InvalidInput for a malformed one, GpuqError when it
    names PostgreSQL and the driver is not installed."""
    shown = redact_url(url)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise InvalidInput("database_url", shown, f"not a database URL ({exc})") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return parsed
    if backend != "postgresql" or parsed.drivername not in PG_DRIVERS:
        raise InvalidInput(
            "database_url", shown, "expected sqlite:///PATH or postgresql://USER@HOST/DATABASE"
        )
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise InvalidInput("database_url", shown, "the port must be from 1 to 65535")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise GpuqError(
            f"the PostgreSQL store ({shown}) needs the psycopg driver, which is not "
            f"installed: {POSTGRES_EXTRA}"
        ) from None
    return parsed


def _psycopg_url(parsed: URL) -> str:
    return str(parsed.set(drivername="postgresql+psycopg").render_as_string(False))


def storage_unavailable(url: str, error: BaseException) -> StorageUnavailable:
    """The one line to show for a database that could not be reached or opened."""
    orig = getattr(error, "orig", None) or error
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    reason = lines[0] if lines else type(orig).__name__
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return StorageUnavailable(f"cannot open the SQLite store {parsed.database}: {reason}")
    host = parsed.host or "the local socket"
    where = f"{host}:{parsed.port}" if parsed.port else host
    verb = "connect to" if isinstance(error, OperationalError | InterfaceError) else "use"
    return StorageUnavailable(
        f"cannot {verb} the PostgreSQL store at {where} (database {parsed.database}): {reason}"
    )


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


# ---- one coordinator per GPUQ_HOME and per store ----------------------------------------------


def describe_holder(info: dict[str, Any]) -> str:
    """`pid 123 on gpu01, listening on unix:/x/gpuq.sock and 127.0.0.1:7817`."""
    if not info.get("pid"):
        return "its pid is not known yet"
    where = " and ".join(str(a) for a in (info.get("unix"), info.get("tcp")) if a)
    host = f" on {info['host']}" if info.get("host") else ""
    return f"pid {info['pid']}{host}" + (f", listening on {where}" if where else "")


class FileLock:
    """An exclusive flock on `path`, held until release() or the process's end. The holder's
    pid and addresses are written into the file for whoever finds it taken. The file itself
    stays: removing it would let a second process lock a new file while the first holds the
    old one."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd = fd
        self.path = path

    @classmethod
    def acquire(cls, path: Path, what: str, info: dict[str, Any]) -> FileLock:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise StoreInUse(
                f"another gpuq coordinator already uses {what} ({describe_holder(holder)}); "
                "stop that one first"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise StorageUnavailable(f"cannot lock {path}: {exc.strerror}") from None
        lock = cls(fd, path)
        lock.update(info)
        return lock

    def update(self, info: dict[str, Any]) -> None:
        data = json.dumps(info).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # the flock goes with the last descriptor
            self._fd = -1


def _read_holder(fd: int) -> dict[str, Any]:
    """What the holder wrote; it writes right after locking, so wait a moment for it."""
    deadline = time.monotonic() + 0.5
    while True:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(os.pread(fd, 4096, 0) or b"null")
            if isinstance(data, dict):
                return data
        if time.monotonic() > deadline:
            return {}
        time.sleep(0.02)


PG_LOCK_CLASS = 0x67707571  # "gpuq"; the second key is the schema's (see PgLock)
PG_APPLICATION_NAME_MAX = 63  # longer application_names are cut by PostgreSQL


def pg_label(info: dict[str, Any]) -> str:
    """The lock connection's application_name: how a refused coordinator learns who holds
    the lock (from pg_stat_activity), and what an admin sees there."""
    addresses = " ".join(str(info[k]) for k in ("tcp", "unix") if info.get(k))
    role = "gpuq standby" if info.get("standby") else "gpuq"
    label = f"{role} pid={info.get('pid')} host={info.get('host')} {addresses}"
    return label[:PG_APPLICATION_NAME_MAX]


def pg_lock_key(schema: str) -> int:
    """The advisory lock's second key: one store per database and schema."""
    return zlib.crc32(schema.encode()) & 0x7FFFFFFF


class PgLock:
    """A PostgreSQL session-level advisory lock, held on a connection of its own for the
    coordinator's life. Keyed by (PG_LOCK_CLASS, a hash of the schema): two coordinators on
    one database and schema exclude each other, and PostgreSQL drops the lock when the
    session ends. The session asks the server for TCP keepalives, so a holder whose machine
    died frees the lock within about half a minute rather than the kernel's two hours."""

    def __init__(self, engine: Engine, conn: Connection, key: int, url: str) -> None:
        self._engine = engine
        self._conn = conn
        self.key = key
        self.url = url

    @classmethod
    def acquire(cls, url: str, info: dict[str, Any]) -> PgLock:
        engine, conn = cls._connect(url, info)
        try:
            got, schema, key, holder = cls._try(conn, url)
            if not got:
                raise StoreInUse(
                    f"another gpuq coordinator already uses {_pg_where(url, schema)}: {holder}; "
                    "stop that one first"
                )
        except BaseException:
            conn.close()
            engine.dispose()
            raise
        return cls(engine, conn, key, url)

    @classmethod
    def wait(
        cls,
        url: str,
        info: dict[str, Any],
        stop: threading.Event,
        on_wait: Callable[[str], None],
        poll: float = 1.0,
    ) -> PgLock | None:
        """The lock, once this session gets it: while another session holds it, ask again
        every `poll` seconds on one connection, calling on_wait(a line naming the store and
        the holder) whenever the holder changes; None when `stop` is set first. A database
        that cannot be reached at the first try raises StorageUnavailable; a connection lost
        later is made again (on_wait says so once)."""
        waiting = {**info, "standby": True}
        said = None
        connected = False
        while not stop.is_set():
            try:
                engine, conn = cls._connect(url, waiting)
            except StorageUnavailable as exc:
                if not connected:
                    raise
                if said != str(exc):
                    said = str(exc)
                    on_wait(said)
                stop.wait(poll)
                continue
            connected = True
            try:
                while not stop.is_set():
                    got, schema, key, holder = cls._try(conn, url)
                    if got:
                        lock = cls(engine, conn, key, url)
                        lock.update(info)  # no longer "standby" in pg_stat_activity
                        return lock
                    line = f"{_pg_where(url, schema)} is in use by {holder}"
                    if said != line:
                        said = line
                        on_wait(line)
                    stop.wait(poll)
            except StorageUnavailable as exc:  # the connection was lost: make a new one
                if said != str(exc):
                    said = str(exc)
                    on_wait(said)
                stop.wait(poll)
            except BaseException:
                conn.close()
                engine.dispose()
                raise
            conn.close()
            engine.dispose()
        return None

    @staticmethod
    def _connect(url: str, info: dict[str, Any]) -> tuple[Engine, Connection]:
        parsed = parse_database_url(url)
        engine = create_engine(
            _psycopg_url(parsed),
            poolclass=NullPool,
            connect_args={"application_name": pg_label(info), "connect_timeout": 10},
        )
        try:
            conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        except DBAPIError as exc:
            engine.dispose()
            raise storage_unavailable(url, exc) from None
        return engine, conn

    @staticmethod
    def _try(conn: Connection, url: str) -> tuple[bool, str, int, str | None]:
        """(got the lock, the schema, the lock's key, who holds it when not got)."""
        try:
            schema = str(conn.exec_driver_sql("SELECT current_schema()").scalar() or "public")
            for setting, value in (
                ("tcp_keepalives_idle", 10),
                ("tcp_keepalives_interval", 5),
                ("tcp_keepalives_count", 3),
                ("idle_session_timeout", 0),
            ):
                with contextlib.suppress(DBAPIError):  # an older server lacks one: fine
                    conn.exec_driver_sql(f"SET {setting} = {value}")
            key = pg_lock_key(schema)
            got = bool(
                conn.execute(
                    text("SELECT pg_try_advisory_lock(:c, :k)"), {"c": PG_LOCK_CLASS, "k": key}
                ).scalar()
            )
            holder = None if got else _pg_holder(conn, key)
        except DBAPIError as exc:
            raise storage_unavailable(url, exc) from None
        return got, schema, key, holder

    def update(self, info: dict[str, Any]) -> None:
        """Tell pg_stat_activity the addresses now bound."""
        with contextlib.suppress(DBAPIError):
            self._conn.execute(
                text("SELECT set_config('application_name', :name, false)"),
                {"name": pg_label(info)},
            )

    def holds(self) -> bool:
        """Whether this session still holds the lock (False: the connection was lost, and the
        lock with it)."""
        try:
            held = self._conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                    " AND pid = pg_backend_pid() AND classid::bigint = :c"
                    " AND objid::bigint = :k AND objsubid = 2"
                ),
                {"c": PG_LOCK_CLASS, "k": self.key},
            ).scalar()
        except SQLAlchemyError:
            return False
        return bool(held)

    def release(self) -> None:
        with contextlib.suppress(SQLAlchemyError):
            self._conn.close()  # the session ends, and the lock with it
        with contextlib.suppress(SQLAlchemyError):
            self._engine.dispose()


def _pg_where(url: str, schema: str) -> str:
    parsed = make_url(url)
    where = f"{parsed.host or 'localhost'}{f':{parsed.port}' if parsed.port else ''}"
    return f"the PostgreSQL database {parsed.database} at {where} (schema {schema})"


def _pg_holder(conn: Connection, key: int) -> str:
    row = conn.execute(
        text(
            "SELECT a.pid, a.application_name, host(a.client_addr) AS addr"
            " FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.granted AND l.classid::bigint = :c"
            " AND l.objid::bigint = :k AND l.objsubid = 2"
            " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ),
        {"c": PG_LOCK_CLASS, "k": key},
    ).first()
    if row is None:
        return "it is just stopping"
    if row.application_name is None:
        name = "its details are hidden from this database user"
    else:
        name = row.application_name or "a session without an application_name"
    source = f" from {row.addr}" if row.addr else ""
    return f"{name} (PostgreSQL backend pid {row.pid}{source})"
