"""Large arrays: prints figures, asserts nothing.

    python bench/array_bench.py [--tasks 100000] [--others 1000] [--repeat 5]

Starts `gpuq serve` (coordinator and a local agent with 4 fake GPUs, SQLite in a temporary
GPUQ_HOME) as a process, submits --others held jobs and one held array of --tasks tasks, and
times what users type, each as a `gpuq` process (so a figure includes the CLI's start-up):
  - `gpuq submit -H -a 0-N --wrap true`;
  - `gpuq queue` (medians of --repeat runs);
  - `gpuq cancel ARRAY_TASK` for single tasks still in the array's record (median), and the
    same call through the Python client (the CLI's start-up is most of the former);
  - the coordinator's RSS (VmRSS of the serve process: coordinator and agent together);
  - a restart (SIGTERM, start again) until the first submission is accepted;
  - dispatch latency of a 1-GPU `true` job (submit -> start, by the coordinator's clock) with
    the held array in the queue, against the same with only the other jobs: the pass's cost;
  - `gpuq cancel ARRAY`.
Targets (issue 8, 2-core machine, 100,000 tasks + 1,000 jobs): submit < 2 s, queue < 0.5 s,
cancel ARRAY < 1 s, cancel one task < 50 ms (the client call; the CLI adds its start-up), RSS <
500 MB, restart to first accepted submission < 5 s, pass unaffected.
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
from pathlib import Path

from gpuq.client import Client
from gpuq.config.loading import load_settings
from gpuq.errors import GpuqError


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Server:
    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home, self.env = home, env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start it; seconds until a submission is accepted."""
        began = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpuq.cli.main", "serve", "--fake-gpus", "4"],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.home / "serve.log", "ab"),  # noqa: SIM115
        )
        client = Client(settings=load_settings(None, self.home), timeout=10)
        try:
            while True:
                try:
                    client.submit(wrap="true", hold=True, environ=self.env)
                    return time.perf_counter() - began
                except GpuqError:
                    if self.process.poll() is not None:
                        raise SystemExit("gpuq serve exited; see serve.log") from None
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=60)


def timed(args: list[str], env: dict[str, str]) -> float:
    began = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "gpuq.cli.main", *args], env=env, capture_output=True, text=True
    )
    took = time.perf_counter() - began
    if result.returncode != 0:
        raise SystemExit(f"gpuq {' '.join(args)} failed: {result.stderr.strip()}")
    return took


def median_of(runs: int, args: list[str], env: dict[str, str]) -> float:
    return statistics.median(timed(args, env) for _ in range(runs))


def dispatch(client: Client, env: dict[str, str], runs: int) -> float:
    """Median submit -> start of a 1-GPU `true` job, in seconds, by the coordinator's clock
    (its submit and start times): the scheduling pass that starts it is most of it."""
    times = []
    for _ in range(runs):
        job = client.wait(client.submit(wrap="true", gpus=1, environ=env), timeout=30)
        assert job.start_time is not None, job
        times.append(job.start_time - job.submit_time)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--others", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpuq-array-bench-"))
    home = root / "home"
    home.mkdir(mode=0o700)
    if os.geteuid() == 0:  # root's jobs would run as root: allowed only so
        allow = "allow_root_jobs = true\n"
        (home / "config.toml").write_text(f"[coordinator]\n{allow}[agent]\n{allow}")
    env = {**os.environ, "GPUQ_HOME": str(home)}
    env.pop("GPUQ_CONFIG", None)
    server = Server(home, env)
    try:
        server.start()
        client = Client(settings=load_settings(None, home), timeout=60)
        for _ in range(options.others):
            client.submit(wrap="true", hold=True, environ=env)
        before = dispatch(client, env, options.repeat)
        base_cli = median_of(options.repeat, ["--version"], env)
        submit = timed(["submit", "-H", "-a", f"0-{options.tasks - 1}", "--wrap", "true"], env)
        array = max(j.id for j in client.list(states=["held"]))
        queue = median_of(options.repeat, ["queue"], env)
        one = statistics.median(
            timed(["cancel", f"{array}_{options.tasks - 1 - i}"], env)
            for i in range(options.repeat)
        )
        rpc_one = []
        for i in range(options.repeat, 2 * options.repeat):
            began = time.perf_counter()
            client.cancel(f"{array}_{options.tasks - 1 - i}")
            rpc_one.append(time.perf_counter() - began)
        assert server.process is not None
        rss = rss_mb(server.process.pid)
        after = dispatch(client, env, options.repeat)
        client.close()
        server.stop()
        restart = server.start()
        client = Client(settings=load_settings(None, home), timeout=60)
        queue_after_restart = median_of(options.repeat, ["queue"], env)
        cancel_array = timed(["cancel", str(array)], env)
        states = client.array_states(array)
        client.close()
        print(f"array of {options.tasks} tasks (held) + {options.others} held jobs, 4 fake GPUs")
        print(f"  CLI start-up alone (gpuq --version), median:   {base_cli * 1000:8.0f} ms")
        print(f"  gpuq submit -H -a 0-{options.tasks - 1}:             {submit * 1000:8.0f} ms")
        print(f"  gpuq queue, median:                           {queue * 1000:8.0f} ms")
        print(
            f"  gpuq queue after a restart, median:           {queue_after_restart * 1000:8.0f} ms"
        )
        print(f"  gpuq cancel ARRAY_TASK, median:               {one * 1000:8.0f} ms")
        rpc = statistics.median(rpc_one) * 1000
        print(f"  the same through the Python client, median:   {rpc:8.1f} ms")
        print(f"  gpuq cancel ARRAY:                            {cancel_array * 1000:8.0f} ms")
        print(f"  serve RSS (coordinator + agent):              {rss:8.0f} MB")
        print(f"  restart to first accepted submission:         {restart * 1000:8.0f} ms")
        print(f"  dispatch (submit -> start), median, no array: {before * 1000:8.1f} ms")
        print(f"  the same with the held array in the queue:    {after * 1000:8.1f} ms")
        print(f"  array tasks by state after cancel: {states}")
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
