"""The store's frequent reads against a big history (issue 27's siblings): each one's plan and
time, on SQLite and (with --pg) PostgreSQL. Prints figures, asserts nothing.

    python bench/store_plans_bench.py [--jobs 200000] [--db PATH] [--pg URL] [--runs 20]

Fills a SQLite store through the Store API as the coordinator writes it (submissions, starts
with GPU units, telemetry, series points, evidence for failures, ends; then per-GPU history
buckets, and a few hundred live jobs): --jobs ended jobs over USERS (one of them, alice, with
half of them), NODES and a year of end times. --db keeps the file (and reuses it when it
exists: filling 200,000 takes a few minutes). With --pg, the same rows are copied into a
schema of their own on that PostgreSQL (dropped afterwards) and ANALYZEd.

Then each query of QUERIES runs --runs times: its statements are captured
(before_cursor_execute), planned (SQLite: EXPLAIN QUERY PLAN; PostgreSQL: EXPLAIN) and the
call timed (the median). A plan line that reads a whole big table (SCAN jobs, a temp B-tree,
a Seq Scan) is marked with `!`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Boolean, Engine, create_engine, event, select, text

from gpuq.domain.diagnosis import EndEvidence
from gpuq.domain.gpu_history import Frame, UnitUse
from gpuq.domain.model import JobResult, JobTelemetry, SeriesPoint, UnitTelemetry
from gpuq.domain.states import JobState
from gpuq.store.api import Store
from gpuq.store.records import JobQuery, JobStart, NewJob, StateChange
from gpuq.store.tables import metadata
from gpuq.submission import build_spec

USERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")
NODES = tuple(f"gpu{n:02d}" for n in range(16))
UNITS = {node: [f"GPU-{node}-{i}" for i in range(8)] for node in NODES}
NAMES = tuple(f"train-{n}" for n in range(40)) + tuple(f"sweep-{n}" for n in range(10))
YEAR = 365 * 86400.0
BATCH = 128  # one start of every unit, then their ends: units are live once at a time
ENDED = frozenset(s for s in JobState if not s.is_live)
LIVE = frozenset(s for s in JobState if s.is_live)
OUTCOMES = (
    (JobState.COMPLETED, 80),
    (JobState.FAILED, 12),
    (JobState.CANCELLED, 5),
    (JobState.TIMEOUT, 2),
    (JobState.OUT_OF_MEMORY, 1),
)


def fill(store: Store, jobs: int, now: float) -> None:
    """`jobs` ended jobs ending over the year before `now`, then the live ones."""
    rng = random.Random(27)
    specs = {
        name: build_spec(wrap="python train.py", gpus=1, name=name, environ={}) for name in NAMES
    }
    units = [(node, unit) for node in NODES for unit in UNITS[node]]
    states = [s for s, weight in OUTCOMES for _ in range(weight)]
    batches = (jobs + BATCH - 1) // BATCH
    for b in range(batches):
        count = min(BATCH, jobs - b * BATCH)
        at = now - YEAR + b * (YEAR - 86400) / batches
        owners = [("alice" if rng.random() < 0.5 else rng.choice(USERS[1:])) for _ in range(count)]
        new = [NewJob(specs[rng.choice(NAMES)], u, "normal", 0) for u in owners]
        with store.transaction() as tx:
            ids = [i for [i] in tx.add_jobs(new, at)]
            starts = [JobStart(i, units[k][0], (units[k][1],)) for k, i in enumerate(ids)]
            tx.start_jobs(starts, at + 60)
            ends = {i: at + 60 + rng.uniform(60, 20 * 3600) for i in ids}
            telemetry = [
                (i, 1, _telemetry(rng, units[k][1], ends[i] - at)) for k, i in enumerate(ids)
            ]
            tx.set_telemetries(telemetry)
            tx.add_series(
                [SeriesPoint(i, at + 60 + 300 * p, 1 << 30, 50.0) for i in ids for p in range(3)],
                cap=1000,
            )
            outcome = {i: rng.choice(states) for i in ids}
            failed = [
                (i, s.node)
                for i, s in zip(ids, starts, strict=True)
                if outcome[i] is not JobState.COMPLETED
            ]
            tx.keep_evidence(
                [(i, EndEvidence(node, 1, 1 << 30, "Traceback ...\n" * 20)) for i, node in failed],
                ends[ids[0]],
            )
            tx.transition(
                [
                    StateChange(
                        i,
                        outcome[i],
                        "ended",
                        JobResult(0 if outcome[i] is JobState.COMPLETED else 1),
                        at=ends[i],
                    )
                    for i in ids
                ],
                now=max(ends.values()),
            )
        if b % 200 == 0:
            print(f"  {b * BATCH} jobs", flush=True)
    fill_gpu_usage(store, now, rng)
    fill_live(store, now, rng, units)


def _telemetry(rng: random.Random, unit: str, seconds: float) -> JobTelemetry:
    util = rng.uniform(5, 95)
    return JobTelemetry(
        peak_gpu_mem=1 << 33,
        util_mean=util,
        util_p95=util,
        energy=seconds * 250,
        samples=int(seconds // 5),
        seconds=seconds,
        units=(UnitTelemetry(unit, 1 << 33, util, util, seconds * 250),),
    )


def fill_gpu_usage(store: Store, now: float, rng: random.Random) -> None:
    """Two weeks of 5-minute buckets, half the units busy in each."""
    start = int(now - 14 * 86400) // 300 * 300
    uses = []
    for at in range(start, int(now) // 300 * 300, 300):
        for node in NODES:
            for unit in UNITS[node][:4]:
                uses.append(
                    UnitUse(
                        node, unit, at, rng.randrange(1, 10**6), "alice", 60, 3000.0, 60, 1 << 33
                    )
                )
        if len(uses) > 20_000:
            with store.transaction() as tx:
                tx.add_gpu_usage(uses)
            uses = []
    with store.transaction() as tx:
        tx.add_gpu_usage(uses)


def fill_live(store: Store, now: float, rng: random.Random, units: list[tuple[str, str]]) -> None:
    """500 pending, 50 held and 100 running jobs (the running ones on the first 100 units)."""
    spec = build_spec(wrap="python train.py", gpus=1, name="train-1", environ={})
    with store.transaction() as tx:
        pending = [
            NewJob(spec, rng.choice(USERS), "normal", rng.randrange(100)) for _ in range(650)
        ]
        ids = [i for [i] in tx.add_jobs(pending, now - 600)]
        tx.start_jobs(
            [JobStart(i, units[k][0], (units[k][1],)) for k, i in enumerate(ids[:100])], now - 300
        )
        tx.transition([StateChange(i, JobState.HELD, "held") for i in ids[100:150]], now - 200)


def copy_to_pg(source: Engine, target: Engine) -> None:
    """Every row of the SQLite store into the PostgreSQL one (its schema made by the
    migrations) by COPY, sequences past them, then ANALYZE."""
    booleans = {
        t.name: [c.name for c in t.columns if isinstance(c.type, Boolean)]
        for t in metadata.sorted_tables
    }
    with source.connect() as read, target.connect() as write:
        raw = write.connection.driver_connection
        assert raw is not None
        for table in metadata.sorted_tables:
            names = [c.name for c in table.columns]
            flags = [names.index(b) for b in booleans[table.name]]
            columns = ", ".join(f'"{n}"' for n in names)
            with (
                raw.cursor() as cursor,
                cursor.copy(f"COPY {table.name} ({columns}) FROM STDIN") as copy,
            ):
                for row in read.execute(select(table)):
                    values = list(row)
                    for i in flags:
                        values[i] = bool(values[i])
                    copy.write_row(values)
            with raw.cursor() as cursor:  # else the next table's foreign key checks plan for
                cursor.execute(f"ANALYZE {table.name}")  # an empty one: a scan per row
            if "id" in table.c and table.c.id.autoincrement is True:
                with raw.cursor() as cursor:
                    sequence = f"pg_get_serial_sequence('{table.name}', 'id')"
                    top = "coalesce(max(id), 1)"
                    cursor.execute(f"SELECT setval({sequence}, {top}) FROM {table.name}")
        raw.commit()
    with target.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE")


@contextmanager
def pg_schema(url: str) -> Iterator[str]:
    """A URL on a schema of its own, dropped afterwards."""
    schema = f"gpuq_plans_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        sep = "&" if "?" in url else "?"
        yield f"{url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def queries(store: Store, now: float) -> dict[str, Callable[[], object]]:
    """What the coordinator asks the store often, by who asks it."""
    hour, day = 3600.0, 86400.0
    with store.engine.connect() as conn:
        some = conn.execute(
            text("SELECT id FROM jobs WHERE state = 'failed' ORDER BY id DESC LIMIT 1")
        ).scalar_one()
    frame24 = Frame(int(now - day) // 300 * 300, 300, 288)

    def history(**kw: Any) -> Callable[[], object]:
        query = JobQuery(
            states=kw.pop("states", ENDED),
            newest_first=True,
            by_end=True,
            limit=kw.pop("limit", 20),
            **kw,
        )
        return lambda: store.list_jobs(query)

    return {
        "status: my ends, last hour": history(user="alice", since=now - hour, limit=50),
        "history (all users)": history(),
        "history --me": history(users=("alice",)),
        "history -u bob (small user)": history(users=("bob",)),
        "history --me --since 1d": history(users=("alice",), since=now - day),
        "history --since 1d (all)": history(since=now - day),
        "history --since 30d --until 29d (all)": history(
            since=now - 30 * day, until=now - 29 * day
        ),
        "history -s F (all)": history(states=frozenset({JobState.FAILED})),
        "history --me -s F": history(users=("alice",), states=frozenset({JobState.FAILED})),
        "history --me -s OOM": history(
            users=("alice",), states=frozenset({JobState.OUT_OF_MEMORY})
        ),
        "history -w gpu03 (all)": history(nodes=("gpu03",)),
        "history --me -w gpu03": history(users=("alice",), nodes=("gpu03",)),
        "history --name 'sweep-3' (all)": history(names=("sweep-3",)),
        "history --me --name nosuch": history(users=("alice",), names=("nosuch*",)),
        "sacct (mine since midnight)": history(users=("alice",), since=now - 12 * hour, limit=None),
        "sacct -a (since midnight)": history(since=now - 12 * hour, limit=None),
        "show: get_job + events": lambda: (store.get_job(some), store.events(some)),
        "diagnose/eff: end_evidence": lambda: store.end_evidence(some),
        "series (dashboard)": lambda: store.series(some),
        "report (all, all time)": lambda: store.usage_report(None, None),
        "report --user alice": lambda: store.usage_report("alice", None),
        "report --since 7d (all)": lambda: store.usage_report(None, now - 7 * day),
        "report --advice: my ended 30d": history(user="alice", since=now - 30 * day, limit=200),
        "dashboard history: held_seconds 24h": lambda: store.held_seconds(now - day),
        "dashboard history: held_seconds 7d": lambda: store.held_seconds(now - 7 * day),
        "dashboard history: gpu_history 24h": lambda: store.gpu_history(frame24),
        "scheduler: run_times": lambda: store.run_times(
            list(USERS), list(NAMES[:20]), now - 30 * day, 20
        ),
        "heartbeat: units_used_on": lambda: store.units_used_on("gpu03", [some, some - 1]),
        "start: check_units_free": lambda: _check_units(store),
        "submission: submitted(user,key)": lambda: store.submitted("alice", "k"),
        "sweep: revoked_web_credentials": lambda: store.revoked_web_credentials(now),
        "sweep: due_notifications": lambda: store.due_notifications(now, 100),
        "load: live jobs": lambda: store.list_jobs(JobQuery(states=LIVE)),
        "load: array_states": lambda: store.array_states([some]),
        "load: given_up_starts": store.given_up_starts,
        "sweep: purge keys, prune gpu_usage (rolled back)": lambda: _sweeps(store, now),
    }


def _check_units(store: Store) -> None:
    from gpuq.store.node_rows import check_units_free

    with store.engine.connect() as conn:
        check_units_free(conn, [UNITS["gpu15"][7]], [UNITS["gpu15"][6]])


def _sweeps(store: Store, now: float) -> None:
    conn = store.engine.connect()
    trans = conn.begin()
    try:
        from gpuq.store.api import StoreTx

        tx = StoreTx(conn)
        tx.purge_submission_keys(now - 86400)
        tx.prune_gpu_usage(now - 13 * 86400)
        tx.revoke_web_credentials({}, now)
        tx.save_given_up([], now)
    finally:
        trans.rollback()
        conn.close()


BIG = (
    "jobs",
    "job_events",
    "allocations",
    "job_telemetry",
    "job_series",
    "gpu_usage",
    "job_evidence",
)


def plan(engine: Engine, statement: str, parameters: Any) -> list[str]:
    """The statement's plan as lines, those that read a whole big table marked `!`."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
            lines = [str(r[-1]) for r in rows]
        else:
            rows = conn.exec_driver_sql(f"EXPLAIN {statement}", parameters).all()
            lines = [str(r[0]) for r in rows]
    return [("! " if _whole(line) else "  ") + line for line in lines]


