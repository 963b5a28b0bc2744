"""Listings that scale (issue 23): does listing a huge queue delay other users' calls? Prints
figures, asserts nothing.

    python bench/listing_bench.py [--jobs 200000] [--pending 0] [--samples 300] [--cli 10]
                                  [--page-size N]

Writes --jobs held jobs of one user (--pending of them pending instead) into a fresh SQLite
store, as submissions write them (StoreTx.add_jobs, 10,000 a transaction: submitting 200,000
over gRPC would take most of an hour), then starts `gpuq serve` on it (a coordinator that
loads them, and a local agent with 8 fake GPUs, [coordinator] web_listen on loopback). Then,
as another client, it times --samples of each:
  - ListNodes (what `gpuq nodes` asks), and a Submit of a held job (one stream, as the CLI's
    helper keeps it);
  - and --cli runs of the real `gpuq nodes` and `gpuq submit --hold` command lines (a
    process each, helper off);
first idle, then while four listers (processes of their own) list the whole queue in a
loop: two over gRPC (gpuq.Client.list_raw: every page, to the end) and two through the
dashboard's /api/jobs (page after page, signed in with `gpuq web`'s ticket), once each of
them has listed the whole queue once (the first listing builds every entry; later ones reuse
them). It prints each figure's median and p95, idle and loaded, their ratio (target: loaded
<= 2x idle), and how many whole listings the listers made meanwhile. The listers are
processes that need CPU of their own: on a machine of few cores, --nice 19 shows what they
cost the coordinator apart from what they take from the machine.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import pwd
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from gpuq.client import Client
from gpuq.config.loading import load_settings
from gpuq.store.api import Store
from gpuq.store.records import NewJob
from gpuq.submission import build_spec

OWNER = "alice"  # the user whose queue is huge (the bench's own user measures)
SUBMIT = ("submit", "--hold", "--name", "probe", "--wrap", "true")  # a held job, as typed


def fill(home: Path, jobs: int, pending: int, workdir: Path) -> float:
    """The store, with `jobs` jobs of OWNER: seconds it took."""
    started = time.perf_counter()
    store = Store.open(f"sqlite:///{home / 'gpuq.db'}")
    held = build_spec(wrap="sleep 60", gpus=1, hold=True, name="sweep", chdir=str(workdir))
    # 8 GPUs each, on a node of 8: they wait behind the bench's own 8-GPU job, which runs
    # for the whole bench (OWNER is no account here: a start of theirs would fail at launch,
    # and the next would start, a churn of starts that no real queue has)
    waits = build_spec(wrap="sleep 3600", gpus=8, name="big", chdir=str(workdir))
    me = pwd.getpwuid(os.geteuid()).pw_name
    with store.transaction() as tx:
        tx.add_jobs([NewJob(waits, me, "normal", 0)], time.time())
    for start in range(0, jobs, 10_000):
        count = min(10_000, jobs - start)
        batch = [
            NewJob(waits if start + i < pending else held, OWNER, "normal", 0) for i in range(count)
        ]
        with store.transaction() as tx:
            tx.add_jobs(batch, time.time())
    store.close()
    return time.perf_counter() - started


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


def grpc_lister(home: str, nice: int, stop: Event, done: Any) -> None:
    """List the whole queue over gRPC, again and again."""
    os.nice(nice)
    client = Client(settings=load_settings(home=Path(home)), timeout=120)
    listings = jobs = 0
    while not stop.is_set():
        jobs += len(client.list_raw())
        listings += 1
        if listings == 1:
            done.put(("listed", "grpc", 0))
    done.put(("grpc", listings, jobs))


def web_lister(address: str, ticket: str, nice: int, stop: Event, done: Any) -> None:
    """List the whole queue through the dashboard's API, page after page, again and again."""
    os.nice(nice)
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    body = json.dumps({"ticket": ticket})
    headers = {"X-Gpuq": "1", "Content-Type": "application/json"}
    conn.request("POST", "/api/login", body=body, headers=headers)
    reply = conn.getresponse()
    reply.read()
    cookie = reply.getheader("set-cookie", "").split(";")[0]
    listings = jobs = 0
    while not stop.is_set():
        token = ""
        while True:
            path = "/api/jobs" + (f"?page_token={urllib.parse.quote(token)}" if token else "")
            conn.request("GET", path, headers={"Cookie": cookie})
            reply = conn.getresponse()
            page = json.loads(reply.read())
            if reply.status != 200:
                raise SystemExit(f"/api/jobs: {reply.status} {page}")
            jobs += len(page.get("jobs", []))
            token = page.get("next_page_token", "")
            if not token or stop.is_set():
                break
        listings += 1
        if listings == 1:
            done.put(("listed", "web", 0))
    done.put(("web", listings, jobs))


def sample(client: Client, samples: int, spec: Any) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {"ListNodes": [], "Submit": []}
    for _ in range(samples):
        started = time.perf_counter()
        client.nodes()
        figures["ListNodes"].append(time.perf_counter() - started)
        started = time.perf_counter()
        client.submit_spec(spec)
        figures["Submit"].append(time.perf_counter() - started)
    return figures


def cli_runs(runs: int, env: dict[str, str], cwd: Path, *args: str) -> list[float]:
    """Wall times of `gpuq ARGS` run as processes, as a user types them."""
    walls = []
    command = [sys.executable, "-m", "gpuq.cli.main", *args]
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, env=env, cwd=cwd, check=True, capture_output=True)
        walls.append(time.perf_counter() - started)
    return walls


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


