"""MPS shares (issue 12): several shares of one shared GPU may be allocated at once.

`allocations.shared` marks a share's row; the partial unique index that stops a unit from
being allocated twice now covers whole allocations only (the store checks that a share never
joins a unit held whole, nor a whole job a unit with live shares).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NOT NULL with a constant default: a plain ADD COLUMN on SQLite and PostgreSQL
    op.add_column(
        "allocations",
        sa.Column("shared", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.drop_index("uq_allocations_live_unit", "allocations")
    op.create_index(
        "uq_allocations_live_unit",
        "allocations",
        ["unit"],
        unique=True,
        sqlite_where=sa.text("live AND NOT shared"),
        postgresql_where=sa.text("live AND NOT shared"),
    )


def downgrade() -> None:
    op.drop_index("uq_allocations_live_unit", "allocations")
    op.create_index(
        "uq_allocations_live_unit",
        "allocations",
        ["unit"],
        unique=True,
        sqlite_where=sa.text("live"),
        postgresql_where=sa.text("live"),
    )
    with op.batch_alter_table("allocations") as batch:
        batch.drop_column("shared")
