"""Per-GPU history (table gpu_usage, gpuq.domain.gpu_history): buckets written once each is
over, summed into a map's columns by the database (so a week's read is the map's size, not the
week's buckets), pruned past the retention; and the GPU time each user held in a range, as the
dashboard's per-user table counts it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine, and_, case, delete, func, select, tuple_, update
from sqlalchemy.engine import Connection

from gpuq.domain.gpu_history import Frame, UnitUse
from gpuq.store.history_terms import ENDED, ended_since, states_term
from gpuq.store.tables import gpu_usage, jobs


class GpuHistoryReads:
    """The per-GPU history reads of `gpuq.store.api.Store`."""

    engine: Engine

    def gpu_history(self, frame: Frame) -> list[UnitUse]:
        """The buckets within `frame`, summed per unit, column and job (each UnitUse at its
        column's start)."""
        column = (gpu_usage.c.at - frame.start) // frame.width
        stmt = (
            select(
                gpu_usage.c.node,
                gpu_usage.c.unit,
                column.label("column"),
                gpu_usage.c.job_id,
                func.max(gpu_usage.c.user),
                func.sum(gpu_usage.c.samples),
                func.sum(gpu_usage.c.util_sum),
                func.sum(gpu_usage.c.util_samples),
                func.max(gpu_usage.c.peak_mem),
            )
            .where(
                gpu_usage.c.at >= frame.start,
                gpu_usage.c.at < frame.start + frame.columns * frame.width,
            )
            .group_by(gpu_usage.c.node, gpu_usage.c.unit, column, gpu_usage.c.job_id)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        return [
            UnitUse(
                node,
                unit,
                frame.start + int(index) * frame.width,
                int(job_id),
                user,
                int(samples),
                float(util_sum),
                int(util_samples),
                int(peak),
            )
            for node, unit, index, job_id, user, samples, util_sum, util_samples, peak in rows
        ]

    def held_seconds(self, since: float) -> dict[str, float]:
        """Per user, GPU-seconds their ended jobs held from `since` on (GPUs x the part of
        the run after `since`, as `gpuq report` counts GPUs); running jobs are memory's."""
        start = case((jobs.c.start_time < since, since), else_=jobs.c.start_time)
        stmt = (
            select(jobs.c.user, func.sum(jobs.c.gpus * (jobs.c.end_time - start)))
            .where(
                states_term(ENDED, by_user=False),
                jobs.c.start_time.is_not(None),
                ended_since(since, self.engine.dialect.name),
                jobs.c.gpus > 0,
            )
            .group_by(jobs.c.user)
        )
        with self.engine.connect() as conn:
            return {user: float(seconds or 0.0) for user, seconds in conn.execute(stmt)}


class GpuHistoryWrites:
    """The per-GPU history writes of `gpuq.store.api.StoreTx`, within its transaction."""

    conn: Connection

    def add_gpu_usage(self, uses: Sequence[UnitUse]) -> None:
        """Keep buckets; one already kept (a part written when a coordinator stopped) takes
        the new part's figures added."""
        if not uses:
            return
        keys = [(u.node, u.uuid, u.at, u.job_id) for u in uses]
        key_columns = tuple_(gpu_usage.c.node, gpu_usage.c.unit, gpu_usage.c.at, gpu_usage.c.job_id)
        kept: set[tuple[str, str, int, int]] = set()
        for chunk in range(0, len(keys), 500):
            found = self.conn.execute(
                select(
                    gpu_usage.c.node, gpu_usage.c.unit, gpu_usage.c.at, gpu_usage.c.job_id
                ).where(key_columns.in_(keys[chunk : chunk + 500]))
            ).all()
            kept |= {(n, u, int(a), int(j)) for n, u, a, j in found}
        new = [u for u, key in zip(uses, keys, strict=True) if key not in kept]
        if new:
            self.conn.execute(gpu_usage.insert(), [_row(u) for u in new])
        for use, key in zip(uses, keys, strict=True):
            if key in kept:
                c = gpu_usage.c
                where = and_(c.node == key[0], c.unit == key[1], c.at == key[2], c.job_id == key[3])
                self.conn.execute(
                    update(gpu_usage)
                    .where(where)
                    .values(
                        samples=c.samples + use.samples,
                        util_sum=c.util_sum + use.util_sum,
                        util_samples=c.util_samples + use.util_samples,
                        peak_mem=case((c.peak_mem < use.peak_mem, use.peak_mem), else_=c.peak_mem),
                    )
                )

    def prune_gpu_usage(self, before: float) -> int:
        """Drop the buckets that started before `before`; how many went."""
        return int(self.conn.execute(delete(gpu_usage).where(gpu_usage.c.at < before)).rowcount)


def _row(use: UnitUse) -> dict[str, object]:
    return {
        "node": use.node,
        "unit": use.uuid,
        "at": use.at,
        "job_id": use.job_id,
        "user": use.user,
        "samples": use.samples,
        "util_sum": use.util_sum,
        "util_samples": use.util_samples,
        "peak_mem": use.peak_mem,
    }
