"""Reading jobs: one job, listings (`gpuq queue` / history filters done by the database), array
tasks and their states, the top of the queue, counts, a job's events, and which jobs a request
key made.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    Row,
    and_,
    bindparam,
    false,
    func,
    literal,
    or_,
    select,
    tuple_,
)
from sqlalchemy.engine import Connection

from gpuq.domain.array_specs import parse_indices
from gpuq.domain.codec import spec_from_dict
from gpuq.domain.model import Job, JobEvent, JobSpec, JobTelemetry, UnitTelemetry
from gpuq.domain.states import JobState
from gpuq.errors import NotFound
from gpuq.store.history_terms import ended_since, states_term
from gpuq.store.records import JobQuery
from gpuq.store.row_mapping import job_from_row
from gpuq.store.tables import allocations, job_events, job_telemetry, jobs, submission_keys


class JobReads:
    """The job reads of `gpuq.store.api.Store`, each on a connection of its own."""

    engine: Engine

    def get_job(self, job_id: int) -> Job:
        found = self.list_jobs(JobQuery(job_ids=(job_id,)))
        if not found:
            raise NotFound(f"no job {job_id}")
        return found[0]

    def list_jobs(self, query: JobQuery) -> list[Job]:
        stmt = select(jobs)
        if query.states is not None:
            by_user = query.user is not None or query.users is not None
            stmt = stmt.where(states_term(query.states, by_user))
        if query.user is not None:
            stmt = stmt.where(jobs.c.user == query.user)
        if query.job_ids is not None:
            stmt = stmt.where(jobs.c.id.in_(query.job_ids))
        if query.array_job_id is not None:
            stmt = stmt.where(jobs.c.array_job_id == query.array_job_id)
        if query.node is not None:
            stmt = stmt.where(ran_on([query.node]))
        stmt = self._listing_filters(stmt, query)
        if query.array_job_id is not None:  # an array's tasks by index (its record first)
            index = func.coalesce(jobs.c.array_task_id, -1)
            if query.after is not None:
                task, job_id = query.after
                stmt = stmt.where(tuple_(index, jobs.c.id) > tuple_(task - 1, job_id))
            stmt = stmt.order_by(index, jobs.c.id)
        else:
            if query.after is not None:
                after = query.after[0]
                stmt = stmt.where(jobs.c.id < after if query.newest_first else jobs.c.id > after)
            stmt = stmt.order_by(jobs.c.id.desc() if query.newest_first else jobs.c.id)
        if query.limit is not None:
            stmt = stmt.limit(query.limit)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).all()
            units = _units_of(conn, [row.id for row in rows])
            specs = _specs_of(conn, rows)
            measured = _telemetry_of(conn, rows)
        return [
            job_from_row(row, units.get(row.id, ()), specs, measured.get(row.id)) for row in rows
        ]

    def _listing_filters(self, stmt: Any, query: JobQuery) -> Any:
        """The listing filters as SQL, so a history of millions is filtered (and limited) by
        the database, never loaded to be filtered here. Names: GLOB on SQLite (native),
        a POSIX regex on PostgreSQL (no GLOB there), both from one parse of the pattern."""
        from gpuq.domain.patterns import to_glob, to_posix_regex

        if query.users is not None:
            stmt = stmt.where(jobs.c.user.in_(sorted(set(query.users))))
        if query.nodes is not None:
            stmt = stmt.where(ran_on(sorted(set(query.nodes))))
        when = jobs.c.end_time if query.by_end else jobs.c.submit_time
        if query.since is not None and query.by_end:
            stmt = stmt.where(ended_since(query.since, self.engine.dialect.name))
        elif query.since is not None:
            stmt = stmt.where(when >= query.since)
        if query.until is not None:
            stmt = stmt.where(when < query.until)
        if query.names is not None:
            if self.engine.dialect.name == "sqlite":
                found = [jobs.c.name.op("GLOB")(to_glob(p)) for p in query.names]
            else:
                found = [jobs.c.name.op("~")(to_posix_regex(p)) for p in query.names]
            stmt = stmt.where(or_(*found)) if found else stmt.where(false())
        return stmt

    def find_task(self, array_job_id: int, task: int) -> Job | None:
        """Task `task` of the array: its own row, or the record that still stands for it."""
        with self.engine.connect() as conn:
            found = conn.execute(
                select(jobs.c.id).where(
                    and_(jobs.c.array_job_id == array_job_id, jobs.c.array_task_id == task)
                )
            ).first()
            record = conn.execute(
                select(jobs.c.array_tasks).where(
                    and_(jobs.c.id == array_job_id, jobs.c.array_job_id == array_job_id)
                )
            ).first()
        if found is not None:
            return self.get_job(found.id)
        if record is not None and record.array_tasks and task in parse_indices(record.array_tasks):
            return self.get_job(array_job_id)
        return None

    def array_states(self, array_job_ids: Sequence[int]) -> dict[int, dict[JobState, int]]:
        """How many tasks of each array are in each state (a record counts all it stands for)."""
        found: dict[int, dict[JobState, int]] = {}
        stmt = select(jobs.c.array_job_id, jobs.c.state, jobs.c.array_tasks).where(
            jobs.c.array_job_id.in_(bindparam("ids", expanding=True))
        )
        with self.engine.connect() as conn:
            for array, state, tasks in conn.execute(stmt, {"ids": list(array_job_ids)}):
                counts = found.setdefault(array, {})
                weight = len(parse_indices(tasks)) if tasks else 1
                counts[JobState(state)] = counts.get(JobState(state), 0) + weight
        return found

    def top_pending(self, limit: int) -> list[Job]:
        """The `limit` pending jobs of highest stored priority, oldest first among equals."""
        stmt = (
            select(jobs)
            .where(jobs.c.state == JobState.PENDING.value)
            .order_by(jobs.c.priority.desc(), jobs.c.id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).all()
            specs = _specs_of(conn, rows)
        return [job_from_row(row, (), specs) for row in rows]

    def count_jobs(self, states: Iterable[JobState]) -> dict[JobState, int]:
        stmt = (
            select(jobs.c.state, func.count())
            .where(jobs.c.state.in_([s.value for s in states]))
            .group_by(jobs.c.state)
        )
        with self.engine.connect() as conn:
            return {JobState(state): n for state, n in conn.execute(stmt)}

    def events(self, job_id: int) -> list[JobEvent]:
        stmt = select(job_events).where(job_events.c.job_id == job_id).order_by(job_events.c.id)
        with self.engine.connect() as conn:
            return [
                JobEvent(
                    job_id=row.job_id,
                    at=row.at,
                    from_state=JobState(row.from_state) if row.from_state else None,
                    to_state=JobState(row.to_state),
                    reason=row.reason,
                    cause=row.cause or "",
                )
                for row in conn.execute(stmt)
            ]

    def submitted(self, user: str, key: str) -> list[int] | None:
        """The ids of the submission `user` made with request key `key`; None if none (or its
        key has been purged)."""
        with self.engine.connect() as conn:
            job_id = conn.execute(_KEY_OWNER, {"user": user, "key": key}).scalar()
        return None if job_id is None else [job_id]


_KEY_OWNER = select(submission_keys.c.job_id).where(
    and_(
        submission_keys.c.user == bindparam("user"),
        submission_keys.c.key == bindparam("key"),
    )
)


def _units_of(conn: Connection, job_ids: list[int]) -> dict[int, tuple[str, ...]]:
    """Each job's GPU units from its latest allocation (live or not)."""
    if not job_ids:
        return {}
    latest: dict[int, tuple[float, list[str]]] = {}
    for chunk_start in range(0, len(job_ids), 5000):
        chunk = job_ids[chunk_start : chunk_start + 5000]
        stmt = (
            select(allocations.c.job_id, allocations.c.started_at, allocations.c.unit)
            .where(allocations.c.job_id.in_(chunk))
            .order_by(allocations.c.id)
        )
        for job_id, started_at, unit in conn.execute(stmt):
            seen = latest.get(job_id)
            if seen is None or started_at > seen[0]:
                latest[job_id] = (started_at, [unit])
            elif started_at == seen[0]:
                seen[1].append(unit)
    return {job_id: tuple(units) for job_id, (_, units) in latest.items()}


