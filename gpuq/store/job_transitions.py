"""Changing jobs that exist: state changes checked against the transition table, edits of
waiting jobs, requeues, starts with their GPU units, stop requests and notes in a job's events.
Each writes its event rows in the same transaction; anything refused raises, and the caller's
transaction rolls back whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import and_, bindparam, func, insert, select, update
from sqlalchemy.engine import Connection

from gpuq.domain.codec import spec_to_dict
from gpuq.domain.states import JobState, check_transition
from gpuq.errors import IllegalTransition, NotFound
from gpuq.store.node_rows import allocate_units, check_units_free, release_units
from gpuq.store.records import REQUEUABLE, JobEdit, JobStart, StateChange
from gpuq.store.row_mapping import event_row
from gpuq.store.tables import job_events, jobs


class JobTransitions:
    """The state-changing writes of `gpuq.store.api.StoreTx`, within its transaction."""

    conn: Connection
    _rows: dict[int, dict[str, Any]]  # StoreTx's cache of locked job rows

    def transition(self, changes: Sequence[StateChange], now: float, *, cause: str = "") -> None:
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
            events.append(
                event_row(change.job_id, now, current, change.to_state, change.reason, cause)
            )
        touched = sorted({c.job_id for c in changes})
        self.conn.execute(
            _UPDATE_MUTABLE,
            [{"b_id": i, **{f"b_{c}": rows[i][c] for c in _MUTABLE}} for i in touched],
        )
        self.conn.execute(INSERT_EVENT, events)
        if released:
            release_units(self.conn, sorted(released), now)

    def edit_jobs(self, edits: Sequence[JobEdit], now: float, *, cause: str = "") -> None:
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
            events.append(event_row(edit.job_id, now, state, state, edit.reason, cause))
        self.conn.execute(_EDIT_JOB, [_edit_row(e) for e in edits])
        self.conn.execute(INSERT_EVENT, events)

    def requeue_jobs(
        self,
        job_ids: Sequence[int],
        reason: str,
        now: float,
        *,
        hold: bool = False,
        cause: str = "",
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
                nodes=None,
                end_time=None,
                exit_code=None,
                signal=None,
                stop_state=None,
                stop_reason=None,
            )
            events.append(event_row(job_id, now, current, JobState.PENDING, reason, cause))
            if hold:
                events.append(
                    event_row(job_id, now, JobState.PENDING, JobState.HELD, reason, cause)
                )
        self.conn.execute(
            _UPDATE_MUTABLE,
            [{"b_id": i, **{f"b_{c}": rows[i][c] for c in _MUTABLE}} for i in sorted(set(job_ids))],
        )
        self.conn.execute(INSERT_EVENT, events)

    def start_jobs(self, starts: Sequence[JobStart], now: float, *, cause: str = "") -> None:
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
        check_units_free(
            self.conn,
            [u for s in starts if not s.shared for u in s.gpus],
            [u for s in starts if s.shared for u in s.gpus],
        )
        for start in starts:
            rows[start.job_id].update(
                start_count=(rows[start.job_id]["start_count"] or 0) + 1,
                state=JobState.RUNNING.value,
                node=start.node,
                nodes=",".join(n for n, _ in start.parts) or None,
                master_port=start.master_port,
                step_key=start.step_key,
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
        allocate_units(self.conn, starts, now)
        self.conn.execute(
            INSERT_EVENT,
            [
                event_row(s.job_id, now, states[s.job_id], JobState.RUNNING, s.why, cause)
                for s in starts
            ],
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

    def add_event(
        self, job_id: int, at: float, state: JobState, reason: str, *, cause: str = ""
    ) -> bool:
        """Note something about a job in its events without a state change (from_state =
        to_state = state), e.g. "idle since 12:03"; only while the job is in that state
        (False, and nothing written, otherwise)."""
        row = self._lock_jobs([job_id]).get(job_id)
        if row is None or row["state"] != state.value:
            return False
        self.conn.execute(INSERT_EVENT, [event_row(job_id, at, state, state, reason, cause)])
        return True

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
    "nodes",
    "master_port",
    "step_key",
)
# statements built once: building them per call costs more than running them
INSERT_EVENT = insert(job_events)  # the event rows of every write (job_submissions' too)
# what a transaction keeps of each job it locked (StoreTx._rows)
LOCKED_COLUMNS = (jobs.c.id, jobs.c.array_tasks, *(jobs.c[c] for c in _MUTABLE))
_LOCK_JOBS = (
    select(*LOCKED_COLUMNS).where(jobs.c.id.in_(bindparam("ids", expanding=True))).with_for_update()
)
_UPDATE_MUTABLE = (
    update(jobs)
    .where(jobs.c.id == bindparam("b_id"))
    .values({c: bindparam(f"b_{c}") for c in _MUTABLE})
)
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


def _apply_change(row: dict[str, Any], current: JobState, change: StateChange, now: float) -> None:
    row["state"] = change.to_state.value
    row["reason"] = change.reason
    if current in (JobState.PREEMPTED, JobState.NODE_FAIL) and change.to_state is JobState.PENDING:
        row["requeue_count"] += 1
        row["node"] = row["nodes"] = None
        row["end_time"] = None
    elif current is JobState.RUNNING and change.to_state is JobState.PENDING:
        # the agent never received the start: not a requeue, the job never ran
        row["node"] = row["nodes"] = None
        row["stop_state"] = None
        row["stop_reason"] = None
    elif not change.to_state.is_live:
        row["end_time"] = now if change.at is None else change.at
        row["stop_state"] = None
        row["stop_reason"] = None
        if change.result is not None:
            row["exit_code"] = change.result.exit_code
            row["signal"] = change.result.signal
