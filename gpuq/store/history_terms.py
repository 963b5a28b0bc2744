"""Terms of the reads over ended jobs, written so that SQLite's planner reads a window of the
history rather than all of it.

SQLite plans without statistics (the store never runs ANALYZE): it takes any equality on an
indexed column to be selective. So `state IN (every ended state)` led it to
ix_jobs_pending_order, which holds most of history under those states (ordered by priority,
so a newest-first listing sorted all of it too), and a one-sided `end_time >= T` looked like a
quarter of the table, never worth an index. Measured at 200,000 ended jobs: `gpuq history`
45 ms, the dashboard's GPU history (held_seconds) 110 ms, sacct -a 105 ms; each a read of
every ended job.

- `states_term`: asked without a user, "every ended state" is written `state NOT IN (live)`,
  the same rows, which no index takes as narrow: newest first is then a walk of the primary
  key from the top, a window a range of ix_jobs_end_time. With a user it stays as it was:
  ix_jobs_user_state serves each state's rows in id order (SQLite merges them, reading a
  page's worth of each).
- `ended_since`: on SQLite an end-time lower bound says (likelihood()) that it is a small part
  of history, as it is for the windows asked often (the last hour, day, week); a bound far
  back reads what it asks for, as before.

PostgreSQL plans by its statistics and gets the same rows either way; `ended_since` is the
plain comparison there (likelihood() is SQLite's).
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, func, literal_column

from gpuq.domain.states import JobState
from gpuq.store.tables import jobs

ENDED = frozenset(s for s in JobState if not s.is_live)
LIVE = sorted(s.value for s in JobState if s.is_live)
# what a time window is taken to be of the ended jobs, for SQLite's planner
WINDOW_LIKELIHOOD: ColumnElement[float] = literal_column("0.01")


def states_term(states: frozenset[JobState], by_user: bool) -> ColumnElement[bool]:
    """The state term of a read of jobs in `states`, asked for one user (or a few) or not."""
    if states == ENDED and not by_user:
        return jobs.c.state.not_in(LIVE)
    return jobs.c.state.in_(sorted(s.value for s in states))


def ended_since(since: float, dialect: str) -> ColumnElement[bool]:
    """end_time >= since, for the planner a window of the history."""
    term = jobs.c.end_time >= since
    if dialect != "sqlite":
        return term
    # untyped: a Boolean-typed call is written `likelihood(...) = 1` on SQLite, which no
    # index serves
    hinted: ColumnElement[bool] = func.likelihood(term, WINDOW_LIKELIHOOD)
    return hinted
