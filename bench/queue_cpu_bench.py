"""What one `gpuq queue` listing costs the coordinator, in CPU (issue 27: squeue's cost, ~2 ms
for 500 queued jobs). Prints figures, asserts nothing.

    python bench/queue_cpu_bench.py [--pending 500] [--calls 40] [--after-pass 5] [--reps 3]
                                    [--against CHECKOUT] [--profile FILE]

Per checkout (this one, and --against another, e.g. main's, for before/after in one run, the
repetitions interleaved), it fills a fresh SQLite store with one 8-GPU job (`sleep 3600`, it
runs) and --pending 1-GPU jobs that wait behind it (pending, not held: why each waits is part of
every entry), then starts `gpuq coordinator` and `gpuq agent --fake-gpus 8xA100-80GB` as
processes of their own, and lists the queue as `gpuq queue` does (gpuq.Client.list_raw: every
page, to the end) from this process. The coordinator's CPU (the sum of its threads'
/proc/PID/task/*/schedstat, in ns) is read around:
  - repeated: --calls listings back to back (what a `watch gpuq queue` or a script costs);
  - after a pass: one listing --after-pass times, each once a periodic scheduling pass ran
    since the last (every 2 s: a listing typed by a person always comes after one);
  - idle: 2 s of nothing, the coordinator's own background per second.
Medians over --reps repetitions, with the load average, and ratios (this / --against).
--profile FILE: the coordinator of this checkout runs under cProfile during the listings of the
last repetition: FILE.1 the repeated ones, FILE.2... each listing after a pass (pstats files).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_processes import kill_marked

REPO = Path(__file__).resolve().parent.parent
MARKER = "QUEUE_CPU_BENCH_RUN"  # carried by every process of a cluster (jobs too: not GPUQ_*)
PASS_EVERY = 2.0  # gpuq.coordinator.serving.PERIODIC_PASS
# a coordinator that profiles itself between SIGUSR1 (start) and SIGUSR2 (stop, write)
PROFILED = """
import cProfile, runpy, signal, sys
profile, out, made = cProfile.Profile(), sys.argv[1], []
def stop(*_):
    profile.disable()
    made.append(1)
    profile.dump_stats(f"{out}.{len(made)}")
    profile.clear()
signal.signal(signal.SIGUSR1, lambda *_: profile.enable())
signal.signal(signal.SIGUSR2, stop)
sys.argv = ["gpuq", *sys.argv[2:]]
runpy.run_module("gpuq.cli.main", run_name="__main__")
"""


def cpu_ns(pid: int) -> int:
    """The process's CPU time so far, every thread's (ns)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except Exception:
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


