"""Drains: an admin takes a node, or one GPU unit of it, out of service (gpuq drain) until
gpuq resume; kept here so that it survives a coordinator restart.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "drains",
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("unit", sa.String(96), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("by", sa.String(64), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("node", "unit", name="pk_drains"),
    )


def downgrade() -> None:
    op.drop_table("drains")
