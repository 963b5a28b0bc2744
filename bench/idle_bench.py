"""Idle benchmark: the daemons' CPU with nothing queued; prints figures, asserts nothing.

    python bench/idle_bench.py [--windows 3] [--window 60] [--gpus 8] [--web] [--threads]
                               [--baseline /path/to/another/checkout]

Starts a real coordinator and one agent with fake GPUs (separate processes, as a lab server
runs them, SQLite in a temp GPUQ_HOME, default settings), lets them settle, then measures
over --windows windows of --window seconds each the CPU of each process they keep (the agent's
fork server and whatever else they started), as % of one core: from the threads' schedstat
(nanoseconds) and, as a cross-check, from /proc/PID/stat (utime + stime in 10 ms ticks: 0.017 %
steps over 60 s); and the wakeups (voluntary context switches, summed over threads) per second.
It prints the median of the windows and the load average; --threads, each thread's share.

--baseline runs a second cluster from another checkout (its .venv's python, else this one's
with PYTHONPATH set) at the same time, measured over the same windows, and prints the ratio:
idle CPU barely depends on the machine's load, and running both at once interleaves them
perfectly. --web turns the dashboard on too (on a free loopback port).
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

from gpuq.client import Client
from gpuq.config.loading import load_settings

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread, plus those of reaped children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICKS


def threads(pid: int) -> dict[str, tuple[float, int]]:
    """Per live thread ("tid comm"): (seconds on a CPU, from schedstat: nanoseconds, where
    /proc/PID/stat counts 10 ms ticks; voluntary context switches: how often it slept)."""
    found = {}
    for task in os.scandir(f"/proc/{pid}/task"):
        try:
            ran = int(Path(task.path, "schedstat").read_text().split()[0]) / 1e9
            comm = Path(task.path, "comm").read_text().strip()
            switches = 0
            for line in Path(task.path, "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    switches = int(line.split()[1])
        except OSError:
            continue  # a thread that ended meanwhile
        found[f"{task.name} {comm}"] = (ran, switches)
    return found


def descendants(pid: int) -> list[int]:
    """Every process under pid (the fork server, helpers), not pid itself."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found.extend(children)
        frontier.extend(children)
    return found


