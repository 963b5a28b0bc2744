"""Idempotent submission: (user, request key) -> the job the first request created.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "submission_keys",
        sa.Column("user", sa.String(64), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_submission_keys_job_id_jobs"),
        sa.PrimaryKeyConstraint("user", "key", name="pk_submission_keys"),
    )
    op.create_index("ix_submission_keys_created_at", "submission_keys", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_submission_keys_created_at", table_name="submission_keys")
    op.drop_table("submission_keys")
