"""The web dashboard's page weight and time to first render, and the HTTP ports' throughput:
prints figures, asserts nothing.

    python bench/web_bench.py [--loads 7] [--gpus 8] [--pending 20] [--requests 2000]

Starts `gpuq serve` (coordinator and a local agent with --gpus fake GPUs, SQLite in a temporary
GPUQ_HOME, [coordinator] web_listen on a free loopback port), fills the queue with one running
1-GPU job per GPU but two and --pending jobs that wait (4 GPUs each: they cannot start now), signs
in headless Chromium (Debian's chromium and chromium-driver, as the browser tests) with a
one-time ticket, and loads the cluster view --loads times with the browser's cache off, each load
measured by the page's Performance API:
  - page weight: bytes of the page, its script and style (static) and of its API calls, over
    the wire (transferSize) and decoded;
  - first contentful paint (the "paint" entry), the page's own marks "gpuq-first-render" (its
    first view on screen) and "gpuq-cards" (the cluster view's GPU cards in the DOM), all from
    the navigation's start; medians over the loads, and the first (cold) load apart;
  - then --requests GETs each of `/api/jobs` (signed in) and `/metrics` ([coordinator]
    metrics_listen), gzip accepted, over kept-alive connections: one connection in turn
    (latency), then --connections at once (throughput): requests/s and p50/p90 latency.
The script serves whichever gpuq the Python running it imports, so one copy measures two trees
(`other-tree/.venv/bin/python bench/web_bench.py`).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from browser import quit_driver, require_browser, screenshot, start_chromium  # noqa: E402

from gpuq.client import Client  # noqa: E402
from gpuq.config.loading import load_settings  # noqa: E402
from gpuq.v1 import queue_pb2  # noqa: E402

STATIC = REPO / "gpuq" / "web" / "static"

MEASURE = """
const nav = performance.getEntriesByType('navigation')[0];
const res = performance.getEntriesByType('resource').map(r => ({
  name: new URL(r.name).pathname + new URL(r.name).search, type: r.initiatorType,
  transfer: r.transferSize, decoded: r.decodedBodySize}));
const mark = (n) => {
  const m = performance.getEntriesByName(n)[0]; return m ? m.startTime : null; };
const fcp = performance.getEntriesByType('paint').find(p => p.name === 'first-contentful-paint');
return {nav: {transfer: nav.transferSize, decoded: nav.decodedBodySize,
              dcl: nav.domContentLoadedEventEnd, load: nav.loadEventEnd},
        resources: res, fcp: fcp ? fcp.startTime : null,
        first_render: mark('gpuq-first-render'), cards: mark('gpuq-cards'),
        gpu_cards: document.querySelectorAll('[data-gpu-uuid]').length,
        rows: document.querySelectorAll('#queue tbody tr').length};
