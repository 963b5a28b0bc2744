"""Accounting: each user's fair-share usage, what each start of a job measured (telemetry) and
its downsampled series, and the usage report summed by the database.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, and_, bindparam, case, delete, func, insert, select, update
from sqlalchemy.engine import Connection

from gpuq.domain.model import JobTelemetry, SeriesPoint, UsageRow
from gpuq.domain.states import JobState
from gpuq.store.history_terms import ENDED, ended_since, states_term
from gpuq.store.tables import job_series, job_telemetry, jobs, upsert, usage


class AccountingReads:
    """The accounting reads of `gpuq.store.api.Store`."""

    engine: Engine

    def usage(self) -> dict[str, tuple[float, float]]:
        """Each user's fair-share GPU-seconds and when they were last decayed."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(usage)).all()
        return {row.user: (row.gpu_seconds, row.updated_at) for row in rows}

    def series(self, job_id: int) -> list[SeriesPoint]:
        """A job's downsampled series (VRAM and utilisation over time), oldest first."""
        stmt = (
            select(job_series)
            .where(job_series.c.job_id == job_id)
            .order_by(job_series.c.at, job_series.c.id)
        )
        with self.engine.connect() as conn:
            return [
                SeriesPoint(row.job_id, row.at, row.gpu_mem, row.util) for row in conn.execute(stmt)
            ]

    def usage_report(self, user: str | None = None, since: float | None = None) -> list[UsageRow]:
        """Per user, over the jobs that ran and ended (ending at or after `since`): GPU-seconds
        (GPUs held x run time), energy and GPU-second-weighted mean utilisation of the jobs
        that measured them; summed by the database, users in name order."""
        held = jobs.c.gpus * (jobs.c.end_time - jobs.c.start_time)
        known = job_telemetry.c.util_mean.is_not(None)
        stmt = (
            select(
                jobs.c.user,
                func.count(),
                func.sum(held),
                func.sum(job_telemetry.c.energy),
                func.sum(case((known, job_telemetry.c.util_mean * held), else_=None)),
                func.sum(case((known, held), else_=None)),
            )
            .select_from(jobs.outerjoin(job_telemetry, _TELEMETRY_OF_CURRENT_START))
            .where(
                and_(
                    states_term(ENDED, by_user=user is not None),
                    jobs.c.start_time.is_not(None),
                    jobs.c.end_time.is_not(None),
                )
            )
            .group_by(jobs.c.user)
            .order_by(jobs.c.user)
        )
        if user is not None:
            stmt = stmt.where(jobs.c.user == user)
        if since is not None:
            stmt = stmt.where(ended_since(since, self.engine.dialect.name))
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        return [
            UsageRow(
                user=name,
                jobs=int(count),
                gpu_seconds=float(seconds or 0.0),
                energy=None if energy is None else float(energy),
                util_mean=float(weighted) / float(covered)
                if weighted is not None and covered
                else None,
                util_gpu_seconds=float(covered or 0.0),
            )
            for name, count, seconds, energy, weighted, covered in rows
        ]

    def run_times(
        self, users: Sequence[str], names: Sequence[str], since: float, per_pair: int
    ) -> list[tuple[str, str, float]]:
        """(user, name, seconds) of completed jobs of these users and names that ended at or
        after `since`: the latest `per_pair` of each (user, name), newest first (the estimated
        start of a job without --time, gpuq.domain.right_sizing). By user and state first
        (ix_jobs_user_state), so a long history is never scanned whole."""
        if not users or not names:
            return []
        ranked = (
            select(
                jobs.c.user,
                jobs.c.name,
                (jobs.c.end_time - jobs.c.start_time).label("seconds"),
                func.row_number()
                .over(partition_by=(jobs.c.user, jobs.c.name), order_by=jobs.c.end_time.desc())
                .label("rank"),
            )
            .where(
                and_(
                    jobs.c.user.in_(sorted(set(users))),
                    jobs.c.state == JobState.COMPLETED.value,
                    jobs.c.name.in_(sorted(set(names))),
                    jobs.c.end_time >= since,
                    jobs.c.start_time.is_not(None),
                )
            )
            .subquery()
        )
        stmt = (
            select(ranked.c.user, ranked.c.name, ranked.c.seconds)
            .where(ranked.c.rank <= per_pair)
            .order_by(ranked.c.user, ranked.c.name, ranked.c.rank)
        )
        with self.engine.connect() as conn:
            return [(u, n, float(s)) for u, n, s in conn.execute(stmt)]


