"""End-to-end queue benchmark: prints figures, asserts nothing.

    python bench/queue_bench.py [--jobs 500] [--gpus 8]

Starts a real coordinator and one agent with fake GPUs (separate processes, SQLite in a temp
GPUQ_HOME; job folders where the agent keeps them by default: /dev/shm when run as root, as on
a lab server; the jobs' output files in the temp folder), then measures, with 1-GPU jobs that
run `true`:
  1. dispatch latency on an idle node: submit -> running event, and submit -> completed event;
  2. throughput: first submit to last completion of --jobs jobs, and CPU per job (coordinator +
     agent + fork server + supervisors + jobs, from /proc);
  3. submissions/s through the Python client (jobs held, so nothing else runs);
  4. wall time of `gpuq status` and `gpuq submit` as processes.
Targets (issue 3, 2-core machine): p50 dispatch < 20 ms, >= 300 jobs/s, >= 1,000 submits/s,
CLI < 150 ms.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gpuq.client import Client
from gpuq.config.loading import load_settings
from gpuq.domain.array_specs import ArraySpec
from gpuq.domain.states import JobState
from gpuq.errors import GpuqError
from gpuq.submission import build_spec

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime + reaped children's, of one process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICKS


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


class Events:
    """A Watch stream in a thread: when each job reached each state."""

    def __init__(self, client: Client) -> None:
        self.seen: dict[tuple[int, JobState], float] = {}
        self.cond = threading.Condition()
        threading.Thread(target=self._run, args=(client,), daemon=True).start()

    def _run(self, client: Client) -> None:
        try:
            for event in client.watch():
                with self.cond:
                    self.seen[(event.job_id, event.to_state)] = time.perf_counter()
                    self.cond.notify_all()
        except GpuqError:
            pass  # the benchmark closed its client

    def wait(self, job_id: int, state: JobState, timeout: float = 60) -> float:
        with self.cond:
            ok = self.cond.wait_for(lambda: (job_id, state) in self.seen, timeout)
            if not ok:
                raise TimeoutError(f"job {job_id} never reached {state}")
            return self.seen[(job_id, state)]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--submits", type=int, default=3000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpuq-bench-"))
    home = root / "home"
    home.mkdir(mode=0o700)
    # as root (CI, a lab server's admin) the jobs would run as root: allowed only so
    root_jobs = "allow_root_jobs = true\n" if os.geteuid() == 0 else ""
    (home / "config.toml").write_text(
        f'[coordinator]\nlisten = "127.0.0.1:0"\n{root_jobs}[agent]\n{root_jobs}'
    )
    env = {**os.environ, "GPUQ_HOME": str(home)}
    gpuq = [sys.executable, "-m", "gpuq.cli.main"]
    coordinator = subprocess.Popen(
        [*gpuq, "coordinator", "--log-level", "warning"], env=env, cwd=root
    )
    while not (home / "coordinator.json").exists():
        time.sleep(0.05)
    # 8 fake GPUs, and more CPUs offered than this 2-core machine has: 8 `true` jobs at once
    agent = subprocess.Popen(
        [
            *gpuq,
            "agent",
            "--fake-gpus",
            f"{args.gpus}xA100-80GB",
            "--cpus",
            str(4 * args.gpus),
            "--log-level",
            "warning",
        ],
        env=env,
        cwd=root,
    )
    client = Client(settings=load_settings(home=home))
    while not [n for n in client.nodes() if n.state == "up"]:
        time.sleep(0.05)
    spec = build_spec(wrap="true", gpus=1, chdir=str(root))
    events = Events(client)
    try:
        time.sleep(0.5)
        dispatch(client, events, spec)
        pids = [coordinator.pid, agent.pid]
        one_by_one = lambda: [client.submit_spec(spec)[0] for _ in range(args.jobs)]  # noqa: E731
        throughput("one submit per job", one_by_one, events, pids)
        array = replace(spec, array=ArraySpec(tuple(range(args.jobs))))
        throughput("one array", lambda: client.submit_spec(array), events, pids)
        submissions(client, root, args.submits)
        cli_times(gpuq, env, root)
    finally:
        client.close()
        for process in (agent, coordinator):
            process.terminate()
            process.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def dispatch(client: Client, events: Events, spec: object) -> None:
    to_running, to_done = [], []
    for _ in range(60):
        start = time.perf_counter()
        [job_id] = client.submit_spec(spec)  # type: ignore[arg-type]
        to_running.append((events.wait(job_id, JobState.RUNNING) - start) * 1000)
        to_done.append((events.wait(job_id, JobState.COMPLETED) - start) * 1000)
        time.sleep(0.02)
    print(
        f"dispatch on an idle node (60 jobs): submit->running p50 {pct(to_running, 0.5):.1f} ms, "
        f"p95 {pct(to_running, 0.95):.1f} ms; submit->completed p50 {pct(to_done, 0.5):.1f} ms, "
        f"p95 {pct(to_done, 0.95):.1f} ms"
    )


def throughput(
    label: str, submit: Callable[[], list[int]], events: Events, pids: list[int]
) -> None:
    """From the first submit to the last completion, and the CPU each part spent per job."""
    watched = pids + children_of(pids[1])  # coordinator, agent, the agent's fork server
    before = [cpu_seconds(p) for p in watched]
    bench_before = time.process_time()
    start = time.perf_counter()
    ids = submit()
    submitted = time.perf_counter()
    last = max(events.wait(i, JobState.COMPLETED, 120) for i in ids)
    elapsed = last - start
    bench_cpu = time.process_time() - bench_before
    time.sleep(0.5)  # let the fork server reap the last supervisors
    spent = [cpu_seconds(p) - b for p, b in zip(watched, before, strict=True)]
    count = len(ids)
    names = ["coordinator", "agent", "fork server + supervisors + jobs"]
    parts = ", ".join(f"{n} {s / count * 1000:.1f}" for n, s in zip(names, spent, strict=False))
    print(
        f"throughput, {label}: {count} jobs in {elapsed:.2f} s = {count / elapsed:.0f} jobs/s "
        f"(submitted in {submitted - start:.2f} s); CPU per job {sum(spent) / count * 1000:.1f} "
        f"ms ({parts}) + {bench_cpu / count * 1000:.1f} ms in the client"
    )


def submissions(client: Client, root: Path, count: int) -> None:
    held = build_spec(wrap="true", gpus=1, hold=True, chdir=str(root))
    start = time.perf_counter()
    for _ in range(count):
        client.submit_spec(held)
    sequential = count / (time.perf_counter() - start)
    threads = 4

    def worker() -> None:
        for _ in range(count // threads):
            client.submit_spec(held)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    start = time.perf_counter()
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    parallel = (count // threads * threads) / (time.perf_counter() - start)
    print(
        f"submissions through the Python client: {sequential:.0f}/s from one thread, "
        f"{parallel:.0f}/s from {threads} threads sharing a client"
    )
    client.cancel(*(str(j.id) for j in client.list(states=["held"])))


def cli_times(gpuq: list[str], env: dict[str, str], root: Path) -> None:
    command = shutil.which("gpuq") or ""
    base = [command] if command else gpuq
    for label, extra in (
        ("gpuq status", ["status"]),
        ("gpuq submit", ["submit", "--hold", "--wrap", "true"]),
    ):
        times = []
        for _ in range(15):
            start = time.perf_counter()
            subprocess.run(
                [*base, *extra], env=env, cwd=root, check=True, stdout=subprocess.DEVNULL
            )
            times.append((time.perf_counter() - start) * 1000)
        print(
            f"{label} as a process: median {statistics.median(times):.0f} ms, "
            f"min {min(times):.0f} ms (15 runs)"
        )


if __name__ == "__main__":
    main()
