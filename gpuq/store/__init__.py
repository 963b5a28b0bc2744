"""Persistence only: tables, migrations and the one store API (gpuq.store.api)."""
