"""Persistence only: tables, migrations and the one store API (gpuq.store.api: the `Store` and
`StoreTx` front doors), with what they do kept in one module per thing stored and the request
and record types in gpuq.store.records."""
