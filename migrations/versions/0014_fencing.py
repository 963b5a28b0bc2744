"""Fencing and late reports (issue 23): each node's [agent] fence_time as its agent last
registered (the coordinator gives a silent node up no sooner than its fence has acted, across
coordinator restarts too; NULL: not said), and the starts given up with their silent node whose
ends that node may still report when it is back (a requeue to withdraw, or history to write).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("fence_time", sa.Float(), nullable=True))
    op.create_table(
        "given_up_starts",
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        # the start's nodes not yet heard from, comma-separated; `first`: where its script ran
        sa.Column("nodes", sa.Text(), nullable=False),
        sa.Column("first", sa.String(128), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt", name="pk_given_up_starts"),
    )
    op.create_index("ix_given_up_starts_at", "given_up_starts", ["at"])


def downgrade() -> None:
    op.drop_index("ix_given_up_starts_at", "given_up_starts")
    op.drop_table("given_up_starts")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("fence_time")
