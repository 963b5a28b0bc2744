"""Per-user tokens: how a user on another machine proves who they are over TCP (an admin issues
them with `gpuq admin token USER`). Only a token's SHA-256 is kept: the store never holds one
that could be replayed.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "user_tokens",
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("user", sa.String(64), nullable=False),
        sa.Column("created_by", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("digest", name="pk_user_tokens"),
    )
    op.create_index("ix_user_tokens_user", "user_tokens", ["user"])


def downgrade() -> None:
    op.drop_index("ix_user_tokens_user", "user_tokens")
    op.drop_table("user_tokens")
