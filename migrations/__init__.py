"""Alembic migrations of the job store; shipped inside the wheel as gpuq.migrations."""