class Cluster:
    """A coordinator and an agent of one checkout, on a store of one running job and
    `pending` waiting ones."""

    def __init__(self, checkout: Path, pending: int, profile: str | None) -> None:
        self.checkout = checkout
        self.root = Path(tempfile.mkdtemp(prefix="gpuq-queue-cpu-"))
        self.home = self.root / "home"
        self.home.mkdir(mode=0o700)
        allow = "allow_root_jobs = true\n" if os.geteuid() == 0 else ""
        (self.home / "config.toml").write_text(
            f'[coordinator]\nlisten = "127.0.0.1:{free_port()}"\n'
            f"max_queued_per_user = {pending * 2 + 10}\n{allow}[agent]\n{allow}"
        )
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("GPUQ_", "PYTHON"))},
            "GPUQ_HOME": str(self.home),
            "GPUQ_CLI_HELPER": "off",
            "PYTHONPATH": str(checkout),
            MARKER: self.root.name,
        }
        self._fill(pending)
        self.processes: list[subprocess.Popen[bytes]] = []
        self.profile = profile
        coordinator = ["coordinator"]
        try:
            if profile:
                self.coordinator = self._spawn(
                    ["-c", PROFILED, profile, *coordinator], "coordinator"
                )
            else:
                self.coordinator = self._spawn(["-m", "gpuq.cli.main", *coordinator], "coordinator")
            self._spawn(["-m", "gpuq.cli.main", "agent", "--fake-gpus", "8xA100-80GB"], "agent")
            self.client = self._client()
            wait(
                lambda: self._counts() == (1, pending), 120, "the big job to run, the rest to wait"
            )
        except BaseException:  # a cluster that never came up leaves no process behind
            log = self.root / "coordinator.log"
            if log.exists():
                print(log.read_text(errors="replace")[-2000:])
            self.close()
            raise

    def _fill(self, pending: int) -> None:
        code = f"""
import os, pwd, time
from gpuq.store.api import Store
from gpuq.store.records import NewJob
from gpuq.submission import build_spec
me = pwd.getpwuid(os.geteuid()).pw_name
store = Store.open("sqlite:///{self.home / "gpuq.db"}")
big = build_spec(wrap="sleep 3600", gpus=8, chdir="{self.root}")
small = build_spec(wrap="true", gpus=1, chdir="{self.root}")
now = time.time()
with store.transaction() as tx:  # older: first in the queue, it takes every GPU
    tx.add_jobs([NewJob(big, me, "normal", 0)], now - 600)
with store.transaction() as tx:
    tx.add_jobs([NewJob(small, me, "normal", 0) for _ in range({pending})], now)
store.close()
"""
        # in its own folder: `-c` puts the working folder first on sys.path, ahead of
        # PYTHONPATH, and the bench's may be another checkout
        subprocess.run([sys.executable, "-c", code], env=self.env, cwd=self.root, check=True)

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
        process = subprocess.Popen(
            [sys.executable, *args], cwd=self.root, env=self.env, stdout=log, stderr=log
        )
        self.processes.append(process)
        return process

    def _client(self) -> Any:
        sys.path.insert(0, str(self.checkout))
        try:
            from gpuq.client import Client
            from gpuq.config.loading import load_settings

            wait(lambda: (self.home / "coordinator.json").exists(), 120, "the coordinator")
            return Client(settings=load_settings(home=self.home), timeout=60)
        finally:
            sys.path.remove(str(self.checkout))

    def _counts(self) -> tuple[int, int]:
        jobs = self.client.list_raw()
        return sum(j.state == "running" for j in jobs), sum(j.state == "pending" for j in jobs)

    def listing(self) -> int:
        """A listing as `gpuq queue` asks it: its entries."""
        return len(self.client.list_raw())

    def measure(self, calls: int, after_pass: int, profile: bool) -> dict[str, float]:
        """ms of coordinator CPU: per repeated listing, per listing after a pass, idle/s."""
        pid = self.coordinator.pid
        self.listing()  # warm: the channel, kept entries
        if profile:
            os.kill(pid, signal.SIGUSR1)
        began = cpu_ns(pid)
        for _ in range(calls):
            self.listing()
        repeated = (cpu_ns(pid) - began) / calls / 1e6
        if profile:
            os.kill(pid, signal.SIGUSR2)
        firsts = []
        for _ in range(after_pass):
            time.sleep(PASS_EVERY + 0.3)  # a periodic pass ran meanwhile
            if profile:
                os.kill(pid, signal.SIGUSR1)
            began = cpu_ns(pid)
            self.listing()
            firsts.append((cpu_ns(pid) - began) / 1e6)
            if profile:
                os.kill(pid, signal.SIGUSR2)
        began, started = cpu_ns(pid), time.monotonic()
        time.sleep(2.0)
        idle = (cpu_ns(pid) - began) / 1e6 / (time.monotonic() - started)
        return {
            "repeated listing": repeated,
            "listing after a pass": statistics.median(firsts),
            "idle, per second": idle,
        }

    def close(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        kill_marked(MARKER, self.root.name)  # the fork server and the running job outlive the agent
        shutil.rmtree(self.root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=500)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--after-pass", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another checkout, e.g. main's (before)")
    parser.add_argument("--profile", help="cProfile the repeated listings (this checkout)")
    args = parser.parse_args()
    checkouts = {"this": REPO}
    if args.against:
        checkouts["against"] = args.against.resolve()
    clusters: dict[str, Cluster] = {}
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in checkouts}
    loads = []
    try:
        for name, checkout in checkouts.items():
            profile = args.profile if name == "this" else None
            clusters[name] = Cluster(checkout, args.pending, profile)
            print(f"{name}: {checkout}: 1 running, {args.pending} pending", flush=True)
        for rep in range(args.reps):
            for name, cluster in clusters.items():
                profile = bool(args.profile) and name == "this" and rep == args.reps - 1
                found = cluster.measure(args.calls, args.after_pass, profile)
                for key, value in found.items():
                    figures[name].setdefault(key, []).append(value)
                loads.append(os.getloadavg()[0])
                shown = ", ".join(f"{k} {v:.2f} ms" for k, v in found.items())
                print(f"  rep {rep + 1} {name}: {shown} (load {loads[-1]:.2f})", flush=True)
    finally:
        for cluster in clusters.values():
            cluster.close()
    print(
        f"\ncoordinator CPU, {args.pending} pending jobs, medians of {args.reps} repetitions "
        f"(load average {statistics.median(loads):.2f}, {os.cpu_count()} CPUs)"
    )
    header = f"  {'':28} {'this':>10}"
    if args.against:
        header += f" {'against':>10} {'ratio':>7}"
    print(header)
    for key in figures["this"]:
        ours = statistics.median(figures["this"][key])
        line = f"  {key:28} {ours:7.2f} ms"
        if args.against:
            theirs = statistics.median(figures["against"][key])
            line += f" {theirs:7.2f} ms {ours / theirs:6.2f}x"
        print(line)
    medians = {n: {k: statistics.median(v) for k, v in f.items()} for n, f in figures.items()}
    print(json.dumps(medians))


if __name__ == "__main__":
    main()
