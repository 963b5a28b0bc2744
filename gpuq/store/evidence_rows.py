"""Job evidence: what each node's agent sent with the end of a job: its peak host memory (for
`gpuq eff`), and, for a job that did not complete, its output's tail (for `gpuq diagnose`,
gpuq.domain.diagnosis). One row a job and node; a later start's end replaces it, so a job
keeps at most one row per node."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.engine import Connection

from gpuq.domain.diagnosis import EndEvidence
from gpuq.store.tables import job_evidence, upsert

MAX_OUTPUT_TAIL = 32 << 10  # characters of a tail kept (an agent sends at most 16 KiB)


class EvidenceReads:
    """The evidence reads of `gpuq.store.api.Store`."""

    engine: Engine

    def end_evidence(self, job_id: int) -> list[EndEvidence]:
        """What the job's nodes sent with its ends, by node name."""
        stmt = select(job_evidence).where(job_evidence.c.job_id == job_id)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt.order_by(job_evidence.c.node)).all()
        return [EndEvidence(r.node, r.attempt, r.peak_mem, r.output_tail) for r in rows]


class EvidenceWrites:
    """The evidence writes of `gpuq.store.api.StoreTx`."""

    conn: Connection
    # StoreTx's read of job rows under its lock, kept for the transaction (job_transitions)
    _lock_jobs: Callable[[Iterable[int]], dict[int, dict[str, Any]]]

    def keep_evidence(self, items: Sequence[tuple[int, EndEvidence]], now: float) -> int:
        """Keep each (job id, what a node sent) in place of that node's earlier row for the
        job; only for the job's latest start (attempt 0: unknown, taken as it) on a node it
        ran on: a node never leaves evidence on another node's job. How many were kept.
        The jobs' rows are read through the transaction's lock (and kept there), so the end
        that comes with the evidence, in the same transaction, reads them no more."""
        if not items:
            return 0
        ran = {
            job_id: (
                set(row["nodes"].split(",")) if row["nodes"] else {row["node"]},
                row["start_count"] or 0,
            )
            for job_id, row in self._lock_jobs(job_id for job_id, _ in items).items()
        }

        def known(job_id: int, e: EndEvidence) -> bool:
            nodes, starts = ran.get(job_id, (set(), -1))
            return e.node in nodes and e.attempt in (0, starts)

        rows = {
            (job_id, e.node): {
                "job_id": job_id,
                "node": e.node,
                "attempt": e.attempt,
                "peak_mem": max(0, min(e.peak_mem, 2**62)),
                # PostgreSQL's text holds no NUL
                "output_tail": e.output_tail[-MAX_OUTPUT_TAIL:].replace("\x00", ""),
                "at": now,
            }
            for job_id, e in items
            if known(job_id, e)
        }
        if not rows:
            return 0
        self.conn.execute(upsert(job_evidence, self.conn.dialect.name), list(rows.values()))
        return len(rows)
