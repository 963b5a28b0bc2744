"""Job evidence (issue 26): what each node's agent sent with the end of a job that did not
complete, its peak host memory and its output's tail, for `gpuq diagnose`.

Revision ID: 0016_diagnose
Revises: 0015_history
Create Date: 2026-12-20
"""

import sqlalchemy as sa
from alembic import op

revision = "0016_diagnose"
down_revision = "0015_history"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_evidence",
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("peak_mem", sa.BigInteger(), nullable=False),
        sa.Column("output_tail", sa.Text(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_evidence_job_id_jobs"),
        sa.PrimaryKeyConstraint("job_id", "node", name="pk_job_evidence"),
    )


def downgrade() -> None:
    op.drop_table("job_evidence")
