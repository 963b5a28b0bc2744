"""Migrations give exactly the schema of gpuq.store.tables, and re-running them is harmless."""

from __future__ import annotations

import re
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, text

from gpuq.store import migrate
from gpuq.store.api import Store
from gpuq.store.engine import make_engine
from gpuq.store.tables import metadata


def dump_schema(engine: Engine) -> list[tuple[Any, ...]]:
    """Every table, column, index and constraint definition as the database reports it."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            rows = conn.execute(
                text(
                    "SELECT type, name, sql FROM sqlite_master "
                    "WHERE name NOT LIKE 'sqlite_%' AND name != 'alembic_version' ORDER BY name"
                )
            ).all()
            return [(t, n, re.sub(r"\s+", " ", s or "").strip()) for t, n, s in rows]
        schema = conn.execute(text("SELECT current_schema()")).scalar_one()
        columns = conn.execute(
            text(
                "SELECT table_name, column_name, data_type, is_nullable, column_default, "
                "character_maximum_length FROM information_schema.columns "
                "WHERE table_schema = :s AND table_name != 'alembic_version' "
                "ORDER BY table_name, column_name"
            ),
            {"s": schema},
        ).all()
        indexes = conn.execute(
            text(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = :s "
                "AND tablename != 'alembic_version' ORDER BY indexname"
            ),
            {"s": schema},
        ).all()
        constraints = conn.execute(
            text(
                "SELECT conname, pg_get_constraintdef(c.oid) FROM pg_constraint c "
                "JOIN pg_namespace n ON n.oid = c.connamespace "
                "WHERE n.nspname = :s AND conname != 'alembic_version_pkc' ORDER BY conname"
            ),
            {"s": schema},
        ).all()
        return [tuple(r) for r in (*columns, *indexes, *constraints)]


def test_upgrade_head_gives_exactly_the_table_definitions(store_url: str, tmp_path: object) -> None:
    migrated = make_engine(store_url)
    migrate.upgrade(migrated)
    with migrated.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True}
        )
        assert compare_metadata(context, metadata) == []
    migrated_schema = dump_schema(migrated)
    # the same database, emptied and rebuilt straight from the table definitions
    with migrated.begin() as conn:
        metadata.drop_all(conn)
        conn.execute(text("DROP TABLE alembic_version"))
        metadata.create_all(conn)
    assert dump_schema(migrated) == migrated_schema
    assert "uq_allocations_live_unit" in str(migrated_schema)  # the dump is not empty
    migrated.dispose()


def test_starting_twice_on_one_database_is_harmless(store_url: str) -> None:
    first = Store.open(store_url)
    with first.transaction() as tx:
        from helpers import make_spec

        from gpuq.store.records import NewJob

        [[job_id]] = tx.add_jobs([NewJob(make_spec("kept"), "alice", "normal", 0)], 1.0)
    first.close()
    second = Store.open(store_url)
    assert second.get_job(job_id).name == "kept"
    assert migrate.current_revision(second.engine) == migrate.head_revision()
    second.close()
