"""Bulk verbs benchmark: prints figures, asserts nothing.

    python bench/bulk_bench.py [--jobs 500] [--runs 5] [--array 10000] [--cli "gpuq"]

Starts a real coordinator (SQLite in a temp GPUQ_HOME, no agent: released jobs stay pending,
so what is timed is the request, its one store transaction and its one scheduling pass), submits
--jobs held jobs over one Client stream, then times as processes (CLI included, median of --runs):
  1. `gpuq release <ids>` and `gpuq hold <ids>` of all of them;
  2. `gpuq release --name PATTERN` and `gpuq hold --name PATTERN` (the same jobs by filter);
  3. `gpuq cancel <ids>` of them, and `gpuq cancel ARRAY` of an --array task array;
with `python3 -c pass` in the same run for scale. Target (issue 13): release of 500 < 0.3 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gpuq.client import Client
from gpuq.config.loading import load_settings
from gpuq.domain.array_specs import ArraySpec
from gpuq.submission import build_spec


def timed(command: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:6])}...: exit {done.returncode}: {done.stderr}")
    return took


def median_of(
    runs: int, command: list[str], undo: list[str], env: dict[str, str], cwd: Path
) -> float:
    """Median wall of `command`, running `undo` (untimed) after each run."""
    walls = []
    for _ in range(runs):
        walls.append(timed(command, env, cwd))
        timed(undo, env, cwd)
    return statistics.median(walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--array", type=int, default=10_000)
    parser.add_argument(
        "--cli", default=f"{sys.executable} -m gpuq.cli.main", help="the gpuq command line"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpuq-bulk-bench-"))
    home = root / "home"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text(
        '[coordinator]\nlisten = "127.0.0.1:0"\nallow_root_jobs = true\n'
        f"max_queued_per_user = {args.jobs + args.array + 100}\n"
    )
    env = {**os.environ, "GPUQ_HOME": str(home)}
    gpuq = args.cli.split()
    coordinator = subprocess.Popen(
        [*gpuq, "coordinator", "--log-level", "warning"], env=env, cwd=root
    )
    client = None
    try:
        while not (home / "coordinator.json").exists():
            time.sleep(0.05)
        client = Client(settings=load_settings(home=home))
        while True:
            try:
                client.nodes()
                break
            except Exception:
                time.sleep(0.05)
        spec = build_spec(wrap="true", gpus=0, hold=True, name="bulkbench", chdir=str(root))
        start = time.perf_counter()
        ids = [str(client.submit_spec(spec)[0]) for _ in range(args.jobs)]
        submitted = time.perf_counter() - start
        print(f"submitted {args.jobs} held jobs over one stream in {submitted:.2f} s")
        baseline = statistics.median(
            timed([sys.executable, "-c", "pass"], env, root) for _ in range(args.runs)
        )
        print(f"python3 -c pass                      {baseline * 1000:7.0f} ms")

        def row(label: str, count: str, measure: Callable[[], float]) -> None:
            try:
                print(f"{label:<36} {measure() * 1000:7.0f} ms  ({count})")
            except SystemExit as exc:  # e.g. an older gpuq without the flag
                print(f"{label:<36}  failed: {exc}")

        def median(command: list[str], undo: list[str]) -> Callable[[], float]:
            return lambda: median_of(args.runs, command, undo, env, root)

        jobs = f"{args.jobs} jobs"
        release, hold = [*gpuq, "release", *ids], [*gpuq, "hold", *ids]
        row("gpuq release <ids>", jobs, median(release, hold))  # held again after each
        timed(release, env, root)
        row("gpuq hold <ids>", jobs, median(hold, release))
        timed(hold, env, root)
        by_name = [*gpuq, "release", "--name", "bulkbench"]
        row("gpuq release --name bulkbench", jobs, median(by_name, hold))
        row(
            "gpuq cancel <ids>",
            jobs + ", one run",
            lambda: timed([*gpuq, "cancel", *ids], env, root),
        )
        array = replace(spec, array=ArraySpec(tuple(range(args.array))))
        array_id = str(client.submit_spec(array)[0])
        tasks = f"{args.array} tasks, one run"
        row("gpuq release ARRAY", tasks, lambda: timed([*gpuq, "release", array_id], env, root))
        row("gpuq cancel ARRAY", tasks, lambda: timed([*gpuq, "cancel", array_id], env, root))
    finally:
        if client is not None:
            client.close()
        coordinator.terminate()
        coordinator.wait(10)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
