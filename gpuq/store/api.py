"""The job store: the only code that touches the database.

Reads are methods of `Store`. Every write happens inside `Store.transaction()`, whose `StoreTx`
checks each state change against the transition table and appends its event row in the same
transaction; anything it refuses raises and rolls the whole transaction back, so a caller that
batches (the coordinator does, under load) gets all of a batch or none of it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    Engine,
    Row,
    and_,
    bindparam,
    case,
    delete,
    false,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from gpuq.domain.arrays import format_indices, parse_indices
from gpuq.domain.codec import spec_from_dict, spec_to_dict
from gpuq.domain.model import (
    Allocation,
    CronEntry,
    Drain,
    GpuUnit,
    Job,
    JobEvent,
    JobResult,
    JobSpec,
    JobTelemetry,
    Node,
    NodeState,
    SeriesPoint,
    UnitTelemetry,
    UsageRow,
)
from gpuq.domain.states import JobState, check_transition
from gpuq.errors import DoubleBooking, IllegalTransition, NotFound
from gpuq.store.engine import WRITE, make_engine
from gpuq.store.migrate import upgrade
from gpuq.store.records import (
    REQUEUABLE,
    JobEdit,
    JobQuery,
    JobStart,
    NewJob,
    Notification,
    StateChange,
)
from gpuq.store.tables import (
    allocations,
    cron_entries,
    drains,
    job_events,
    job_series,
    job_telemetry,
    jobs,
    nodes,
    notifications,
    submission_keys,
    usage,
    user_tokens,
)

SUBMITTED = "submitted"
_INSERT_JOB = insert(jobs).returning(jobs.c.id)
_INSERT_EVENT = insert(job_events)


class Store:
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

    # ---- reads -------------------------------------------------------------------------

    def get_job(self, job_id: int) -> Job:
        found = self.list_jobs(JobQuery(job_ids=(job_id,)))
        if not found:
            raise NotFound(f"no job {job_id}")
        return found[0]

    def list_jobs(self, query: JobQuery) -> list[Job]:
        stmt = select(jobs)
        if query.states is not None:
            stmt = stmt.where(jobs.c.state.in_(sorted(query.states)))
        if query.user is not None:
            stmt = stmt.where(jobs.c.user == query.user)
        if query.job_ids is not None:
            stmt = stmt.where(jobs.c.id.in_(query.job_ids))
        if query.array_job_id is not None:
            stmt = stmt.where(jobs.c.array_job_id == query.array_job_id)
        if query.node is not None:
            stmt = stmt.where(jobs.c.node == query.node)
        stmt = self._listing_filters(stmt, query)
        if query.array_job_id is not None:  # an array's tasks by index (its record first)
            stmt = stmt.order_by(func.coalesce(jobs.c.array_task_id, -1), jobs.c.id)
        else:
            stmt = stmt.order_by(jobs.c.id.desc() if query.newest_first else jobs.c.id)
        if query.limit is not None:
            stmt = stmt.limit(query.limit)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).all()
            units = _units_of(conn, [row.id for row in rows])
            specs = _specs_of(conn, rows)
            measured = _telemetry_of(conn, rows)
        return [
            _job_from_row(row, units.get(row.id, ()), specs, measured.get(row.id)) for row in rows
        ]

    def _listing_filters(self, stmt: Any, query: JobQuery) -> Any:
        """The listing filters as SQL, so a history of millions is filtered (and limited) by
        the database, never loaded to be filtered here. Names: GLOB on SQLite (native),
        a POSIX regex on PostgreSQL (no GLOB there), both from one parse of the pattern."""
        from gpuq.domain.patterns import to_glob, to_posix_regex

        if query.users is not None:
            stmt = stmt.where(jobs.c.user.in_(sorted(set(query.users))))
        if query.nodes is not None:
            stmt = stmt.where(jobs.c.node.in_(sorted(set(query.nodes))))
        when = jobs.c.end_time if query.by_end else jobs.c.submit_time
        if query.since is not None:
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
        return [_job_from_row(row, (), specs) for row in rows]

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
                )
                for row in conn.execute(stmt)
            ]

    def live_allocations(self) -> list[Allocation]:
        stmt = (
            select(allocations.c.job_id, allocations.c.node, allocations.c.unit)
            .where(allocations.c.live)
            .order_by(allocations.c.job_id, allocations.c.id)
        )
        grouped: dict[int, tuple[str, list[str]]] = {}
        with self.engine.connect() as conn:
            for job_id, node, unit in conn.execute(stmt):
                grouped.setdefault(job_id, (node, []))[1].append(unit)
        return [Allocation(job_id, node, tuple(units)) for job_id, (node, units) in grouped.items()]

    def units_used_on(self, node: str, job_ids: Iterable[int]) -> dict[int, frozenset[str]]:
        """Every unit each job was ever given on `node` (released or not): what a job that
        still runs there, unknown to the coordinator, may hold."""
        wanted = sorted(set(job_ids))
        found: dict[int, set[str]] = {}
        if not wanted:
            return {}
        stmt = select(allocations.c.job_id, allocations.c.unit).where(
            and_(allocations.c.node == node, allocations.c.job_id.in_(wanted))
        )
        with self.engine.connect() as conn:
            for job_id, unit in conn.execute(stmt):
                found.setdefault(int(job_id), set()).add(unit)
        return {job_id: frozenset(units) for job_id, units in found.items()}

    def list_nodes(self) -> list[Node]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(nodes).order_by(nodes.c.name)).all()
        return [_node_from_row(row) for row in rows]

    def usage(self) -> dict[str, tuple[float, float]]:
        """Each user's fair-share GPU-seconds and when they were last decayed."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(usage)).all()
        return {row.user: (row.gpu_seconds, row.updated_at) for row in rows}

    def submitted(self, user: str, key: str) -> list[int] | None:
        """The ids of the submission `user` made with request key `key`; None if none (or its
        key has been purged)."""
        with self.engine.connect() as conn:
            job_id = conn.execute(_KEY_OWNER, {"user": user, "key": key}).scalar()
        return None if job_id is None else [job_id]

    def drains(self) -> list[Drain]:
        """Every admin drain (gpuq drain), by node, the whole node's ("" unit) first."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(drains).order_by(drains.c.node, drains.c.unit)).all()
        return [Drain(row.node, row.unit, row.reason, row.by, row.at) for row in rows]

    def user_tokens(self) -> dict[str, str]:
        """Every per-user token's digest and its user."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(user_tokens.c.digest, user_tokens.c.user)).all()
        return {row.digest: row.user for row in rows}

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
                    jobs.c.state.in_([s.value for s in JobState if not s.is_live]),
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
            stmt = stmt.where(jobs.c.end_time >= since)
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

    def cron_entries(self) -> list[CronEntry]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(cron_entries).order_by(cron_entries.c.id)).all()
        return [
            CronEntry(
                row.id,
                row.user,
                row.schedule,
                spec_from_dict(json.loads(row.spec)),
                row.created_at,
                row.last_fire,
            )
            for row in rows
        ]

    def due_notifications(self, now: float, limit: int) -> list[Notification]:
        """Outbox rows whose next attempt is due (next_at <= now), oldest first, at most
        `limit`."""
        stmt = (
            select(notifications)
            .where(notifications.c.next_at <= now)
            .order_by(notifications.c.created_at, notifications.c.id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [
                Notification(
                    row.kind,
                    row.target,
                    bytes(row.body),
                    bool(row.trusted),
                    row.attempts,
                    row.next_at,
                    row.created_at,
                    row.id,
                )
                for row in conn.execute(stmt)
            ]

    def count_notifications(self) -> int:
        """Outbox rows waiting (due or not)."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(notifications)).scalar_one())


class StoreTx:
    """The write operations, all within one transaction."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        # jobs this transaction has read (and locked), as it has since changed them: a write
        # that checks states and then changes them reads each row once
        self._rows: dict[int, dict[str, Any]] = {}

    def add_jobs(self, new_jobs: Sequence[NewJob], now: float) -> list[list[int]]:
        """Insert submissions; ids per submission (a repeated request key: the first's)."""
        return [self.add_job(new, now)[0] for new in new_jobs]

    def add_job(self, new: NewJob, now: float) -> tuple[list[int], bool]:
        """Insert a submission; its ids, and False when its request key was used before by
        the same user (nothing is added then: the ids are those of that first submission).

        The key is kept in this same transaction, and its primary key decides a race: of two
        requests with one key, whichever commits second gets the first's ids."""
        ids = self._add_one(new, now)
        if new.key is None:
            return ids, True
        [job_id] = ids
        row = {"user": new.user, "key": new.key, "job_id": job_id, "created_at": now}
        owner = self.conn.execute(_CLAIM_KEY[self.conn.dialect.name], row).scalar_one()
        if owner == job_id:
            return ids, True
        # a repeat (rare: the coordinator remembers recent keys): take this job back out
        self.conn.execute(delete(job_events).where(job_events.c.job_id == job_id))
        self.conn.execute(delete(jobs).where(jobs.c.id == job_id))
        return [owner], False

    def purge_submission_keys(self, before: float) -> int:
        """Forget request keys first used before `before` (their jobs stay); how many."""
        result = self.conn.execute(
            delete(submission_keys).where(submission_keys.c.created_at < before)
        )
        return int(result.rowcount)

    def _add_one(self, new: NewJob, now: float) -> list[int]:
        """One row per submission: an array's row is its record, standing for every task
        until tasks are split off to run (`split_tasks`), as SLURM keeps one record."""
        state = JobState.HELD if new.spec.hold else JobState.PENDING
        row = _job_row(new, state, now)
        job_id = self.conn.execute(_INSERT_JOB, row).scalar_one()
        if new.spec.array is not None:
            tasks = new.spec.array.indices
            self.conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id)
                .values(
                    array_job_id=job_id,
                    array_task_id=tasks[0] if len(tasks) == 1 else None,
                    array_tasks=format_indices(tasks) if len(tasks) > 1 else None,
                )
            )
        self.conn.execute(_INSERT_EVENT, _event(job_id, now, None, state, SUBMITTED))
        return [job_id]

    def split_tasks(
        self, record_id: int, tasks: Sequence[int], now: float
    ) -> tuple[JobState, dict[int, int]]:
        """Give tasks of an array's record rows of their own, in the record's state (pending
        or held); that state and the job id of each task. The record keeps the rest, and when
        one task is left it becomes that task (a record always stands for one task or more)."""
        row = self.conn.execute(
            select(jobs).where(jobs.c.id == record_id).with_for_update()
        ).first()
        if row is None or not row.array_tasks or not JobState(row.state).is_live:
            raise NotFound(f"no array record {record_id} with tasks to split")
        remaining = parse_indices(row.array_tasks)
        wanted = set(tasks)
        if not wanted <= set(remaining):
            missing = sorted(wanted - set(remaining))
            raise NotFound(f"array {record_id} has no unstarted task {missing[0]}")
        left = [t for t in remaining if t not in wanted]
        split = sorted(wanted)
        if not left:
            left = [split.pop()]
        base = {
            c: getattr(row, c)
            for c in ("user", "name", "state", "qos", "priority", "gpus", "gpu_mem", "cpus")
        } | {
            "mem": row.mem,
            "time_limit": row.time_limit,
            "submit_time": row.submit_time,
            "reason": row.reason,
            "requeue_count": 0,
            "array_job_id": record_id,
            "spec": "",
            "array_tasks": None,
        }
        ids: dict[int, int] = {}
        if split:
            result = self.conn.execute(
                insert(jobs).returning(jobs.c.id, sort_by_parameter_order=True),
                [{**base, "array_task_id": t} for t in split],
            )
            ids = dict(zip(split, result.scalars(), strict=True))
            state = JobState(row.state)
            reason = f"array task split from {record_id}"
            events = [_event(i, now, None, state, reason) for i in ids.values()]
            self.conn.execute(_INSERT_EVENT, events)
        single = len(left) == 1
        self.conn.execute(
            update(jobs)
            .where(jobs.c.id == record_id)
            .values(
                array_tasks=None if single else format_indices(left),
                array_task_id=left[0] if single else None,
            )
        )
        if single:
            ids[left[0]] = record_id
        self._rows.pop(record_id, None)  # its columns changed under the cache
        return JobState(row.state), ids

    def transition(self, changes: Sequence[StateChange], now: float) -> None:
        """Apply state changes in order (a job may change twice, e.g. preempted then pending).

        Raises IllegalTransition or NotFound for the first change the table refuses; nothing
        of the transaction is kept then. Leaving running releases the job's GPUs.
        """
        if not changes:
            return
        rows = self._lock_jobs(c.job_id for c in changes)
        events: list[dict[str, Any]] = []
        released: set[int] = set()
        for change in changes:
            row = rows.get(change.job_id)
            if row is None:
                raise NotFound(f"no job {change.job_id}")
            if change.to_state is JobState.RUNNING:
                raise ValueError("a job starts only through start_jobs, with its placement")
            current = JobState(row["state"])
            check_transition(change.job_id, current, change.to_state)
            if current is JobState.RUNNING:
                released.add(change.job_id)
            _apply_change(row, current, change, now)
            events.append(_event(change.job_id, now, current, change.to_state, change.reason))
        touched = sorted({c.job_id for c in changes})
        self.conn.execute(
            _UPDATE_MUTABLE,
            [{"b_id": i, **{f"b_{c}": rows[i][c] for c in _MUTABLE}} for i in touched],
        )
        self.conn.execute(_INSERT_EVENT, events)
        if released:
            self.conn.execute(_RELEASE, {"ids": sorted(released), "now": now})

    def edit_jobs(self, edits: Sequence[JobEdit], now: float) -> None:
        """Rewrite waiting (pending or held) jobs' specs and the columns that mirror them, with
        one event each (its state unchanged), in one statement per table; all or none: a job
        that is gone raises NotFound, one that is no longer waiting IllegalTransition."""
        if not edits:
            return
        rows = self._lock_jobs(e.job_id for e in edits)
        events: list[dict[str, Any]] = []
        for edit in edits:
            row = rows.get(edit.job_id)
            if row is None:
                raise NotFound(f"no job {edit.job_id}")
            state = JobState(row["state"])
            if state not in (JobState.PENDING, JobState.HELD):
                raise IllegalTransition(edit.job_id, state.value, "an updated spec")
            events.append(_event(edit.job_id, now, state, state, edit.reason))
        self.conn.execute(_EDIT_JOB, [_edit_row(e) for e in edits])
        self.conn.execute(_INSERT_EVENT, events)

    def requeue_jobs(
        self, job_ids: Sequence[int], reason: str, now: float, *, hold: bool = False
    ) -> None:
        """Ended jobs back to the queue with the same ids (`gpuq requeue`): pending, or held
        with `hold`; requeue_count + 1, the last run's node, end and result cleared, an event
        per step. All or none: a job that is not ended raises IllegalTransition."""
        if not job_ids:
            return
        rows = self._lock_jobs(job_ids)
        events: list[dict[str, Any]] = []
        for job_id in job_ids:
            row = rows.get(job_id)
            if row is None:
                raise NotFound(f"no job {job_id}")
            current = JobState(row["state"])
            if current not in REQUEUABLE:
                raise IllegalTransition(job_id, current.value, JobState.PENDING.value)
            row.update(
                state=(JobState.HELD if hold else JobState.PENDING).value,
                reason=reason,
                requeue_count=row["requeue_count"] + 1,
                node=None,
                end_time=None,
                exit_code=None,
                signal=None,
                stop_state=None,
                stop_reason=None,
            )
            events.append(_event(job_id, now, current, JobState.PENDING, reason))
            if hold:
                events.append(_event(job_id, now, JobState.PENDING, JobState.HELD, reason))
        self.conn.execute(
            _UPDATE_MUTABLE,
            [{"b_id": i, **{f"b_{c}": rows[i][c] for c in _MUTABLE}} for i in sorted(set(job_ids))],
        )
        self.conn.execute(_INSERT_EVENT, events)

    def start_jobs(self, starts: Sequence[JobStart], now: float) -> None:
        """pending -> running with the given GPU units; all or none.

        Raises IllegalTransition for a job that is not pending and DoubleBooking for a unit
        that is already live (the partial unique index backs this check against races).
        """
        if not starts:
            return
        rows = self._lock_jobs(s.job_id for s in starts)
        states: dict[int, JobState] = {}
        for start in starts:
            if start.job_id not in rows:
                raise NotFound(f"no job {start.job_id}")
            states[start.job_id] = JobState(rows[start.job_id]["state"])
            check_transition(start.job_id, states[start.job_id], JobState.RUNNING)
            if rows[start.job_id]["array_tasks"]:
                raise ValueError(f"job {start.job_id} is an array's record; split a task first")
        self._check_units_free(
            [u for s in starts if not s.shared for u in s.gpus],
            [u for s in starts if s.shared for u in s.gpus],
        )
        for start in starts:
            rows[start.job_id].update(
                start_count=(rows[start.job_id]["start_count"] or 0) + 1,
                state=JobState.RUNNING.value,
                node=start.node,
                start_time=now,
                end_time=None,
                exit_code=None,
                signal=None,
                stop_state=None,
                stop_reason=None,
                reason=start.why,
            )
        self.conn.execute(
            _UPDATE_MUTABLE,
            [{"b_id": s.job_id, **{f"b_{c}": rows[s.job_id][c] for c in _MUTABLE}} for s in starts],
        )
        units = [
            {
                "job_id": s.job_id,
                "node": s.node,
                "unit": u,
                "live": True,
                "started_at": now,
                "shared": s.shared,
            }
            for s in starts
            for u in s.gpus
        ]
        if units:
            try:
                self.conn.execute(_INSERT_ALLOCATION, units)
            except IntegrityError as exc:
                raise DoubleBooking(f"a GPU unit was already allocated: {exc.orig}") from exc
        self.conn.execute(
            _INSERT_EVENT,
            [_event(s.job_id, now, states[s.job_id], JobState.RUNNING, s.why) for s in starts],
        )

    def start_counts(self, job_ids: Iterable[int]) -> dict[int, int]:
        """How many times each job was started (its current start's attempt number), read
        under the transaction's lock."""
        return {i: row["start_count"] or 0 for i, row in self._lock_jobs(job_ids).items()}

    def requeues_from(self, job_ids: Iterable[int], state: JobState) -> dict[int, int]:
        """How many times each job went from `state` back to pending (jobs with none are left
        out): e.g. how often a job lost with its node was requeued."""
        wanted = sorted(set(job_ids))
        if not wanted:
            return {}
        stmt = (
            select(job_events.c.job_id, func.count())
            .where(
                and_(
                    job_events.c.job_id.in_(wanted),
                    job_events.c.from_state == state.value,
                    job_events.c.to_state == JobState.PENDING.value,
                )
            )
            .group_by(job_events.c.job_id)
        )
        return {int(job_id): int(count) for job_id, count in self.conn.execute(stmt)}

    def job_states(self, job_ids: Iterable[int]) -> dict[int, JobState]:
        """Current states, read under the transaction's lock (the truth a write decides on)."""
        return {i: JobState(row["state"]) for i, row in self._lock_jobs(job_ids).items()}

    def request_stop(self, job_id: int, end_state: JobState, reason: str) -> None:
        """Record that a running job was asked to stop and what it then becomes (its state
        changes when the agent reports it gone)."""
        check_transition(job_id, JobState.RUNNING, end_state)
        if end_state.is_live:  # a stop ends the job (back to pending is no stop)
            raise IllegalTransition(job_id, JobState.RUNNING.value, end_state.value)
        row = self._lock_jobs([job_id]).get(job_id)
        if row is None or row["state"] != JobState.RUNNING.value:
            raise NotFound(f"no running job {job_id}")
        row.update(stop_state=end_state.value, stop_reason=reason)
        self.conn.execute(_UPDATE_MUTABLE, {"b_id": job_id, **{f"b_{c}": row[c] for c in _MUTABLE}})

    def add_event(self, job_id: int, at: float, state: JobState, reason: str) -> bool:
        """Note something about a job in its events without a state change (from_state =
        to_state = state), e.g. "idle since 12:03"; only while the job is in that state
        (False, and nothing written, otherwise)."""
        row = self._lock_jobs([job_id]).get(job_id)
        if row is None or row["state"] != state.value:
            return False
        self.conn.execute(_INSERT_EVENT, [_event(job_id, at, state, state, reason)])
        return True

    def set_telemetry(self, job_id: int, attempt: int, telemetry: JobTelemetry) -> None:
        """Keep what start `attempt` of a job measured (replacing what was kept before)."""
        values = _telemetry_row(attempt, telemetry)
        where = job_telemetry.c.job_id == job_id
        if self.conn.execute(update(job_telemetry).where(where).values(values)).rowcount == 0:
            self.conn.execute(insert(job_telemetry).values(job_id=job_id, **values))

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

    def add_notifications(self, items: Sequence[Notification]) -> list[int]:
        """Put mails and webhooks in the outbox (their `id` is ignored); their ids, in order."""
        stmt = insert(notifications).returning(notifications.c.id)
        return [
            int(
                self.conn.execute(
                    stmt,
                    {
                        "kind": item.kind,
                        "target": item.target,
                        "body": item.body,
                        "trusted": item.trusted,
                        "attempts": item.attempts,
                        "next_at": item.next_at,
                        "created_at": item.created_at,
                    },
                ).scalar_one()
            )
            for item in items
        ]

    def delete_notifications(self, ids: Iterable[int]) -> int:
        """Take sent (or given up) mails and webhooks out of the outbox; how many were there."""
        wanted = list(ids)
        if not wanted:
            return 0
        result = self.conn.execute(delete(notifications).where(notifications.c.id.in_(wanted)))
        return int(result.rowcount)

    def retry_notification(self, notification_id: int, attempts: int, next_at: float) -> bool:
        """Record a failed attempt: `attempts` failed so far, the next at `next_at`. False when
        the row is gone (sent or given up meanwhile)."""
        result = self.conn.execute(
            update(notifications)
            .where(notifications.c.id == notification_id)
            .values(attempts=attempts, next_at=next_at)
        )
        return bool(result.rowcount)

    def set_usage(self, user: str, gpu_seconds: float, at: float) -> None:
        values = {"b_user": user, "b_gpu_seconds": gpu_seconds, "b_updated_at": at}
        if self.conn.execute(_UPDATE_USAGE, values).rowcount == 0:
            self.conn.execute(_INSERT_USAGE, values)

    def add_cron(self, user: str, schedule: str, spec: JobSpec, now: float) -> int:
        row = {
            "user": user,
            "schedule": schedule,
            "spec": json.dumps(spec_to_dict(spec), separators=(",", ":")),
            "created_at": now,
            "last_fire": now,
        }
        return int(
            self.conn.execute(insert(cron_entries).returning(cron_entries.c.id), row).scalar_one()
        )

    def remove_cron(self, entry_id: int) -> None:
        result = self.conn.execute(cron_entries.delete().where(cron_entries.c.id == entry_id))
        if result.rowcount != 1:
            raise NotFound(f"no cron entry {entry_id}")

    def cron_fired(self, entry_id: int, at: float) -> None:
        self.conn.execute(
            update(cron_entries).where(cron_entries.c.id == entry_id).values(last_fire=at)
        )

    def set_drain(self, drain: Drain) -> None:
        """Drain a node (unit "") or a unit; a repeat replaces the reason, who and when."""
        values = {"reason": drain.reason, "by": drain.by, "at": drain.at}
        where = and_(drains.c.node == drain.node, drains.c.unit == drain.unit)
        if self.conn.execute(update(drains).where(where).values(values)).rowcount == 0:
            self.conn.execute(insert(drains).values(node=drain.node, unit=drain.unit, **values))

    def add_user_token(self, digest: str, user: str, by: str, at: float) -> None:
        self.conn.execute(
            insert(user_tokens).values(digest=digest, user=user, created_by=by, created_at=at)
        )

    def revoke_user_tokens(self, user: str) -> int:
        """How many of `user`'s tokens there were."""
        return int(
            self.conn.execute(delete(user_tokens).where(user_tokens.c.user == user)).rowcount
        )

    def clear_drain(self, node: str, unit: str) -> bool:
        """Resume: False if there was no such drain."""
        where = and_(drains.c.node == node, drains.c.unit == unit)
        return bool(self.conn.execute(delete(drains).where(where)).rowcount)

    def save_node(self, node: Node) -> None:
        """Insert or replace a node's description and state."""
        values = {
            "state": node.state.value,
            "cpus": node.cpus,
            "mem": node.mem,
            "fake": node.fake,
            "units": json.dumps([_unit_to_dict(u) for u in node.units]),
            "topology": json.dumps([list(link) for link in node.topology]),
            "last_seen": node.last_seen,
            "reason": node.reason,
        }
        result = self.conn.execute(update(nodes).where(nodes.c.name == node.name).values(values))
        if result.rowcount == 0:
            self.conn.execute(insert(nodes).values(name=node.name, **values))

    def set_node_state(
        self, name: str, state: NodeState, reason: str, last_seen: float | None = None
    ) -> None:
        values: dict[str, Any] = {"state": state.value, "reason": reason}
        if last_seen is not None:
            values["last_seen"] = last_seen
        result = self.conn.execute(update(nodes).where(nodes.c.name == name).values(values))
        if result.rowcount != 1:
            raise NotFound(f"no node {name}")

    def _lock_jobs(self, job_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
        """The jobs' mutable columns, read once per transaction under a row lock (PostgreSQL;
        SQLite's BEGIN IMMEDIATE already holds the database)."""
        wanted = set(job_ids)
        missing = sorted(wanted - self._rows.keys())  # a fixed order avoids deadlocks
        for start in range(0, len(missing), 5000):
            chunk = missing[start : start + 5000]
            for row in self.conn.execute(_LOCK_JOBS, {"ids": chunk}):
                self._rows[row.id] = dict(row._mapping)
        return {i: self._rows[i] for i in wanted if i in self._rows}

    def _check_units_free(self, units: list[str], shared: Sequence[str] = ()) -> None:
        """`units` go to one job each and must be free; `shared` go to MPS shares, which
        may share a unit with other shares but never with a job that holds it whole."""
        if len(set(units)) != len(units):
            twice = sorted({u for u in units if units.count(u) > 1})
            raise DoubleBooking(f"one plan gives {', '.join(twice)} to two jobs")
        both = sorted(set(units) & set(shared))
        if both:
            raise DoubleBooking(f"one plan gives {', '.join(both)} whole and as a share")
        if units:
            taken = self.conn.execute(_LIVE_UNITS, {"units": units}).first()
            if taken is not None:
                raise DoubleBooking(f"GPU {taken.unit} is already allocated to job {taken.job_id}")
        if shared:
            for taken in self.conn.execute(_LIVE_UNITS, {"units": sorted(set(shared))}):
                if not taken.shared:
                    raise DoubleBooking(
                        f"GPU {taken.unit} is held whole by job {taken.job_id}, not shared"
                    )


# the columns a state change may rewrite (all written together, so one executemany does it)
_MUTABLE = (
    "state",
    "reason",
    "end_time",
    "exit_code",
    "signal",
    "stop_state",
    "stop_reason",
    "requeue_count",
    "start_count",
    "node",
    "start_time",
)
# statements built once: building them per call costs more than running them
_LOCK_JOBS = (
    select(jobs.c.id, jobs.c.array_tasks, *(jobs.c[c] for c in _MUTABLE))
    .where(jobs.c.id.in_(bindparam("ids", expanding=True)))
    .with_for_update()
)
_UPDATE_MUTABLE = (
    update(jobs)
    .where(jobs.c.id == bindparam("b_id"))
    .values({c: bindparam(f"b_{c}") for c in _MUTABLE})
)
_RELEASE = (
    update(allocations)
    .where(and_(allocations.c.live, allocations.c.job_id.in_(bindparam("ids", expanding=True))))
    .values(live=False, released_at=bindparam("now"))
)
_INSERT_ALLOCATION = insert(allocations)
_EDITED = ("name", "qos", "priority", "gpus", "gpu_mem", "cpus", "mem", "time_limit", "spec")
_EDIT_JOB = (
    update(jobs)
    .where(jobs.c.id == bindparam("b_id"))
    .values({c: bindparam(f"b_{c}") for c in _EDITED})
)


def _edit_row(edit: JobEdit) -> dict[str, Any]:
    res = edit.spec.resources
    return {
        "b_id": edit.job_id,
        "b_name": edit.spec.name,
        "b_qos": edit.qos,
        "b_priority": edit.priority,
        "b_gpus": res.gpus,
        "b_gpu_mem": res.gpu_mem,
        "b_cpus": res.cpus,
        "b_mem": res.mem,
        "b_time_limit": res.time_limit,
        "b_spec": json.dumps(spec_to_dict(edit.spec), separators=(",", ":")),
    }


def _claim_key(dialect: Any) -> Any:
    """Insert a request key, or (when (user, key) is taken) leave the row as it is; either
    way the job id the key now names, in one statement."""
    stmt = dialect.insert(submission_keys)
    return stmt.on_conflict_do_update(
        index_elements=[submission_keys.c.user, submission_keys.c.key],
        set_={"job_id": submission_keys.c.job_id},
    ).returning(submission_keys.c.job_id)


_CLAIM_KEY = {"postgresql": _claim_key(postgresql), "sqlite": _claim_key(sqlite)}
_KEY_OWNER = select(submission_keys.c.job_id).where(
    and_(
        submission_keys.c.user == bindparam("user"),
        submission_keys.c.key == bindparam("key"),
    )
)
_LIVE_UNITS = select(allocations.c.unit, allocations.c.job_id, allocations.c.shared).where(
    and_(allocations.c.live, allocations.c.unit.in_(bindparam("units", expanding=True)))
)
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


def _apply_change(row: dict[str, Any], current: JobState, change: StateChange, now: float) -> None:
    row["state"] = change.to_state.value
    row["reason"] = change.reason
    if current in (JobState.PREEMPTED, JobState.NODE_FAIL) and change.to_state is JobState.PENDING:
        row["requeue_count"] += 1
        row["node"] = None
        row["end_time"] = None
    elif current is JobState.RUNNING and change.to_state is JobState.PENDING:
        # the agent never received the start: not a requeue, the job never ran
        row["node"] = None
        row["stop_state"] = None
        row["stop_reason"] = None
    elif not change.to_state.is_live:
        row["end_time"] = now if change.at is None else change.at
        row["stop_state"] = None
        row["stop_reason"] = None
        if change.result is not None:
            row["exit_code"] = change.result.exit_code
            row["signal"] = change.result.signal


def _event(
    job_id: int, now: float, from_state: JobState | None, to_state: JobState, reason: str
) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "at": now,
        "from_state": from_state.value if from_state else None,
        "to_state": to_state.value,
        "reason": reason,
    }


