"""Indexes for two reads that grew with the whole history (the siblings of 0017):

- jobs (end_time): everyone's jobs that ended in a window (the dashboard's GPU history page
  asks it on every view, sacct -a, report --since, history --since) read every ended job:
  ~105 ms on SQLite at 200,000 ended jobs; a range of the window with it.
- allocations (unit, live): every start asks whether its units are live, and that read
  every allocation ever made (21 ms on SQLite at 200,000, inside the write transaction).

Revision ID: 0018_history_windows
Revises: 0017_ended_by_user
Create Date: 2026-12-02
"""

from alembic import op

revision = "0018_history_windows"
down_revision = "0017_ended_by_user"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_end_time", "jobs", ["end_time"])
    op.create_index("ix_allocations_unit_live", "allocations", ["unit", "live"])


def downgrade() -> None:
    op.drop_index("ix_allocations_unit_live", table_name="allocations")
    op.drop_index("ix_jobs_end_time", table_name="jobs")