"""


def wait(condition: Any, timeout: float, what: str) -> Any:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loads", type=int, default=7)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pending", type=int, default=20)
    parser.add_argument("--requests", type=int, default=2000, help="per path and run (0: none)")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument(
        "--screenshots", action="store_true", help="save the cluster and user views' (.artifacts)"
    )
    args = parser.parse_args()
    require_browser_or_exit()
    with tempfile.TemporaryDirectory(prefix="gpuq-web-bench-") as folder:
        root = Path(folder)
        home = root / "home"
        home.mkdir(mode=0o700)
        root_ok = "allow_root_jobs = true\n" if os.geteuid() == 0 else ""
        (home / "config.toml").write_text(
            f'[coordinator]\nweb_listen = "127.0.0.1:0"\nmetrics_listen = "127.0.0.1:0"\n'
            f"{root_ok}[agent]\n{root_ok}"
        )
        env = {**os.environ, "GPUQ_HOME": str(home)}
        env.pop("GPUQ_CONFIG", None)
        log = open(root / "serve.log", "wb")  # noqa: SIM115 - lives with the process
        serve = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuq.cli.main",
                "serve",
                "--fake-gpus",
                f"{args.gpus}xA100-80GB",
                "--cpus",  # sleeping jobs: more than this machine has, so that all fit
                "64",
            ],
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        client = None
        driver = None
        try:
            address = home / "coordinator.json"
            web = wait(lambda: json.loads(address.read_text()).get("web"), 30, "the dashboard")
            base = f"http://{web}"
            client = Client(settings=load_settings(home=home), timeout=10)
            wait(lambda: any(n.usage for n in client.nodes()), 30, "the node's first heartbeat")
            common: dict[str, Any] = {"environ": env, "chdir": str(root)}
            running = [
                client.submit(wrap="sleep 600", gpus=1, name=f"train-{i}", **common)
                for i in range(max(0, args.gpus - 2))
            ]
            wait(
                lambda: all(client.get(j).state.value == "running" for j in running),
                60,
                "the running jobs",
            )
            for i in range(args.pending):  # 4 GPUs each, 2 free: they wait
                client.submit(wrap="sleep 600", gpus=4, name=f"sweep-{i}", **common)
            link = client._call("WebLogin", queue_pb2.WebLoginRequest()).url
            profile = root / "chromium-profile"
            driver = start_chromium(profile)
            driver.execute_cdp_cmd("Network.enable", {})
            driver.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": True})
            driver.get(link)
            wait(lambda: driver.execute_script("return location.pathname === '/';"), 30, "sign-in")
            loads = []
            for _ in range(args.loads):
                driver.get(base + "/")
                figures = wait(
                    lambda: (f := driver.execute_script(MEASURE))["cards"] is not None and f,
                    30,
                    "the GPU cards",
                )
                loads.append(figures)
            report(loads, args)
            if args.requests:
                cookie = driver.get_cookie("gpuq_session")["value"]
                metrics = json.loads(address.read_text())["metrics"]
                print(f"load: {args.requests} GETs a path and run, gzip accepted, kept alive")
                for where, path, headers in (
                    (web, "/api/jobs", {"Cookie": f"gpuq_session={cookie}"}),
                    (metrics, "/metrics", {}),
                ):
                    for connections in (1, args.connections):
                        load(where, path, headers, args.requests, connections)
            if args.screenshots:
                screenshot(driver, "bench-cluster.png")
                driver.get(f"{base}/users/{client.get(running[0]).user}")
                wait(lambda: driver.execute_script("return document.body.dataset.loaded;"), 30, "")
                screenshot(driver, "bench-user.png")
        except BaseException:
            print((root / "serve.log").read_text(errors="replace")[-3000:], file=sys.stderr)
            if client is not None:
                for job in client.list():
                    print(f"job {job.id}: {job.state.value} {job.reason}", file=sys.stderr)
            raise
        finally:
            if driver is not None:
                quit_driver(driver, root / "chromium-profile")
            if client is not None:
                client.close()
            serve.terminate()
            try:
                serve.wait(15)
            except subprocess.TimeoutExpired:
                serve.kill()
                serve.wait()


def load(address: str, path: str, headers: dict[str, str], requests: int, connections: int) -> None:
    """`requests` GETs of `path`, spread over `connections` kept-alive connections at once."""
    host, _, port = address.rpartition(":")
    latencies: list[float] = []
    failed: list[str] = []
    servers: set[str] = set()

    def client(count: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            for _ in range(count):
                started = time.perf_counter()
                conn.request("GET", path, headers={"Accept-Encoding": "gzip", **headers})
                reply = conn.getresponse()
                reply.read()
                servers.add(reply.getheader("server") or "(none)")
                latencies.append(time.perf_counter() - started)
                if reply.status != 200:
                    failed.append(str(reply.status))
        finally:
            conn.close()

    threads = [
        threading.Thread(target=client, args=(requests // connections,)) for _ in range(connections)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.perf_counter() - started
    ms = sorted(x * 1000 for x in latencies)
    print(
        f"  {path:10} {connections:2} connection(s): {len(ms) / took:7.0f} requests/s, "
        f"p50 {ms[len(ms) // 2]:6.2f} ms, p90 {ms[len(ms) * 9 // 10]:6.2f} ms"
        + (f", {len(failed)} not 200 ({failed[0]})" if failed else "")
        + f"; Server: {', '.join(sorted(servers))}"
    )


def require_browser_or_exit() -> None:
    import pytest

    try:
        require_browser()
    except (pytest.skip.Exception, pytest.fail.Exception) as why:
        raise SystemExit(str(why)) from None


def report(loads: list[dict[str, Any]], args: argparse.Namespace) -> None:
    first = loads[0]
    print(
        f"cluster view: {first['gpu_cards']} GPU cards, {first['rows']} queue rows; "
        f"{len(loads)} loads, browser cache off"
    )
    static = [r for r in first["resources"] if r["name"].startswith("/static/")]
    api = [r for r in first["resources"] if r["name"].startswith("/api/")]
    nav = first["nav"]
    print("page weight (one load):")
    print(f"  {'/':32} {nav['transfer']:>8} B on the wire, {nav['decoded']:>8} B decoded")
    for r in [*static, *api]:
        print(f"  {r['name']:32} {r['transfer']:>8} B on the wire, {r['decoded']:>8} B decoded")
    static_wire = nav["transfer"] + sum(r["transfer"] for r in static)
    static_body = nav["decoded"] + sum(r["decoded"] for r in static)
    api_wire = sum(r["transfer"] for r in api)
    print(f"  page + static: {static_wire} B on the wire ({static_body} B decoded)")
    print(f"  API calls:     {api_wire} B on the wire; total {static_wire + api_wire} B")
    files = sorted(p for p in STATIC.iterdir() if p.is_file())
    raw = sum(p.stat().st_size for p in files)
    packed = sum(len(gzip.compress(p.read_bytes(), 9)) for p in files)
    print(f"  static files on disk: {raw} B, {packed} B gzipped (level 9; the server uses 6)")

    def show(name: str, key: str) -> None:
        values = [load[key] for load in loads if load[key] is not None]
        if values:
            print(
                f"  {name:28} median {statistics.median(values):6.0f} ms, "
                f"first load {values[0]:6.0f} ms, max {max(values):6.0f} ms"
            )

    print("time from navigation start:")
    show("first contentful paint", "fcp")
    show("first view rendered", "first_render")
    show("GPU cards in the DOM", "cards")
    dcl = [load["nav"]["dcl"] for load in loads]
    print(f"  {'DOMContentLoaded':28} median {statistics.median(dcl):6.0f} ms")


if __name__ == "__main__":
    main()
