"""Fair-share usage per user, and recurring submissions (gpuq cron).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "usage",
        sa.Column("user", sa.String(64), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("user", name="pk_usage"),
    )
    op.create_table(
        "cron_entries",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("user", sa.String(64), nullable=False),
        sa.Column("schedule", sa.String(128), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_fire", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_cron_entries"),
    )


def downgrade() -> None:
    op.drop_table("cron_entries")
    op.drop_table("usage")