def _job_row(new: NewJob, state: JobState, now: float) -> dict[str, Any]:
    res = new.spec.resources
    return {
        "user": new.user,
        "name": new.spec.name,
        "state": state.value,
        "qos": new.qos,
        "priority": new.priority,
        "gpus": res.gpus,
        "gpu_mem": res.gpu_mem,
        "cpus": res.cpus,
        "mem": res.mem,
        "time_limit": res.time_limit,
        "submit_time": now,
        "reason": SUBMITTED,
        "requeue_count": 0,
        "array_job_id": None,
        "array_task_id": None,
        "array_tasks": None,
        "spec": json.dumps(spec_to_dict(new.spec), separators=(",", ":")),
    }


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


def _job_from_row(
    row: Row[Any],
    units: tuple[str, ...],
    specs: dict[int, JobSpec],
    telemetry: JobTelemetry | None = None,
) -> Job:
    ended = row.exit_code is not None or row.signal is not None
    state = JobState(row.state)
    spec = specs[row.id if row.spec else row.array_job_id]
    return Job(
        id=row.id,
        spec=spec,
        user=row.user,
        state=state,
        qos=row.qos,
        priority=row.priority,
        submit_time=row.submit_time,
        start_time=row.start_time,
        end_time=row.end_time,
        node=row.node,
        gpus=units,
        result=(
            JobResult(row.exit_code, row.signal, row.reason)
            if ended or (not state.is_live and row.start_time is not None)
            else None
        ),
        requeue_count=row.requeue_count,
        start_count=row.start_count or 0,
        array_job_id=row.array_job_id,
        array_task_id=row.array_task_id,
        reason=row.reason,
        stop=(JobState(row.stop_state), row.stop_reason) if row.stop_state else None,
        tasks=_tasks(row.array_tasks, spec),
        telemetry=telemetry,
    )


def _tasks(text: str | None, spec: JobSpec) -> tuple[int, ...]:
    """A record's tasks; the spec's own tuple while none has left (half the memory)."""
    if not text:
        return ()
    tasks = parse_indices(text)
    return spec.array.indices if spec.array and spec.array.indices == tasks else tasks


def _unit_to_dict(unit: GpuUnit) -> dict[str, Any]:
    return {
        "uuid": unit.uuid,
        "index": unit.index,
        "name": unit.name,
        "memory": unit.memory,
        "pci_bus_id": unit.pci_bus_id,
        "parent_uuid": unit.parent_uuid,
        "mig_profile": unit.mig_profile,
        **({"shared": True} if unit.shared else {}),
    }


def _node_from_row(row: Row[Any]) -> Node:
    return Node(
        name=row.name,
        units=tuple(GpuUnit(**u) for u in json.loads(row.units)),
        cpus=row.cpus,
        mem=row.mem,
        state=NodeState(row.state),
        fake=row.fake,
        topology=tuple((a, b, d) for a, b, d in json.loads(row.topology)),
        last_seen=row.last_seen,
        reason=row.reason,
    )
