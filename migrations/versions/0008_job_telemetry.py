"""Per-job GPU telemetry (issue 12): a job's measured aggregates (peak VRAM, utilisation,
energy, per unit as JSON) and a downsampled series of its VRAM and utilisation for plotting.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# as gpuq.store.tables: SQLite only aliases rowid for a column typed exactly INTEGER
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "job_telemetry",
        sa.Column("job_id", Id, nullable=False, autoincrement=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("peak_gpu_mem", sa.BigInteger(), nullable=False),
        sa.Column("util_mean", sa.Float(), nullable=True),
        sa.Column("util_p95", sa.Float(), nullable=True),
        sa.Column("energy", sa.Float(), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("units", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_job_telemetry"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_telemetry_job_id_jobs"),
    )
    op.create_table(
        "job_series",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("gpu_mem", sa.BigInteger(), nullable=False),
        sa.Column("util", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_job_series"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_series_job_id_jobs"),
    )
    op.create_index("ix_job_series_job_id_at", "job_series", ["job_id", "at"])


def downgrade() -> None:
    op.drop_index("ix_job_series_job_id_at", "job_series")
    op.drop_table("job_series")
    op.drop_table("job_telemetry")
