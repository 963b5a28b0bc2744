"""Bring a database to the newest schema; run by the coordinator at every start.

All revisions run in one explicit transaction (SQLite and PostgreSQL both have transactional
DDL), under a lock that serialises two coordinators starting at once: `BEGIN IMMEDIATE` on
SQLite, an advisory lock on PostgreSQL. At head, it is a no-op.
"""

from __future__ import annotations

from importlib.resources import files

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from gpuq.store.engine import WRITE

_PG_LOCK_KEY = 0x67707571  # "gpuq"


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(files("gpuq.migrations")))
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    config = alembic_config()
    with engine.connect().execution_options(**WRITE) as conn, conn.begin():
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_LOCK_KEY})")
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()
