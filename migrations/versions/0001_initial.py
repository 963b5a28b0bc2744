"""Initial schema: jobs, job events, allocations, nodes.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
STATES = (
    "'pending', 'held', 'running', 'completed', 'failed', 'cancelled', 'timeout', "
    "'preempted', 'node_fail', 'out_of_memory'"
)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("user", sa.String(64), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("qos", sa.String(64), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_mem", sa.BigInteger(), nullable=True),
        sa.Column("cpus", sa.Integer(), nullable=False),
        sa.Column("mem", sa.BigInteger(), nullable=True),
        sa.Column("time_limit", sa.Integer(), nullable=True),
        sa.Column("submit_time", sa.Float(), nullable=False),
        sa.Column("start_time", sa.Float(), nullable=True),
        sa.Column("end_time", sa.Float(), nullable=True),
        sa.Column("node", sa.String(128), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("signal", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("stop_state", sa.String(16), nullable=True),
        sa.Column("stop_reason", sa.Text(), nullable=True),
        sa.Column("requeue_count", sa.Integer(), nullable=False),
        sa.Column("array_job_id", sa.BigInteger(), nullable=True),
        sa.Column("array_task_id", sa.Integer(), nullable=True),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.CheckConstraint(f"state IN ({STATES})", name=op.f("ck_jobs_state")),
    )
    op.create_index("ix_jobs_pending_order", "jobs", ["state", sa.text("priority DESC"), "id"])
    op.create_index("ix_jobs_user_state", "jobs", ["user", "state"])
    op.create_index("ix_jobs_array_job_id", "jobs", ["array_job_id"])

    op.create_table(
        "job_events",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("from_state", sa.String(16), nullable=True),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_job_events"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_events_job_id_jobs"),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id", "id"])

    op.create_table(
        "allocations",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("unit", sa.String(96), nullable=False),
        sa.Column("live", sa.Boolean(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("released_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_allocations"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_allocations_job_id_jobs"),
    )
    op.create_index(
        "uq_allocations_live_unit",
        "allocations",
        ["unit"],
        unique=True,
        sqlite_where=sa.text("live"),
        postgresql_where=sa.text("live"),
    )
    op.create_index("ix_allocations_job_id", "allocations", ["job_id"])

    op.create_table(
        "nodes",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("cpus", sa.Integer(), nullable=False),
        sa.Column("mem", sa.BigInteger(), nullable=False),
        sa.Column("fake", sa.Boolean(), nullable=False),
        sa.Column("units", sa.Text(), nullable=False),
        sa.Column("topology", sa.Text(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_nodes"),
    )
    # the planner needs statistics to prefer the partial and ordered indexes
    op.execute("ANALYZE")


def downgrade() -> None:
    op.drop_table("nodes")
    op.drop_table("allocations")
    op.drop_table("job_events")
    op.drop_table("jobs")
