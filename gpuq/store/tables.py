"""The job store's tables, in SQLAlchemy Core. The migrations must produce exactly these
(tests/store/test_migrations.py compares them).

The one guarantee the database itself gives: a GPU unit has at most one live allocation
(`uq_allocations_live_unit`, a partial unique index), so no bug above can double-book a GPU.
"""

from __future__ import annotations

import functools

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    false,
    text,
)
from sqlalchemy.sql.dml import Insert

from gpuq.domain.states import JobState

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# SQLite only aliases rowid (and so autoincrements) for a column typed exactly INTEGER
Id = BigInteger().with_variant(Integer, "sqlite")

_STATE_VALUES = ", ".join(f"'{s.value}'" for s in JobState)

jobs = Table(
    "jobs",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("user", String(64), nullable=False),
    Column("name", String(128), nullable=False),
    Column("state", String(16), nullable=False),
    Column("qos", String(64), nullable=False),
    Column("priority", Integer, nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("gpu_mem", BigInteger, nullable=True),
    Column("cpus", Integer, nullable=False),
    Column("mem", BigInteger, nullable=True),
    Column("time_limit", Integer, nullable=True),
    Column("submit_time", Float, nullable=False),
    Column("start_time", Float, nullable=True),
    Column("end_time", Float, nullable=True),
    Column("node", String(128), nullable=True),
    Column("exit_code", Integer, nullable=True),
    Column("signal", Integer, nullable=True),
    Column("reason", Text, nullable=False),
    Column("stop_state", String(16), nullable=True),  # what a requested stop ends the job as
    Column("stop_reason", Text, nullable=True),
    Column("requeue_count", Integer, nullable=False),
    Column("array_job_id", BigInteger, nullable=True),
    Column("array_task_id", Integer, nullable=True),
    # the JobSpec as JSON (gpuq.domain.codec); '' for an array task split off its array's
    # record, which holds the spec once for every task (environment included)
    Column("spec", Text, nullable=False),
    # an array's record: its tasks not yet split off to run on their own, as compact text
    # ("3-99", "1,3,5-7"; gpuq.domain.array_specs.format_indices); NULL for a job or a single task
    Column("array_tasks", Text, nullable=True),
    # how many times the job was started (NULL: none, or a row from before 0005): a start's
    # attempt number, which tells its reports and stops from those of an earlier start
    Column("start_count", Integer, nullable=True),
    # a multi-node start (0012): its nodes, comma-separated, the first (jobs.node) first;
    # NULL on one node
    Column("nodes", Text, nullable=True),
    # the start's torch.distributed MASTER_PORT (and the step workers' port, one above), and the
    # secret its srun and step workers prove to each other; NULL before the first start
    Column("master_port", Integer, nullable=True),
    Column("step_key", String(64), nullable=True),
    CheckConstraint(f"state IN ({_STATE_VALUES})", name="state"),
)
# "top N pending by priority" is an index range scan, not a sort of the queue
Index("ix_jobs_pending_order", jobs.c.state, jobs.c.priority.desc(), jobs.c.id)
Index("ix_jobs_user_state", jobs.c.user, jobs.c.state)
# "my jobs that ended since T" (gpuq status, history --since) reads the user's last hour only
Index("ix_jobs_user_end_time", jobs.c.user, jobs.c.end_time)
# everyone's jobs that ended since T (the dashboard's GPU history, sacct -a, report --since,
# history --since): the window's rows, not every ended job (0018; SQLite is steered to it by
# gpuq.store.history_terms)
Index("ix_jobs_end_time", jobs.c.end_time)
Index("ix_jobs_array_job_id", jobs.c.array_job_id)

job_events = Table(
    "job_events",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("job_id", Id, ForeignKey("jobs.id"), nullable=False),
    Column("at", Float, nullable=False),
    Column("from_state", String(16), nullable=True),
    Column("to_state", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    # what caused it (gpuq.coordinator.changes.effects.Cause); NULL for events before 0011
    Column("cause", Text, nullable=True),
)
Index("ix_job_events_job_id", job_events.c.job_id, job_events.c.id)

allocations = Table(
    "allocations",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("job_id", Id, ForeignKey("jobs.id"), nullable=False),
    Column("node", String(128), nullable=False),
    Column("unit", String(96), nullable=False),  # GPU or MIG UUID
    Column("live", Boolean, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("released_at", Float, nullable=True),
    # an MPS share (0009): several shares may hold one unit at once; a whole job never
    # holds a unit beside another job, share or not (gpuq.store.node_rows.check_units_free
    # checks the mix)
    Column("shared", Boolean, nullable=False, server_default=false()),
)
Index(
    "uq_allocations_live_unit",
    allocations.c.unit,
    unique=True,
    sqlite_where=text("live AND NOT shared"),
    postgresql_where=text("live AND NOT shared"),
)
Index("ix_allocations_job_id", allocations.c.job_id)
# "is any of these units live?" at every start (node_rows.check_units_free): the units' live
# rows, not every allocation ever made (the partial unique index above serves no read: its
# predicate is not what a query says)
Index("ix_allocations_unit_live", allocations.c.unit, allocations.c.live)

nodes = Table(
    "nodes",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("state", String(16), nullable=False),
    Column("cpus", Integer, nullable=False),
    Column("mem", BigInteger, nullable=False),
    Column("fake", Boolean, nullable=False),
    Column("units", Text, nullable=False),  # JSON list of GpuUnit
    Column("topology", Text, nullable=False),  # JSON list of [uuid a, uuid b, distance]
    Column("last_seen", Float, nullable=True),
    Column("reason", Text, nullable=False),
    # its agent's [agent] fence_time as it last registered (0014); NULL: not said
    Column("fence_time", Float, nullable=True),
)

# fair share: each user's GPU-seconds, decayed to `updated_at` (gpuq.scheduler.priority)
usage = Table(
    "usage",
    metadata,
    Column("user", String(64), primary_key=True),
    Column("gpu_seconds", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

# `gpuq cron`: recurring submissions
cron_entries = Table(
    "cron_entries",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("user", String(64), nullable=False),
    Column("schedule", String(128), nullable=False),  # five cron fields
    Column("spec", Text, nullable=False),  # the JobSpec as JSON
    Column("created_at", Float, nullable=False),
    Column("last_fire", Float, nullable=True),  # the scheduled time of the last fire handled
)

# idempotent submission: a client's request key -> the job its first request created, written
# in the job's own transaction (gpuq.store.job_submissions, StoreTx.add_jobs); the primary key
# makes a repeat of (user, key) unable to create a second job. Rows older than a day are purged.
submission_keys = Table(
    "submission_keys",
    metadata,
    Column("user", String(64), primary_key=True),
    Column("key", String(64), primary_key=True),
    Column("job_id", Id, ForeignKey("jobs.id"), nullable=False),
    Column("created_at", Float, nullable=False),
)
Index("ix_submission_keys_created_at", submission_keys.c.created_at)

# `gpuq drain`: an admin's drain of a whole node (unit '') or of one GPU unit (its UUID), until
# `gpuq resume`; no new work goes there, running jobs continue
drains = Table(
    "drains",
    metadata,
    Column("node", String(128), primary_key=True),
    Column("unit", String(96), primary_key=True),
    Column("reason", Text, nullable=False),
    Column("by", String(64), nullable=False),
    Column("at", Float, nullable=False),
)

# per-user tokens for TCP callers (`gpuq admin token USER`): the SHA-256 of each token, never the
# token itself
user_tokens = Table(
    "user_tokens",
    metadata,
    Column("digest", String(64), primary_key=True),
    Column("user", String(64), nullable=False),
    Column("created_by", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
)
Index("ix_user_tokens_user", user_tokens.c.user)

# dashboard credentials refused across restarts (used sign-in tickets, signed-out sessions):
# the SHA-256 of each one's kind and nonce, until it would have expired anyway
# starts given up with their silent node (0014), whose ends that node may still report when
# it is back (gpuq.coordinator.workload.job_endings): the nodes not yet heard from
given_up_starts = Table(
    "given_up_starts",
    metadata,
    Column("job_id", Id, primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("nodes", Text, nullable=False),  # comma-separated
    Column("first", String(128), nullable=False),  # where its script ran
    Column("at", Float, nullable=False),
)
Index("ix_given_up_starts_at", given_up_starts.c.at)

revoked_web_credentials = Table(
    "revoked_web_credentials",
    metadata,
    Column("digest", String(64), primary_key=True),
    Column("expires_at", Float, nullable=False),
)
Index("ix_revoked_web_credentials_expires_at", revoked_web_credentials.c.expires_at)

# what a job's GPUs did (issue 12): the aggregates its agent measured, over the run once it
# ended (written with the end), so far while it runs (the latest heartbeat's, every
# gpuq.coordinator.workload.running_telemetry.FLUSH_EVERY seconds); for the start `attempt`
# (jobs.start_count) only: a row of an earlier start is not the job's. NULL figures are
# unknown, never 0.
job_telemetry = Table(
    "job_telemetry",
    metadata,
    Column("job_id", Id, ForeignKey("jobs.id"), primary_key=True, autoincrement=False),
    Column("attempt", Integer, nullable=False),
    Column("peak_gpu_mem", BigInteger, nullable=False),  # bytes
    Column("util_mean", Float, nullable=True),  # percent
    Column("util_p95", Float, nullable=True),
    Column("energy", Float, nullable=True),  # joules
    Column("samples", Integer, nullable=False),
    Column("seconds", Float, nullable=False),
    Column("units", Text, nullable=False),  # JSON list of per-unit figures (UnitTelemetry)
)

# what each node's agent sent with the end of a job's latest start that did not complete
# (issue 26): the most host memory its processes held, and the tail of its output, the
# evidence `gpuq diagnose` reads (gpuq.domain.diagnosis). One row a job and node: a later
# start's end replaces it. The tail is private to the job's owner and admins.
job_evidence = Table(
    "job_evidence",
    metadata,
    Column("job_id", Id, ForeignKey("jobs.id"), primary_key=True, autoincrement=False),
    Column("node", String(128), primary_key=True),
    Column("attempt", Integer, nullable=False),
    Column("peak_mem", BigInteger, nullable=False),  # bytes; 0: unknown
    Column("output_tail", Text, nullable=False),
    Column("at", Float, nullable=False),  # when the coordinator took it
)

# a job's downsampled series for plotting: at most one point per job per SERIES_STEP seconds
# and SERIES_CAP points per job (older points are thinned: StoreTx.add_series, in
# gpuq.store.accounting_rows)
job_series = Table(
    "job_series",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("job_id", Id, ForeignKey("jobs.id"), nullable=False),
    Column("at", Float, nullable=False),
    Column("gpu_mem", BigInteger, nullable=False),  # bytes, all its units together
    Column("util", Float, nullable=True),  # percent, mean over its units; NULL: unknown
)
Index("ix_job_series_job_id_at", job_series.c.job_id, job_series.c.at)

# the notifications outbox (gpuq.coordinator.notifications): a mail or webhook is written here
# before it is first attempted and deleted once sent or given up, so that one a coordinator was
# still trying or waiting to retry when it stopped (or was killed) is resumed by the next start
notifications = Table(
    "notifications",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("kind", String(16), nullable=False),  # "mail" or "webhook"
    Column("target", Text, nullable=False),  # the recipient, or the URL
    Column("body", LargeBinary, nullable=False),  # the mail message, or the JSON
    Column("trusted", Boolean, nullable=False),  # an admin's webhook: any address
    Column("attempts", Integer, nullable=False),  # attempts failed so far
    Column("next_at", Float, nullable=False),  # Unix seconds of the next attempt
    Column("created_at", Float, nullable=False),
)
Index("ix_notifications_next_at", notifications.c.next_at)

# per-GPU history (the dashboard's heat map, gpuq.domain.gpu_history): what each job did on
# each unit in each 5-minute bucket, written once the bucket is over (by
# gpuq.coordinator.workload.history_buckets, in the writer's group commit), pruned past
# [coordinator] gpu_history_days. A unit no job held has no row: it was free.
gpu_usage = Table(
    "gpu_usage",
    metadata,
    Column("node", String(128), primary_key=True),
    Column("unit", String(96), primary_key=True),  # GPU or MIG UUID
    Column("at", BigInteger, primary_key=True, autoincrement=False),  # the bucket's start
    Column("job_id", BigInteger, primary_key=True, autoincrement=False),
    Column("user", String(64), nullable=False),
    Column("samples", Integer, nullable=False),
    Column("util_sum", Float, nullable=False),  # percent, over the samples that knew it
    Column("util_samples", Integer, nullable=False),
    Column("peak_mem", BigInteger, nullable=False),  # bytes its processes held there
)
Index("ix_gpu_usage_at", gpu_usage.c.at)


@functools.cache
def upsert(table: Table, dialect: str) -> Insert:
    """The statement that inserts rows, each in place of the row with its primary key if
    there is one (one statement where a delete or a look-up and an insert took two), for
    the named dialect ("sqlite" or "postgresql"; both say ON CONFLICT DO UPDATE)."""
    # imported here: a process that never writes does without them
    if dialect == "sqlite":
        from sqlalchemy.dialects import sqlite

        stmt: sqlite.Insert | postgresql.Insert = sqlite.insert(table)
    else:
        from sqlalchemy.dialects import postgresql

        stmt = postgresql.insert(table)
    keys = list(table.primary_key.columns)
    rest = {c.name: stmt.excluded[c.name] for c in table.columns if not c.primary_key}
    return stmt.on_conflict_do_update(index_elements=keys, set_=rest)
