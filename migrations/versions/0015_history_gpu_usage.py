"""Per-GPU history (issue 26): what each job did on each GPU unit in each 5-minute bucket,
for the dashboard's heat map; pruned past [coordinator] gpu_history_days.

Revision ID: 0015_history
Revises: 0014
Create Date: 2026-12-10
"""

import sqlalchemy as sa
from alembic import op

revision = "0015_history"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpu_usage",
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("unit", sa.String(96), nullable=False),
        sa.Column("at", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("job_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("user", sa.String(64), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("util_sum", sa.Float(), nullable=False),
        sa.Column("util_samples", sa.Integer(), nullable=False),
        sa.Column("peak_mem", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("node", "unit", "at", "job_id", name="pk_gpu_usage"),
    )
    op.create_index("ix_gpu_usage_at", "gpu_usage", ["at"])


def downgrade() -> None:
    op.drop_index("ix_gpu_usage_at", "gpu_usage")
    op.drop_table("gpu_usage")
