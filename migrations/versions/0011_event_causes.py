"""What caused each job event (issue 21): the request and who made it, an agent's report, a
scheduling pass or a chore, as `gpuq show` prints it. Events recorded before have none (NULL).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # nullable: a plain ADD COLUMN on SQLite and PostgreSQL; older events have none (NULL)
    op.add_column("job_events", sa.Column("cause", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_events") as batch:
        batch.drop_column("cause")
