"""Dispatch and drain, end to end: prints figures, asserts nothing.

    python bench/dispatch_bench.py [--jobs 500] [--reps 3] [--against CHECKOUT ...]

Starts a real coordinator and one agent with 8 fake GPUs (separate processes, SQLite in a temp
GPUQ_HOME, run with each checkout's own `.venv/bin/python`) and measures, with 1-GPU jobs:
  1. submit -> the job's FIRST COMMAND on an idle queue, through the Python client and through
     the CLI (`gpuq submit --wrap ...` as a process, through the warm CLI helper): the job's
     first command is a tiny compiled program that prints CLOCK_REALTIME into the job's
     output, compared with the wall clock just before the submit call (or the CLI process's
     spawn); p50 of --samples jobs, one at a time, the queue idle in between;
  2. the drain of --jobs released jobs: that many held 1-GPU `true` jobs are submitted, then
     released with one call; from the release call to the last end recorded (its `completed`
     event on a Watch stream), in jobs/s;
  3. the daemons' CPU per job in that drain: coordinator + agent + fork server + supervisors
     (/proc utime+stime deltas; the fork server's reaped children count the supervisors and,
     through them, the jobs' own `true`, about 0.6 ms a job here).
Each checkout (this one, then every --against, e.g. a worktree of main with its own .venv)
gets its own cluster per repetition, the repetitions interleaved so that a busy machine weighs
on every checkout alike; medians of the repetitions, the load average with every figure, and
each other checkout's ratio to this one. Targets (issue 27, 2-core machine): client <= 5 ms,
CLI <= 15 ms, drain >= 1,000 jobs/s, <= 2 ms of daemon CPU a job.
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
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from queue_bench import Events, children_of, cpu_seconds  # noqa: E402  (bench/ is on sys.path)

from gpuq.cli.fast.helper_control import stop_helpers  # noqa: E402
from gpuq.client import Client  # noqa: E402
from gpuq.config.loading import load_settings  # noqa: E402
from gpuq.domain.states import JobState  # noqa: E402
from gpuq.submission import build_spec  # noqa: E402

QUIET = ("--log-level", "warning")
STAMP_C = r"""
#include <stdio.h>
#include <time.h>
int main(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    printf("%ld.%09ld\n", (long)t.tv_sec, t.tv_nsec);
    return 0;
}
"""


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


@dataclass
class Figures:
    """One checkout's figures, a list per row (one entry per repetition)."""

    client_ms: list[float] = field(default_factory=list)
    cli_ms: list[float] = field(default_factory=list)
    drain: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    parts: list[tuple[float, float, float]] = field(default_factory=list)


class Cluster:
    """A coordinator and an agent of one checkout, in a temp folder."""

    def __init__(self, checkout: Path, root: Path, gpus: int) -> None:
        self.checkout = checkout
        self.root = root
        python = checkout / ".venv" / "bin" / "python"
        self.gpuq_cli = str(checkout / ".venv" / "bin" / "gpuq")
        home = root / "home"
        home.mkdir(mode=0o700)
        runtime = root / "runtime"  # the CLI helpers' folder, ours alone
        runtime.mkdir(mode=0o700)
        self.runtime = runtime
        root_jobs = "allow_root_jobs = true\n" if os.geteuid() == 0 else ""
        (home / "config.toml").write_text(
            f'[coordinator]\nlisten = "127.0.0.1:0"\n{root_jobs}[agent]\n{root_jobs}'
        )
        # each checkout's own code: no PYTHONPATH of the benchmark's
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.env.update(GPUQ_HOME=str(home), XDG_RUNTIME_DIR=str(runtime))
        main = [str(python), "-m", "gpuq.cli.main"]
        self.coordinator = subprocess.Popen(
            [*main, "coordinator", "--log-level", "warning"], env=self.env, cwd=root
        )
        deadline = time.monotonic() + 60
        while not (home / "coordinator.json").exists():
            if time.monotonic() > deadline:
                raise SystemExit("the coordinator did not start")
            time.sleep(0.05)
        self.agent = subprocess.Popen(
            [*main, "agent", "--fake-gpus", f"{gpus}xA100-80GB", "--cpus", str(4 * gpus), *QUIET],
            env=self.env,
            cwd=root,
        )
        self.client = Client(settings=load_settings(home=home))
        while not [n for n in self.client.nodes() if n.state == "up"]:
            if time.monotonic() > deadline:
                raise SystemExit("the agent did not register")
            time.sleep(0.05)
        self.events = Events(self.client)

    def daemons(self) -> list[int]:
        """coordinator, agent, the agent's fork server (the supervisors' parent)."""
        return [self.coordinator.pid, self.agent.pid, *children_of(self.agent.pid)]

    def close(self) -> None:
        self.client.close()
        stop_helpers(self.runtime / "gpuq")
        for process in (self.agent, self.coordinator):
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()


