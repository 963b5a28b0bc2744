"""Faults (issue 9's acceptance): prints figures, asserts nothing.

    python bench/faults_bench.py [--part submit|pgrestart|agentdown|all] [--keep]

Every part starts a real coordinator (`gpuq coordinator`) and one agent with fake GPUs
(`gpuq agent --fake-gpus 4 --cpus 8`, reaching the coordinator through GPUQ_HOME's socket) as
processes, each with a temporary GPUQ_HOME and config.toml; every process (supervisors and
jobs too) carries a marker in its environment and whatever still carries it is killed at the
end, on failure too.

  1. submit: a client thread submits 1,000 `true` jobs (names s0..s999, one request key per
     name) while the coordinator is killed with SIGKILL three times (after about 250, 500 and
     750 acknowledged submissions) and started again at once. Then, once no job is live:
     acknowledged jobs lost (an id the client got back that the store lacks), duplicated (a
     name held by more than one job), failed without having run (failed/cancelled/node_fail
     with no start time, or node_fail at all) and completed. On SQLite and on PostgreSQL (a
     fresh database on --pg-url's server, dropped at the end).
  2. pgrestart: a private PostgreSQL cluster (initdb/pg_ctl as the postgres user; needs root),
     600 `sleep 0.05` jobs, PostgreSQL restarted twice (pg_ctl restart -m fast, after about
     1/3 and 2/3 of the jobs completed): how many complete with the same coordinator (pid),
     and the wall time.
  3. agentdown: 4 one-GPU jobs that run 130 s; the agent is killed (SIGKILL) 5 s in, kept
     down 120 s, started again (default heartbeat_timeout 300 s, fence_time 240 s): how many
     complete with exit 0, and how many end node_fail.

Targets (issue 9): submit: 0 lost, 0 duplicated, 0 failed without running, all 1,000 completed
(each backend); pgrestart: 600/600 completed, the coordinator never restarted; agentdown: 4/4
completed (exit 0), 0 node_fail.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

# the private PostgreSQL cluster is the store-blink test's (one definition)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))
from bench_processes import kill_marked
from e2e_cluster import free_port, root_jobs_allowed
from private_postgres import PrivatePostgres, pg_bin

from gpuq.client import Client
from gpuq.config.loading import load_settings
from gpuq.domain.model import Job
from gpuq.domain.states import JobState
from gpuq.errors import GpuqError, ServerUnavailable, StorageUnavailable

T = TypeVar("T")
MARKER = "GPUQ_FAULTS_BENCH"
SHARED_PG = os.environ.get("GPUQ_TEST_PG_URL") or "postgresql://postgres@127.0.0.1:5432/test"


# ---- helpers ------------------------------------------------------------------------------


def wait_for(condition: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = condition()
        except GpuqError as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last  # type: ignore[no-any-return]
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


class Cluster:
    """A coordinator and one agent (node `a`) as processes, in root/home."""

    def __init__(self, root: Path, config: str = "") -> None:
        self.root = root
        self.home = root / "home"
        self.home.mkdir(parents=True, mode=0o700)
        self.out = root / "out"  # the jobs' output files
        self.out.mkdir()
        self.marker = uuid.uuid4().hex
        self.env = {**os.environ, "GPUQ_HOME": str(self.home), MARKER: self.marker}
        self.env.pop("GPUQ_CONFIG", None)
        self.env.pop("GPUQ_DATABASE_URL", None)
        self.env.pop("GPUQ_COORDINATOR", None)
        (self.home / "config.toml").write_text(
            f'[coordinator]\nlisten = "127.0.0.1:{free_port()}"\n' + root_jobs_allowed(config)
        )
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.agent: subprocess.Popen[bytes] | None = None
        self._client: Client | None = None

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{log_name}.log", "ab")  # noqa: SIM115 - lives with the process
        return subprocess.Popen(
            [sys.executable, "-m", "gpuq.cli.main", "--home", str(self.home), *args],
            cwd=self.root,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def start_coordinator(self, timeout: float = 60) -> float:
        """Start it (again while a dead one's store lock lingers); seconds to a first RPC."""
        began = time.monotonic()
        address_file = self.home / "coordinator.json"
        while True:
            address_file.unlink(missing_ok=True)
            self.coordinator = self._spawn(["coordinator", "--log-level", "info"], "coordinator")
            while not address_file.exists() and self.coordinator.poll() is None:
                time.sleep(0.01)
            if self.coordinator.poll() is None:
                break
            if time.monotonic() - began > timeout:
                raise RuntimeError(f"the coordinator exits ({self.coordinator.returncode})")
            time.sleep(0.2)  # e.g. exit 3: the dead one's store lock is not yet free
        wait_for(lambda: self.client().nodes() is not None, timeout, "a first RPC")
        return time.monotonic() - began

    def start_agent(self, fake_gpus: str = "4xA100-80GB", cpus: int = 8) -> None:
        args = ["agent", "--node-name", "a", "--fake-gpus", fake_gpus, "--cpus", str(cpus)]
        self.agent = self._spawn([*args, "--log-level", "info"], "agent")
        self.wait_node_up()

    def wait_node_up(self, timeout: float = 60) -> None:
        def ready() -> bool:
            node = {n.name: n for n in self.client().nodes()}.get("a")
            return node is not None and node.state == "up" and node.reason != "agent not connected"

        wait_for(ready, timeout, "node a to be up")

    @staticmethod
    def kill(process: subprocess.Popen[bytes] | None) -> None:
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(10)

    def client(self) -> Client:
        if self._client is None:
            self._client = Client(settings=load_settings(home=self.home), timeout=10)
        return self._client

    def submit(self, client: Client, command: str, **options: Any) -> int:
        options.setdefault("environ", self.env)
        options.setdefault("chdir", str(self.root))
        options.setdefault("output", str(self.out / "gpuq-%j.out"))
        return client.submit(wrap=command, **options)

    def all_jobs(self) -> list[Job]:
        client = self.client()
        return [*client.list(), *client.list(finished=True, limit=1_000_000)]

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
        for process in (self.agent, self.coordinator):
            if process is not None and process.poll() is None:
                process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(5)
                self.kill(process)
        kill_marked(MARKER, self.marker)
        with contextlib.suppress(Exception):
            shutil.rmtree(load_settings(home=self.home).agent_run_root, ignore_errors=True)


def history(client: Client, job_id: int) -> str:
    try:
        _, events = client.detail(job_id)
    except GpuqError as exc:
        return f"(no detail: {exc})"
    return "; ".join(f"{e.to_state.value}: {e.reason}" for e in events)


def describe(job: Job) -> str:
    result = job.result
    ended = f" exit {result.exit_code} signal {result.signal}" if result else ""
    return (
        f"job {job.id} name {job.name} state {job.state.value}{ended} start "
        f"{job.start_time} requeues {job.requeue_count} "
        f"reason {job.reason!r}"
    )


def log_lines(text: str, needles: list[str], limit: int = 20) -> list[str]:
    found = [line for line in text.splitlines() if any(n in line for n in needles)]
    return found[:limit]


# ---- 1. submit: kill -9 of the coordinator during 1,000 submissions ---------------------------


def part_submit(root: Path, backend: str, pg_url: str, count: int) -> None:
    config = "heartbeat_interval = 0.5\n"
    database = None
    admin_url = ""
    if backend == "postgresql":
        import psycopg
        from sqlalchemy.engine import make_url

        base = make_url(pg_url)
        database = f"gpuq_faults_bench_{uuid.uuid4().hex[:10]}"
        admin_url = base.set(drivername="postgresql").render_as_string(False)
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
        url = base.set(drivername="postgresql", database=database).render_as_string(False)
        config += f'database_url = "{url}"\n'
    cluster = Cluster(root / f"submit-{backend}", config)
    try:
        cluster.start_coordinator()
        cluster.start_agent()
        run = uuid.uuid4().hex[:8]
        acked: dict[int, int] = {}  # index -> the id the client got back
        raised: list[str] = []  # errors the client raised (then tried again, same key)
        other: list[str] = []
        latency: list[float] = []  # seconds per acknowledged submission (its retries included)
        submitter = Client(settings=load_settings(home=cluster.home), timeout=10)

        def submit_all() -> None:
            for i in range(count):
                while True:
                    sent = time.monotonic()
                    try:
                        acked[i] = cluster.submit(
                            submitter, "true", name=f"s{i}", request_key=f"{run}-s{i}"
                        )
                        latency.append(time.monotonic() - sent)
                        break
                    except (ServerUnavailable, StorageUnavailable) as exc:
                        raised.append(f"s{i}: {type(exc).__name__}: {exc}")
                        time.sleep(0.2)
                    except GpuqError as exc:
                        other.append(f"s{i}: {type(exc).__name__}: {exc}")
                        break

        began = time.monotonic()
        thread = threading.Thread(target=submit_all, daemon=True)
        thread.start()
        restarts = []
        for kill_at in (count // 4, count // 2, 3 * count // 4):
            while len(acked) < kill_at and thread.is_alive():
                time.sleep(0.001)
            at = len(acked)
            Cluster.kill(cluster.coordinator)
            restarts.append((at, cluster.start_coordinator()))
        thread.join(600)
        submitted = time.monotonic() - began
        submitter.close()
        wait_for(lambda: not cluster.client().list(), 600, "no live job")
        drained = time.monotonic() - began
        jobs = [j for j in cluster.all_jobs() if j.name.startswith("s")]
        by_id = {j.id: j for j in jobs}
        names = collections.Counter(j.name for j in jobs)
        lost = sorted(i for i in acked.values() if i not in by_id)
        duplicated = {n: c for n, c in names.items() if c > 1}
        never_ran = [
            j
            for j in jobs
            if j.state is JobState.NODE_FAIL
            or (
                j.state in (JobState.FAILED, JobState.CANCELLED, JobState.NODE_FAIL)
                and j.start_time is None
            )
        ]
        states = collections.Counter(j.state.value for j in jobs)
        unacked = sorted(set(range(count)) - set(acked))
        print(f"submit, {backend}: {count} `true` jobs, coordinator killed -9 three times")
        for at, took in restarts:
            print(f"  killed after {at} acknowledged; restarted, first RPC after {took:.2f} s")
        print(
            f"  submitted in {submitted:.1f} s, no job live after {drained:.1f} s; client "
            f"errors retried with the same key: {len(raised)}; other errors: {len(other)}"
        )
        slow = ", ".join(f"{t:.2f}" for t in sorted(latency)[-3:])
        print(
            f"  submissions slower than 0.5 s (answered after a kill, by the client's own "
            f"retries): {sum(t > 0.5 for t in latency)}; slowest {slow} s"
        )
        print(
            f"  acknowledged {len(acked)}, jobs in the store {len(jobs)}; lost {len(lost)}, "
            f"duplicated names {len(duplicated)}, failed without running {len(never_ran)}, "
            f"completed {states.get('completed', 0)}"
        )
        print(f"  states: {dict(states)}")
        if unacked:
            print(f"  never acknowledged: {[f's{i}' for i in unacked[:20]]}")
        for line in other[:10]:
            print(f"  error: {line}")
        for line in raised[:5]:
            print(f"  retried: {line}")
        surprising = [*lost]
        for job_id in lost[:10]:
            print(f"  LOST: acknowledged id {job_id}")
        for name, n in list(duplicated.items())[:10]:
            twins = [j for j in jobs if j.name == name]
            surprising += [j.id for j in twins]
            for j in twins:
                print(f"  DUPLICATE ({n}): {describe(j)}")
                print(f"    history: {history(cluster.client(), j.id)}")
        for j in never_ran[:10]:
            surprising.append(j.id)
            print(f"  FAILED WITHOUT RUNNING: {describe(j)}")
            print(f"    history: {history(cluster.client(), j.id)}")
        others = [j for j in jobs if j.state is not JobState.COMPLETED and j not in never_ran]
        for j in others[:10]:
            surprising.append(j.id)
            print(f"  NOT COMPLETED: {describe(j)}")
            print(f"    history: {history(cluster.client(), j.id)}")
        if surprising:
            needles = [f"job {i}" for i in surprising[:20]] + [f"job_id={i}" for i in lost[:20]]
            for name in ("coordinator", "agent"):
                for line in log_lines(cluster.log(name), needles):
                    print(f"    {name}.log: {line}")
        errors = log_lines(cluster.log("coordinator"), ["Traceback", "ERROR", "error"], 10)
        for line in errors:
            print(f"  coordinator.log: {line}")
    finally:
        cluster.close()
        if database is not None:
            import psycopg

            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


# ---- 2. pgrestart: PostgreSQL restarted twice under 600 short jobs ----------------------------


def part_pgrestart(root: Path, count: int) -> None:
    bin_dir = pg_bin()
    if bin_dir is None or os.geteuid() != 0 or shutil.which("runuser") is None:
        print("pgrestart: skipped (needs root, runuser and /usr/lib/postgresql/*/bin)")
        return
    owner = pwd.getpwnam("postgres")
    pg_root = root / "pg"
    pg_root.mkdir()
    os.chown(pg_root, owner.pw_uid, owner.pw_gid)
    pg_root.chmod(0o755)
    root.chmod(0o755)
    server = PrivatePostgres(bin_dir, pg_root)
    cluster: Cluster | None = None
    try:
        server.start()
        cluster = Cluster(root / "pgrestart", f'database_url = "{server.url}"\n')
        cluster.start_coordinator()
        coordinator = cluster.coordinator
        assert coordinator is not None
        cluster.start_agent()
        client = cluster.client()
        # submitted held, then released at once: the restarts then fall inside the run
        began = time.monotonic()
        ids = [cluster.submit(client, "sleep 0.05", name=f"p{i}", hold=True) for i in range(count)]
        submitted = time.monotonic() - began
        began = time.monotonic()
        client.release(*ids)

        def completed() -> int | None:
            try:
                finished = client.list(finished=True, limit=1_000_000)
            except GpuqError:
                return None
            return sum(j.state is JobState.COMPLETED for j in finished)

        restarts = []
        for stage in (count // 3, 2 * count // 3):
            wait_for(lambda s=stage: (completed() or 0) >= s, 300, f"{stage} completed")  # type: ignore[misc]
            done = completed()
            running = len(client.list(states=["running"]))
            t0 = time.monotonic()
            server.restart()
            restarts.append((done, running, time.monotonic() - t0))

        def drained() -> bool:
            try:
                return not client.list()
            except GpuqError:
                return False

        wait_for(drained, 600, "no live job")
        wall = time.monotonic() - began
        jobs = {j.id: j for j in client.list(finished=True, job_ids=ids)}
        states = collections.Counter(j.state.value for j in jobs.values())
        first = min(j.start_time or j.submit_time for j in jobs.values())
        last = max(j.end_time or 0 for j in jobs.values())
        same = coordinator.poll() is None and cluster.coordinator is coordinator
        log = cluster.log("coordinator")
        print(f"pgrestart: {count} `sleep 0.05` jobs, private PostgreSQL restarted twice")
        for done, running, took in restarts:
            print(
                f"  restarted (pg_ctl restart -m fast, {took:.2f} s) at {done} completed, "
                f"{running} running"
            )
        print(
            f"  completed {states.get('completed', 0)}/{count}; states {dict(states)}; "
            f"coordinator the same process (pid {coordinator.pid}): {same}"
        )
        print(
            f"  wall: submitted (held) in {submitted:.1f} s; from the release, no job live "
            f"after {wall:.1f} s (first start to last end by the store's clock: "
            f"{last - first:.1f} s)"
        )
        print(
            f"  coordinator log: 'the job store failed (' x{log.count('the job store failed (')}, "
            f"'the job store is back after' x{log.count('the job store is back after')}, "
            f"'handling agent reports failed' x{log.count('handling agent reports failed')}"
        )
        for j in [j for j in jobs.values() if j.state is not JobState.COMPLETED][:10]:
            print(f"  NOT COMPLETED: {describe(j)}")
            print(f"    history: {history(client, j.id)}")
        for line in log_lines(log, ["the job store", "Traceback", "ERROR"], 12):
            print(f"  coordinator.log: {line}")
    finally:
        if cluster is not None:
            cluster.close()
        server.stop()


# ---- 3. agentdown: the agent killed for 120 s under 130 s jobs --------------------------------


def part_agentdown(root: Path, run_s: float, kill_after: float, down_s: float) -> None:
    cluster = Cluster(root / "agentdown")  # heartbeat_timeout and fence_time: the defaults
    try:
        cluster.start_coordinator()
        cluster.start_agent()
        client = cluster.client()
        ids = [cluster.submit(client, f"sleep {run_s:g}", gpus=1, name=f"d{i}") for i in range(4)]
        wait_for(lambda: all(client.get(i).state is JobState.RUNNING for i in ids), 60, "4 running")
        started = time.monotonic()
        time.sleep(kill_after)
        Cluster.kill(cluster.agent)
        killed = time.monotonic()
        time.sleep(down_s / 2)
        node_mid = {n.name: (n.state, n.reason) for n in client.nodes()}.get("a")
        states_mid = collections.Counter(client.get(i).state.value for i in ids)
        time.sleep(max(0.0, down_s - (time.monotonic() - killed)))
        node_end = {n.name: (n.state, n.reason) for n in client.nodes()}.get("a")
        states_end = collections.Counter(client.get(i).state.value for i in ids)
        cluster.start_agent()
        back = time.monotonic()

        def ended() -> bool:
            return all(not client.get(i).state.is_live for i in ids)

        wait_for(ended, run_s + 120, "the 4 jobs to end")
        jobs = [client.get(i) for i in ids]
        exit0 = sum(
            j.state is JobState.COMPLETED and j.result is not None and j.result.exit_code == 0
            for j in jobs
        )
        node_fail = sum(j.state is JobState.NODE_FAIL for j in jobs)
        print(
            f"agentdown: 4 one-GPU `sleep {run_s:g}` jobs; agent killed -9 {kill_after:g} s in, "
            f"down {back - killed:.0f} s (heartbeat_timeout and fence_time: the defaults)"
        )
        print(f"  halfway down: node a {node_mid}, jobs {dict(states_mid)}")
        print(f"  before the restart: node a {node_end}, jobs {dict(states_end)}")
        print(
            f"  completed with exit 0: {exit0}/4; node_fail: {node_fail}; all ended "
            f"{time.monotonic() - started:.0f} s after they all ran"
        )
        for j in jobs:
            print(f"  {describe(j)}")
            print(f"    history: {history(client, j.id)}")
    finally:
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--part", choices=["submit", "pgrestart", "agentdown", "all"], default="all"
    )
    parser.add_argument("--submits", type=int, default=1000)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--pg-url", default=SHARED_PG, help="a server for part submit")
    parser.add_argument("--pg-jobs", type=int, default=600)
    parser.add_argument("--run", type=float, default=130.0, help="agentdown: job length, s")
    parser.add_argument("--down", type=float, default=120.0, help="agentdown: agent down, s")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpuq-faults-bench-"))
    print(f"{os.cpu_count()} CPUs; temporary folder {root}", flush=True)
    try:
        if args.part in ("submit", "all"):
            for backend in args.backends.split(","):
                part_submit(root, backend.strip(), args.pg_url, args.submits)
                sys.stdout.flush()
        if args.part in ("pgrestart", "all"):
            part_pgrestart(root, args.pg_jobs)
            sys.stdout.flush()
        if args.part in ("agentdown", "all"):
            part_agentdown(root, args.run, 5.0, args.down)
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
