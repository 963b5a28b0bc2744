"""Adding jobs: submissions (one row per submission, an array's row its record), request keys
that make a repeated submission add nothing, and array tasks split off their record to run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from gpuq.domain.array_specs import format_indices, parse_indices
from gpuq.domain.states import JobState
from gpuq.errors import NotFound
from gpuq.store.job_transitions import INSERT_EVENT, LOCKED_COLUMNS
from gpuq.store.records import NewJob
from gpuq.store.row_mapping import SUBMITTED, event_row, job_row
from gpuq.store.tables import job_events, jobs, submission_keys

# the new row as a later write in the same transaction would lock and read it (StoreTx._rows),
# so that starting a job in the transaction that adds it reads nothing back
_INSERT_JOB = insert(jobs).returning(*LOCKED_COLUMNS)


class JobSubmissions:
    """The submission writes of `gpuq.store.api.StoreTx`, within its transaction."""

    conn: Connection
    _rows: dict[int, dict[str, Any]]  # StoreTx's cache of locked job rows

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
        self._rows.pop(job_id, None)
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
        row = job_row(new, state, now)
        added = self.conn.execute(_INSERT_JOB, row).one()
        job_id = int(added.id)
        if new.spec.array is None:  # an array's record is rewritten below: read when wanted
            self._rows[job_id] = dict(added._mapping)
        else:
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
        self.conn.execute(INSERT_EVENT, event_row(job_id, now, None, state, SUBMITTED, new.cause))
        return [job_id]

    def split_tasks(
        self, record_id: int, tasks: Sequence[int], now: float, *, cause: str = ""
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
            events = [event_row(i, now, None, state, reason, cause) for i in ids.values()]
            self.conn.execute(INSERT_EVENT, events)
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


def _claim_key(dialect: Any) -> Any:
    """Insert a request key, or (when (user, key) is taken) leave the row as it is; either
    way the job id the key now names, in one statement."""
    stmt = dialect.insert(submission_keys)
    return stmt.on_conflict_do_update(
        index_elements=[submission_keys.c.user, submission_keys.c.key],
        set_={"job_id": submission_keys.c.job_id},
    ).returning(submission_keys.c.job_id)


_CLAIM_KEY = {"postgresql": _claim_key(postgresql), "sqlite": _claim_key(sqlite)}