def process_name(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


@dataclass
class Cluster:
    """A coordinator and an agent from one checkout, in their own temp GPUQ_HOME."""

    label: str
    python: str
    pythonpath: str | None
    gpus: int
    web: bool
    root: Path | None = None  # set by start (a cluster that never started has none)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gpuq-idle-"))
        home = self.root / "home"
        home.mkdir(mode=0o700)
        root_jobs = "allow_root_jobs = true\n" if os.geteuid() == 0 else ""
        web = 'web_listen = "127.0.0.1:0"\n' if self.web else ""
        (home / "config.toml").write_text(
            f'[coordinator]\nlisten = "127.0.0.1:0"\n{web}{root_jobs}[agent]\n{root_jobs}'
        )
        env = {**os.environ, "GPUQ_HOME": str(home)}
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        gpuq = [self.python, "-m", "gpuq.cli.main"]
        coordinator = subprocess.Popen(
            [*gpuq, "coordinator", "--log-level", "warning"], env=env, cwd=self.root
        )
        self.processes.append(coordinator)
        deadline = time.monotonic() + 60
        while not (home / "coordinator.json").exists():
            if time.monotonic() > deadline or coordinator.poll() is not None:
                raise RuntimeError(f"{self.label}: the coordinator did not start")
            time.sleep(0.05)
        fake = f"{self.gpus}xA100-80GB"
        agent = subprocess.Popen(
            [*gpuq, "agent", "--fake-gpus", fake, "--log-level", "warning"], env=env, cwd=self.root
        )
        self.processes.append(agent)
        client = Client(settings=load_settings(home=home))
        try:
            while not [n for n in client.nodes() if n.state == "up"]:
                if time.monotonic() > deadline or agent.poll() is not None:
                    raise RuntimeError(f"{self.label}: the agent did not come up")
                time.sleep(0.1)
        finally:
            client.close()

    def watched(self) -> dict[str, int]:
        """name -> pid of every process this cluster keeps running."""
        coordinator, agent = (p.pid for p in self.processes)
        named = {"coordinator": coordinator, "agent": agent}
        for root_pid, owner in ((coordinator, "coordinator"), (agent, "agent")):
            for pid in descendants(root_pid):
                try:
                    named[f"{owner}/{process_name(pid)}[{pid}]"] = pid
                except OSError:
                    continue
        return named

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


def snapshot(pids: dict[str, int]) -> dict[str, tuple[float, float, int]]:
    """name -> (CPU seconds from ticks, from the live threads' schedstat, wakeups); with
    --threads, each thread too, as "name/tid comm"."""
    taken = {}
    for name, pid in pids.items():
        try:
            ticks = cpu_seconds(pid)
            per_thread = threads(pid)
        except OSError:
            continue
        taken[name] = (
            ticks,
            sum(t[0] for t in per_thread.values()),
            sum(t[1] for t in per_thread.values()),
        )
        if SHOW_THREADS:
            for thread, (ran, switches) in per_thread.items():
                taken[f"{name}/{thread}"] = (0.0, ran, switches)
    return taken


SHOW_THREADS = False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--window", type=float, default=60.0, help="seconds per window")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds before measuring")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--web", action="store_true", help="with the dashboard on")
    parser.add_argument("--baseline", type=Path, help="another checkout, measured beside this")
    parser.add_argument("--threads", action="store_true", help="each thread's share too")
    args = parser.parse_args()
    global SHOW_THREADS
    SHOW_THREADS = args.threads
    here = Path(__file__).resolve().parent.parent
    clusters = [Cluster("this", sys.executable, str(here), args.gpus, args.web)]
    if args.baseline:
        base = args.baseline.resolve()
        venv = base / ".venv" / "bin" / "python"
        clusters.insert(
            0,
            Cluster(
                "baseline",
                str(venv) if venv.exists() else sys.executable,
                str(base),
                args.gpus,
                args.web,
            ),
        )
    try:
        for cluster in clusters:
            cluster.start()
        time.sleep(args.settle)
        pids = {c.label: c.watched() for c in clusters}
        # per cluster, per process: one (ticks %, schedstat %, wakeups/s) per window
        series: dict[str, dict[str, list[tuple[float, float, float]]]] = {
            c.label: {} for c in clusters
        }
        loads = []
        for _ in range(args.windows):
            before = {label: snapshot(p) for label, p in pids.items()}
            start = time.monotonic()
            time.sleep(args.window)
            after = {label: snapshot(p) for label, p in pids.items()}
            elapsed = time.monotonic() - start
            loads.append(os.getloadavg()[0])
            for label in pids:
                total = [0.0, 0.0, 0.0]
                for name, now in after[label].items():
                    if name not in before[label]:
                        continue
                    rates = tuple(
                        (b - a) / elapsed * (100 if i < 2 else 1)
                        for i, (a, b) in enumerate(zip(before[label][name], now, strict=True))
                    )
                    series[label].setdefault(name, []).append(rates)  # type: ignore[arg-type]
                    if name in pids[label]:  # a process, not one of its threads
                        total = [t + r for t, r in zip(total, rates, strict=True)]
                series[label].setdefault("total", []).append(tuple(total))  # type: ignore[arg-type]
        print(
            f"idle daemons, nothing queued, {args.gpus} fake GPUs"
            f"{', dashboard on' if args.web else ''}: median of {args.windows} windows of "
            f"{args.window:.0f} s (load average 1 min over the windows: "
            f"{statistics.median(loads):.2f}; now {' '.join(f'{x:.2f}' for x in os.getloadavg())})"
        )
        print(
            "  % of a core from the threads' schedstat (ns; threads that ended are missed), "
            "from /proc/PID/stat (10 ms ticks, all), and wakeups/s (voluntary switches)"
        )
        medians: dict[str, float] = {}
        for label, by_process in series.items():
            print(f"  {label}:")
            totals = by_process.pop("total")
            for name, values in [*by_process.items(), ("total", totals)]:
                ticks = statistics.median(v[0] for v in values)
                ran = statistics.median(v[1] for v in values)
                rate = statistics.median(v[2] for v in values)
                shown = f"{ran:7.3f} %  ({ticks:5.2f} % by ticks)" if ticks else f"{ran:7.3f} %"
                print(f"    {name:<44} {shown:<28} {rate:7.1f} wakeups/s")
                if name == "total":
                    medians[label] = ran
        if args.baseline and medians.get("this"):
            ratio = medians["baseline"] / medians["this"]
            print(
                f"  total: baseline {medians['baseline']:.3f} %, this {medians['this']:.3f} % "
                f"of a core: {ratio:.1f}x less"
            )
    finally:
        for cluster in clusters:
            cluster.stop()


if __name__ == "__main__":
    main()
