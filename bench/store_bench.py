"""Job store benchmark: prints figures, asserts nothing (these machines are shared and noisy).

    python bench/store_bench.py [--pg URL] [--jobs 100000] [--inserts 3000]

For each backend: job inserts/s with one transaction per job (each with its event row), and the
latency of "top N pending jobs by priority" with 100,000 pending jobs (median and p95 of 200
queries). Targets (issue 2, 2-core machine): >= 3,000 inserts/s on SQLite, top-N < 5 ms.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, insert, text

from gpuq.domain.codec import spec_to_dict
from gpuq.domain.model import JobSpec, Resources
from gpuq.store.api import Store
from gpuq.store.records import NewJob
from gpuq.store.row_mapping import job_row
from gpuq.store.tables import job_events, jobs

SPEC = JobSpec(
    name="bench",
    script="#!/bin/sh\npython train.py\n",
    workdir="/home/alice/project",
    env={k: v for k, v in os.environ.items() if k.isidentifier()},
    resources=Resources(gpus=1, cpus=4, mem=16 << 30),
)


def bench_inserts(store: Store, count: int) -> float:
    new = NewJob(SPEC, "alice", "normal", 0)
    start = time.perf_counter()
    for i in range(count):
        with store.transaction() as tx:
            tx.add_jobs([new], float(i))
    return count / (time.perf_counter() - start)


def fill_pending(store: Store, count: int) -> None:
    """Bulk-load `count` pending jobs of random priority (not part of the timing)."""
    rng = random.Random(1)
    base = job_row(NewJob(SPEC, "alice", "normal", 0), SPEC_STATE, 0.0)
    for offset in range(0, count, 10_000):
        rows = [
            {**base, "priority": rng.randint(0, 1000), "submit_time": float(i)}
            for i in range(offset, min(count, offset + 10_000))
        ]
        with store.transaction() as tx:
            tx.conn.execute(insert(jobs), rows)
    with store.engine.begin() as conn:
        conn.execute(text("ANALYZE"))


SPEC_STATE = __import__("gpuq.domain.states", fromlist=["JobState"]).JobState.PENDING


def bench_top_n(store: Store, n: int, repeats: int = 200) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        top = store.top_pending(n)
        times.append((time.perf_counter() - start) * 1000)
        assert len(top) == n
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95)]


@contextmanager
def pg_schema(url: str) -> Iterator[str]:
    schema = f"gpuq_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))


def run(label: str, url: str, args: argparse.Namespace, **open_args: str) -> None:
    store = Store.open(url, **open_args)
    rate = bench_inserts(store, args.inserts)
    fill_pending(store, args.jobs)
    lines = [f"{label:<22} inserts, 1 tx/job: {rate:8.0f}/s"]
    for n in (10, 100):
        median, p95 = bench_top_n(store, n)
        lines.append(
            f"{'':<22} top {n:>3} of {args.jobs} pending: median {median:.2f} ms, p95 {p95:.2f} ms"
        )
    print("\n".join(lines), flush=True)
    with store.engine.begin() as conn:
        conn.execute(job_events.delete())
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default=os.environ.get("GPUQ_TEST_PG_URL"))
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--inserts", type=int, default=3000)
    args = parser.parse_args()
    print(f"spec JSON is {len(str(spec_to_dict(SPEC)))} bytes (the submitter's environment)")
    with tempfile.TemporaryDirectory() as folder:
        run("sqlite (sync NORMAL)", f"sqlite:///{folder}/a.db", args)
        run("sqlite (sync FULL)", f"sqlite:///{folder}/b.db", args, sqlite_synchronous="FULL")
    if args.pg:
        with pg_schema(args.pg) as url:
            run("postgresql", url, args)
    else:
        print("postgresql: skipped (no --pg and no GPUQ_TEST_PG_URL)")


if __name__ == "__main__":
    main()