def report(idle: dict[str, list[float]], loaded: dict[str, list[float]]) -> None:
    print(
        f"{'':24} {'idle median':>12} {'idle p95':>10} {'loaded median':>14} {'loaded p95':>11}"
        f" {'ratio med':>10} {'ratio p95':>10}"
    )
    for name in idle:
        a, b = idle[name], loaded[name]
        if not a or not b:
            continue
        med_a, med_b, p_a, p_b = statistics.median(a), statistics.median(b), p95(a), p95(b)
        print(
            f"{name:24} {med_a * 1000:9.2f} ms {p_a * 1000:7.2f} ms {med_b * 1000:11.2f} ms"
            f" {p_b * 1000:8.2f} ms {med_b / med_a:9.2f}x {p_b / p_a:9.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--pending", type=int, default=0, help="of --jobs, pending ones")
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--cli", type=int, default=10, help="`gpuq nodes` processes timed")
    parser.add_argument("--listers", type=int, default=4, help="half gRPC, half dashboard")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="the listers' niceness: 19 takes their own CPU (on a machine of few cores) out "
        "of the figures, leaving what they cost the coordinator",
    )
    parser.add_argument("--page-size", type=int, default=0, help="[coordinator] list_page_size")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuq-listing-bench-") as folder:
        root = Path(folder)
        home = root / "home"
        home.mkdir(mode=0o700)
        root_ok = "allow_root_jobs = true\n" if os.geteuid() == 0 else ""
        (home / "config.toml").write_text(
            f'[coordinator]\nweb_listen = "127.0.0.1:0"\nmax_queued_per_user = {args.jobs * 2}\n'
            + (f"list_page_size = {args.page_size}\n" if args.page_size else "")
            + f"{root_ok}[agent]\n{root_ok}"
        )
        took = fill(home, args.jobs, args.pending, root)
        print(f"stored {args.jobs} jobs of {OWNER} ({args.pending} pending) in {took:.1f} s")
        env = {**os.environ, "GPUQ_HOME": str(home), "GPUQ_CLI_HELPER": "off"}
        env.pop("GPUQ_CONFIG", None)
        log = open(root / "serve.log", "wb")  # noqa: SIM115 - lives with the process
        started = time.perf_counter()
        serve = subprocess.Popen(
            [sys.executable, "-m", "gpuq.cli.main", "serve", "--fake-gpus", "8xA100-80GB"],
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            run(args, home, root, env, started)
        except BaseException:
            print((root / "serve.log").read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            serve.terminate()
            try:
                serve.wait(30)
            except subprocess.TimeoutExpired:
                serve.kill()
                serve.wait()


def run(
    args: argparse.Namespace, home: Path, root: Path, env: dict[str, str], started: float
) -> None:
    address = home / "coordinator.json"
    wait(lambda: json.loads(address.read_text()).get("web"), 600, "the coordinator")
    client = Client(settings=load_settings(home=home), timeout=60)
    wait(lambda: any(n.usage for n in client.nodes()), 120, "the node's first heartbeat")
    took = time.perf_counter() - started
    print(f"coordinator up, {args.jobs} jobs loaded, node heard: {took:.1f} s")
    spec = build_spec(wrap="true", gpus=0, hold=True, name="probe", chdir=str(root))
    begun = time.perf_counter()
    whole = client.list_raw()
    took = time.perf_counter() - begun
    print(f"one whole listing over gRPC, idle: {len(whole)} jobs in {took:.2f} s")
    sample(client, 20, spec)  # warm: the submit stream, the channel
    idle = sample(client, args.samples, spec)
    idle["`gpuq nodes` (process)"] = cli_runs(args.cli, env, root, "nodes")
    idle["`gpuq submit` (process)"] = cli_runs(args.cli, env, root, *SUBMIT)
    web = json.loads(address.read_text())["web"]
    stop = multiprocessing.Event()
    done: Any = multiprocessing.Queue()
    listers = []
    for i in range(args.listers):
        if i % 2 == 0:
            target: Any = grpc_lister
            lister_args: tuple[Any, ...] = (str(home), args.nice, stop, done)
        else:
            ticket = urllib.parse.urlsplit(client.web_login().url).fragment.partition("=")[2]
            target, lister_args = web_lister, (web, ticket, args.nice, stop, done)
        listers.append(multiprocessing.Process(target=target, args=lister_args))
    for process in listers:
        process.start()
    begun = time.perf_counter()
    for _ in listers:  # the steady state: every entry built once (a cold listing builds them)
        done.get(timeout=1200)
    print(f"the listers' first whole listings (cold): {time.perf_counter() - begun:.1f} s")
    loaded = sample(client, args.samples, spec)
    loaded["`gpuq nodes` (process)"] = cli_runs(args.cli, env, root, "nodes")
    loaded["`gpuq submit` (process)"] = cli_runs(args.cli, env, root, *SUBMIT)
    stop.set()
    results = [done.get(timeout=300) for _ in listers]
    for process in listers:
        process.join(60)
    print(f"samples: {args.samples} of each RPC, {args.cli} CLI runs; listers meanwhile:")
    for kind, listings, jobs in results:
        print(f"  {kind} lister: {listings} whole listings, {jobs} jobs")
    report(idle, loaded)


if __name__ == "__main__":
    multiprocessing.set_start_method("spawn")
    main()
