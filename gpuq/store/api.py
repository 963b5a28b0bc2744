"""The job store: the only code that touches the database.

Reads are methods of `Store`. Every write happens inside `Store.transaction()`, whose `StoreTx`
checks each state change against the transition table and appends its event row in the same
transaction; anything it refuses raises and rolls the whole transaction back, so a caller that
batches (the coordinator does, under load) gets all of a batch or none of it.

Both are front doors only: their methods live in one module per thing stored (job_reads,
job_submissions, job_transitions, node_rows, accounting_rows, gpu_history_rows, evidence_rows,
outbox_rows, cron_rows, token_rows), mixed in here so that callers see one API,
`store.list_jobs(...)`, `tx.transition(...)`, whatever the table behind it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import Connection

from gpuq.store.accounting_rows import AccountingReads, AccountingWrites
from gpuq.store.cron_rows import CronReads, CronWrites
from gpuq.store.engine import WRITE, make_engine
from gpuq.store.evidence_rows import EvidenceReads, EvidenceWrites
from gpuq.store.gpu_history_rows import GpuHistoryReads, GpuHistoryWrites
from gpuq.store.job_reads import JobReads
from gpuq.store.job_submissions import JobSubmissions
from gpuq.store.job_transitions import JobTransitions
from gpuq.store.migrate import upgrade
from gpuq.store.node_rows import NodeReads, NodeWrites
from gpuq.store.outbox_rows import OutboxReads, OutboxWrites
from gpuq.store.token_rows import TokenReads, TokenWrites


class Store(
    JobReads,
    NodeReads,
    AccountingReads,
    GpuHistoryReads,
    EvidenceReads,
    OutboxReads,
    CronReads,
    TokenReads,
):
    """The reads, each on a connection of its own, and the one way to write: `transaction()`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @classmethod
    def open(cls, url: str, *, sqlite_synchronous: str = "NORMAL") -> Store:
        """Connect and migrate to the newest schema (harmless when already there)."""
        engine = make_engine(url, sqlite_synchronous=sqlite_synchronous)
        upgrade(engine)
        return cls(engine)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def transaction(self) -> Iterator[StoreTx]:
        with self.engine.connect().execution_options(**WRITE) as conn, conn.begin():
            yield StoreTx(conn)


class StoreTx(
    JobSubmissions,
    JobTransitions,
    NodeWrites,
    AccountingWrites,
    GpuHistoryWrites,
    EvidenceWrites,
    OutboxWrites,
    CronWrites,
    TokenWrites,
):
    """The write operations, all within one transaction."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        # jobs this transaction has read (and locked), as it has since changed them: a write
        # that checks states and then changes them reads each row once
        self._rows: dict[int, dict[str, Any]] = {}
