"""Jobs that span nodes (issue 22): a start's nodes beyond one, the MASTER_PORT chosen for it,
and the secret its srun and step workers prove to each other. NULL for one-node starts made
before (their node is jobs.node, as ever).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # nullable: plain ADD COLUMNs on SQLite and PostgreSQL
    op.add_column("jobs", sa.Column("nodes", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("master_port", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("step_key", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("step_key")
        batch.drop_column("master_port")
        batch.drop_column("nodes")
