"""Which failures are the store's (not the write's), and what to call them in one short phrase.

A storage error is one where the database could not be used: SQLite's disk is full or its file
cannot be written, PostgreSQL is down, refuses connections, or cannot extend a file. Trying the
same write again later may succeed. Integrity errors and gpuq's own errors are not storage
errors: they are the write's, and final.

`storage_cause` names the problem as a user can act on it ("disk full", "database
unreachable"); `storage_unavailable` is the StorageUnavailable a user's call ends with, e.g.
"storage unavailable: disk full (database or disk is full)".
"""

from __future__ import annotations

import sqlite3

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from gpuq.errors import StorageUnavailable

# (a phrase of the driver's message, lower case) -> the cause shown; the first match wins
_CAUSES: tuple[tuple[str, str], ...] = (
    ("database or disk is full", "disk full"),  # SQLite: SQLITE_FULL
    ("no space left on device", "disk full"),  # PostgreSQL (ENOSPC), any file write
    ("could not extend file", "disk full"),  # PostgreSQL: SQLSTATE 53100 disk_full
    ("disk quota exceeded", "disk full"),
    ("out of memory", "out of memory"),
    ("database is locked", "database busy"),  # SQLite: another process holds the lock
    ("readonly database", "database read-only"),
    ("read-only", "database read-only"),
    ("disk i/o error", "disk I/O error"),  # SQLite: SQLITE_IOERR
    ("unable to open database file", "database file cannot be opened"),
    ("connection refused", "database unreachable"),
    ("could not connect", "database unreachable"),
    ("connection failed", "database unreachable"),
    ("server closed the connection", "database unreachable"),
    ("terminating connection", "database unreachable"),
    ("connection is closed", "database unreachable"),
    ("connection reset", "database unreachable"),
    ("connection timed out", "database unreachable"),
    ("timeout expired", "database unreachable"),
    ("could not translate host name", "database unreachable"),
    ("no route to host", "database unreachable"),
    ("the database system is", "database unreachable"),  # starting up, shutting down, ...
    ("consuming input failed", "database unreachable"),
    ("ssl connection has been closed", "database unreachable"),
)
# the driver's own error classes that mean "the database", not "the statement"
_DRIVER_ERRORS = frozenset({"OperationalError", "InterfaceError"})
_DRIVERS = ("sqlite3", "psycopg", "psycopg2")


def is_storage_error(error: BaseException) -> bool:
    """The database went away or could not be used (not the write's fault): trying the same
    write again later may succeed. Integrity errors and gpuq's own errors are not."""
    if isinstance(error, OperationalError | InterfaceError | sqlite3.OperationalError):
        return True
    if isinstance(error, DBAPIError):
        return bool(error.connection_invalidated)
    return any(  # a DB-API error not wrapped by SQLAlchemy (psycopg's own)
        cls.__name__ in _DRIVER_ERRORS and cls.__module__.split(".")[0] in _DRIVERS
        for cls in type(error).__mro__
    )


def storage_error_line(error: BaseException) -> str:
    """The driver's own first line about the failure."""
    orig = getattr(error, "orig", None) or error
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    return lines[0] if lines else type(orig).__name__


def storage_cause(error: BaseException) -> str:
    """The store's problem in a few words: "disk full", "database unreachable", ...; else
    the driver's first line."""
    orig = getattr(error, "orig", None) or error
    text = str(orig).lower()
    for phrase, cause in _CAUSES:
        if phrase in text:
            return cause
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return "database unreachable"
    return storage_error_line(error)


def storage_unavailable(error: BaseException) -> StorageUnavailable:
    """What a user's call that a storage error ended answers: the cause, and the driver's
    line when it says more."""
    cause, line = storage_cause(error), storage_error_line(error)
    detail = f" ({line})" if line != cause else ""
    return StorageUnavailable(f"storage unavailable: {cause}{detail}")
