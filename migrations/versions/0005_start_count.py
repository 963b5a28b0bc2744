"""Start count: each start of a job has an attempt number, so that reports and stops for an
earlier start are told apart from the current one's.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # nullable, no default: a plain ADD COLUMN on both SQLite and PostgreSQL (no table copy)
    op.add_column("jobs", sa.Column("start_count", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("start_count")