def _whole(line: str) -> bool:
    if "TEMP B-TREE" in line:
        return True
    if line.startswith("SCAN ") or "Seq Scan on" in line:
        return any(f" {t}" in line and f" {t}_" not in line for t in BIG)
    return False


def audit(store: Store, now: float, runs: int, only: str | None) -> None:
    engine = store.engine
    for name, call in queries(store, now).items():
        if only and only not in name:
            continue
        seen: list[tuple[str, Any]] = []

        def record(*args: Any, seen: list[tuple[str, Any]] = seen) -> None:
            seen.append((str(args[2]), args[3]))

        event.listen(engine, "before_cursor_execute", record)
        try:
            call()
        finally:
            event.remove(engine, "before_cursor_execute", record)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        print(f"\n== {name}: {statistics.median(times) * 1000:.2f} ms ({engine.dialect.name})")
        for statement, parameters in seen:
            if not statement.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE", "WITH")):
                continue
            if isinstance(parameters, list):
                parameters = parameters[0] if parameters else ()
            print("   " + " ".join(statement.split())[:300])
            for line in plan(engine, statement, parameters):
                print("     " + line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--db", type=Path, default=Path("/tmp/gpuq-plans.db"))
    parser.add_argument("--pg", help="a PostgreSQL URL: also there, in a schema of its own")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--only", help="only the queries whose name holds this")
    args = parser.parse_args()
    url = f"sqlite:///{args.db}"
    now_file = args.db.with_suffix(".now")
    fresh = not args.db.exists()
    store = Store.open(url)
    if fresh:
        now = time.time()
        started = time.perf_counter()
        fill(store, args.jobs, now)
        now_file.write_text(repr(now))
        print(f"filled {args.db} in {time.perf_counter() - started:.0f} s")
    now = float(now_file.read_text())
    audit(store, now, args.runs, args.only)
    if args.pg:
        with pg_schema(args.pg) as pg_url:
            pg = Store.open(pg_url)
            started = time.perf_counter()
            copy_to_pg(store.engine, pg.engine)
            print(f"\ncopied into PostgreSQL in {time.perf_counter() - started:.0f} s")
            audit(pg, now, args.runs, args.only)
            pg.close()
    store.close()


if __name__ == "__main__":
    main()