def first_command_at(path: Path) -> float:
    """The CLOCK_REALTIME the job's first command printed."""
    deadline = time.monotonic() + 10
    while True:
        text = path.read_text() if path.exists() else ""
        if text.strip():
            return float(text.split()[0])
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} stayed empty")
        time.sleep(0.002)


def client_dispatch(cluster: Cluster, stamp: str, samples: int) -> list[float]:
    """ms from just before Client.submit_spec to the job's first command, one job at a time."""
    out = cluster.root / "stamps"
    out.mkdir(exist_ok=True)
    delays = []
    for n in range(samples):
        path = out / f"client-{n}.out"
        spec = build_spec(wrap=stamp, gpus=1, chdir=str(cluster.root), output=str(path))
        time.sleep(0.05)  # an idle queue
        began = time.time()
        [job_id] = cluster.client.submit_spec(spec)
        cluster.events.wait(job_id, JobState.COMPLETED)
        delays.append((first_command_at(path) - began) * 1000)
    return delays


def cli_dispatch(cluster: Cluster, stamp: str, samples: int) -> list[float]:
    """ms from spawning `gpuq submit --wrap STAMP` to the job's first command."""
    out = cluster.root / "stamps"
    out.mkdir(exist_ok=True)
    cli = cluster.gpuq_cli
    # the first call starts the warm helper; wait for it (and its spare) before timing
    for _ in range(3):
        subprocess.run([cli, "status"], env=cluster.env, cwd=cluster.root, capture_output=True)
        time.sleep(0.5)
    delays = []
    for n in range(samples):
        path = out / f"cli-{n}.out"
        command = [cli, "submit", "--gpus", "1", "--output", str(path), "--wrap", stamp]
        time.sleep(0.3)  # an idle queue, and the helper's spare ready
        began = time.time()
        done = subprocess.run(
            command, env=cluster.env, cwd=cluster.root, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(f"gpuq submit failed: {done.stderr}")
        job_id = int(done.stdout.split()[-1])
        cluster.events.wait(job_id, JobState.COMPLETED)
        delays.append((first_command_at(path) - began) * 1000)
    return delays


def drain(cluster: Cluster, jobs: int) -> tuple[float, list[float]]:
    """jobs/s from one release call of `jobs` held jobs to the last end recorded; CPU seconds
    of coordinator, agent, and the fork server (with supervisors and jobs) meanwhile."""
    held = build_spec(wrap="true", gpus=1, hold=True, chdir=str(cluster.root))
    ids = [cluster.client.submit_spec(held)[0] for _ in range(jobs)]
    time.sleep(1.0)  # the submissions' work done
    pids = cluster.daemons()
    before = [cpu_seconds(p) for p in pids]
    began = time.perf_counter()
    cluster.client.release(*ids)
    last = max(cluster.events.wait(i, JobState.COMPLETED, 300) for i in ids)
    time.sleep(0.3)  # the fork server reaps the last supervisors
    spent = [cpu_seconds(p) - b for p, b in zip(pids, before, strict=True)]
    return jobs / (last - began), spent


def stamp_program(root: Path) -> str:
    source = root / "stamp.c"
    source.write_text(STAMP_C)
    binary = root / "stamp"
    try:
        subprocess.run(["cc", "-O2", "-o", str(binary), str(source)], check=True)
        return str(binary)
    except (OSError, subprocess.CalledProcessError):
        return "date +%s.%N"  # no compiler: one more fork+exec, about 1 ms


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--samples", type=int, default=30, help="client dispatch samples")
    parser.add_argument("--cli-samples", type=int, default=15)
    parser.add_argument("--against", type=Path, action="append", default=[])
    parser.add_argument("--only", choices=["dispatch", "drain"], default=None)
    args = parser.parse_args()
    checkouts = [REPO, *(p.resolve() for p in args.against)]
    labels = [c.name for c in checkouts]
    figures = {c: Figures() for c in checkouts}
    work = Path(tempfile.mkdtemp(prefix="gpuq-dispatch-"))
    stamp = stamp_program(work)
    print(f"{load()}; {args.reps} repetitions, checkouts: {', '.join(labels)}", flush=True)
    try:
        for rep in range(args.reps):
            for checkout in checkouts:
                root = work / f"{checkout.name}-{rep}"
                root.mkdir()
                cluster = Cluster(checkout, root, args.gpus)
                got = figures[checkout]
                try:
                    time.sleep(0.5)
                    line = [f"rep {rep + 1} {checkout.name}:"]
                    if args.only != "drain":
                        got.client_ms.append(median(client_dispatch(cluster, stamp, args.samples)))
                        got.cli_ms.append(median(cli_dispatch(cluster, stamp, args.cli_samples)))
                        line.append(
                            f"client p50 {got.client_ms[-1]:.1f} ms, CLI p50 "
                            f"{got.cli_ms[-1]:.1f} ms;"
                        )
                    if args.only != "dispatch":
                        rate, spent = drain(cluster, args.jobs)
                        per_job = [s / args.jobs * 1000 for s in spent]
                        got.drain.append(rate)
                        got.cpu_ms.append(sum(per_job))
                        forks = sum(per_job[2:])
                        got.parts.append((per_job[0], per_job[1], forks))
                        line.append(
                            f"drain {rate:.0f} jobs/s, CPU {sum(per_job):.2f} ms/job "
                            f"(coordinator {per_job[0]:.2f}, agent {per_job[1]:.2f}, fork "
                            f"server + supervisors + jobs {forks:.2f});"
                        )
                    print(" ".join(line), load(), flush=True)
                finally:
                    cluster.close()
        report(checkouts, figures, args.jobs)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(checkouts: list[Path], figures: dict[Path, Figures], jobs: int) -> None:
    rows = [
        ("submit -> job's first command, Python client, p50 (ms)", "client_ms"),
        ("submit -> job's first command, CLI, p50 (ms)", "cli_ms"),
        (f"drain of {jobs} released jobs (jobs/s)", "drain"),
        ("daemon CPU per job (ms): coordinator+agent+fork server+supervisors", "cpu_ms"),
    ]
    print(f"\nmedians of the repetitions ({load()}):")
    head = "".join(f" {c.name:>21}" for c in checkouts)
    ratios = "".join(f" {c.name + '/' + checkouts[0].name:>23}" for c in checkouts[1:])
    print(f"{'measure':<70}{head}{ratios}")
    for label, attribute in rows:
        values = [median(getattr(figures[c], attribute)) for c in checkouts]
        if all(v != v for v in values):  # nan: not measured
            continue
        cells = "".join(f" {v:>21.2f}" for v in values)
        rel = "".join(f" {v / values[0]:>23.2f}" for v in values[1:])
        print(f"{label:<70}{cells}{rel}")
    for c in checkouts:
        if figures[c].parts:
            parts = [median([p[i] for p in figures[c].parts]) for i in range(3)]
            print(
                f"  {c.name}: CPU ms/job: coordinator {parts[0]:.2f}, agent {parts[1]:.2f}, "
                f"fork server + supervisors + jobs {parts[2]:.2f}"
            )


if __name__ == "__main__":
    main()