class AccountingWrites:
    """The accounting writes of `gpuq.store.api.StoreTx`, within its transaction."""

    conn: Connection

    def set_usage(self, user: str, gpu_seconds: float, at: float) -> None:
        values = {"b_user": user, "b_gpu_seconds": gpu_seconds, "b_updated_at": at}
        if self.conn.execute(_UPDATE_USAGE, values).rowcount == 0:
            self.conn.execute(_INSERT_USAGE, values)

    def set_telemetry(self, job_id: int, attempt: int, telemetry: JobTelemetry) -> None:
        """Keep what start `attempt` of a job measured (replacing what was kept before)."""
        self.set_telemetries([(job_id, attempt, telemetry)])

    def set_telemetries(self, measured: Sequence[tuple[int, int, JobTelemetry]]) -> None:
        """set_telemetry for many jobs (the ends one group commit records) in one statement."""
        rows = {job_id: _telemetry_row(attempt, t) for job_id, attempt, t in measured}
        if not rows:
            return
        new = [{"job_id": i, **row} for i, row in rows.items()]
        self.conn.execute(upsert(job_telemetry, self.conn.dialect.name), new)

    def add_series(self, points: Sequence[SeriesPoint], cap: int) -> None:
        """Append points to jobs' series; a job past `cap` points loses every second one of
        its older half (so a long run keeps its whole span, coarser further back)."""
        if not points:
            return
        self.conn.execute(
            insert(job_series),
            [
                {"job_id": p.job_id, "at": p.at, "gpu_mem": p.gpu_mem, "util": p.util}
                for p in points
            ],
        )
        wanted = sorted({p.job_id for p in points})
        over = self.conn.execute(
            select(job_series.c.job_id)
            .where(job_series.c.job_id.in_(wanted))
            .group_by(job_series.c.job_id)
            .having(func.count() > cap)
        ).scalars()
        for job_id in list(over):
            ids = self.conn.execute(
                select(job_series.c.id)
                .where(job_series.c.job_id == job_id)
                .order_by(job_series.c.at, job_series.c.id)
            ).scalars()
            older = list(ids)
            older = older[: len(older) // 2]
            self.conn.execute(delete(job_series).where(job_series.c.id.in_(older[1::2])))


_UPDATE_USAGE = (
    update(usage)
    .where(usage.c.user == bindparam("b_user"))
    .values(gpu_seconds=bindparam("b_gpu_seconds"), updated_at=bindparam("b_updated_at"))
)
_INSERT_USAGE = insert(usage).values(
    user=bindparam("b_user"),
    gpu_seconds=bindparam("b_gpu_seconds"),
    updated_at=bindparam("b_updated_at"),
)


_TELEMETRY_OF_CURRENT_START = and_(
    job_telemetry.c.job_id == jobs.c.id,
    job_telemetry.c.attempt == func.coalesce(jobs.c.start_count, 0),
)


def _telemetry_row(attempt: int, telemetry: JobTelemetry) -> dict[str, Any]:
    units = [
        {
            "uuid": u.uuid,
            "peak_mem": u.peak_mem,
            "util_mean": u.util_mean,
            "util_p95": u.util_p95,
            "energy": u.energy,
        }
        for u in telemetry.units
    ]
    return {
        "attempt": attempt,
        "peak_gpu_mem": telemetry.peak_gpu_mem,
        "util_mean": telemetry.util_mean,
        "util_p95": telemetry.util_p95,
        "energy": telemetry.energy,
        "samples": telemetry.samples,
        "seconds": telemetry.seconds,
        "units": json.dumps(units, separators=(",", ":")),
    }