def _specs_of(conn: Connection, rows: Sequence[Row[Any]]) -> dict[int, JobSpec]:
    """The specs of these rows, each parsed once: a split task's is its array record's."""
    specs: dict[int, JobSpec] = {}
    wanted = {row.array_job_id for row in rows if not row.spec}
    for row in rows:
        if row.spec and row.id not in specs:
            specs[row.id] = spec_from_dict(json.loads(row.spec))
    missing = sorted(wanted - specs.keys())
    for start in range(0, len(missing), 5000):
        stmt = select(jobs.c.id, jobs.c.spec).where(jobs.c.id.in_(missing[start : start + 5000]))
        for job_id, text in conn.execute(stmt):
            specs[job_id] = spec_from_dict(json.loads(text))
    return specs


def _telemetry_of(conn: Connection, rows: Sequence[Row[Any]]) -> dict[int, JobTelemetry]:
    """What the current start of each of these jobs measured (the jobs that measured any)."""
    found: dict[int, JobTelemetry] = {}
    starts = {row.id: row.start_count or 0 for row in rows if row.start_time is not None}
    wanted = sorted(starts)
    for start in range(0, len(wanted), 5000):
        stmt = select(job_telemetry).where(job_telemetry.c.job_id.in_(wanted[start : start + 5000]))
        for t in conn.execute(stmt):
            if t.attempt != starts[t.job_id]:
                continue  # an earlier start's
            found[t.job_id] = JobTelemetry(
                peak_gpu_mem=t.peak_gpu_mem,
                util_mean=t.util_mean,
                util_p95=t.util_p95,
                energy=t.energy,
                samples=t.samples,
                seconds=t.seconds,
                units=tuple(UnitTelemetry(**u) for u in json.loads(t.units)),
            )
    return found


def ran_on(names: Sequence[str]) -> ColumnElement[bool]:
    """Jobs that run (ran) on any of these nodes: the first node, or one of a multi-node
    job's others (jobs.nodes, comma-separated)."""
    listed = literal(",") + jobs.c.nodes + literal(",")
    others = [listed.like(f"%,{_escaped(n)},%", escape="\\") for n in names]
    return or_(jobs.c.node.in_(list(names)), *others)


def _escaped(name: str) -> str:
    """A node name as a LIKE pattern matches it literally (`_` is a wildcard there)."""
    return name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
