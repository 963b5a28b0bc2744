"""Persistence only: tables, migrations and the one store API (gpuq.store.api)."""

from gpuq.store.api import JobQuery, JobStart, NewJob, StateChange, Store, StoreTx

__all__ = ["JobQuery", "JobStart", "NewJob", "StateChange", "Store", "StoreTx"]
