"""The notifications outbox: mails and webhooks waiting to be sent or retried, kept in the
store so that a coordinator's crash or restart does not lose them (gpuq.coordinator.notifier).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# as gpuq.store.tables: SQLite only aliases rowid for a column typed exactly INTEGER
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "notifications",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("trusted", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_at", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_notifications"),
    )
    op.create_index("ix_notifications_next_at", "notifications", ["next_at"])


def downgrade() -> None:
    op.drop_index("ix_notifications_next_at", "notifications")
    op.drop_table("notifications")
