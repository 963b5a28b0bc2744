"""Compact arrays: an array's record stands for its tasks that have not started on their own.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # nullable, no default: a plain ADD COLUMN on both SQLite and PostgreSQL (no table copy)
    op.add_column("jobs", sa.Column("array_tasks", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("array_tasks")
