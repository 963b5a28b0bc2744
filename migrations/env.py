"""Alembic environment: always runs on a connection handed over by gpuq.store.migrate, inside the
transaction it opened, so a failed migration (SQLite batch ones included) leaves nothing behind."""

from alembic import context

from gpuq.store.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through gpuq.store.migrate.upgrade(engine)")

context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    transaction_per_migration=False,
)
with context.begin_transaction():
    context.run_migrations()
