"""Dashboard credentials that must stay refused across restarts (issue 23): used sign-in
tickets and signed-out sessions, each by the SHA-256 of its kind and nonce (never the
credential itself), until it would have expired anyway; expired rows are pruned as new ones
are written.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "revoked_web_credentials",
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("digest", name="pk_revoked_web_credentials"),
    )
    op.create_index(
        "ix_revoked_web_credentials_expires_at", "revoked_web_credentials", ["expires_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_revoked_web_credentials_expires_at", "revoked_web_credentials")
    op.drop_table("revoked_web_credentials")
