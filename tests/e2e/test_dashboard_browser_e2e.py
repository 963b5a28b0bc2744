"""The web dashboard in a real browser (issue 14): headless Chromium against a running
coordinator and agent with fake GPUs. The page signs in through a real one-time ticket, shows a
card per GPU and a running job as its holder, updates over server-sent events when the job ends
(no reload: the page's load marker stays), and renders the job's chart and log tail. Every page
(cluster, queue, history, a job with GPUs and one without, a user's) renders at a desktop's and
a phone's width, none wider than a phone's screen; the history's heat map has the past day and
the running job now, the queue comes in rank order and filters. Screenshots go to
$GPUQ_TEST_ARTIFACTS (else <repo>/.artifacts)."""

from __future__ import annotations

import json
import os
import pwd
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import console_errors, require_browser, screenshot
from e2e_cluster import Cluster
from helpers import make_spec

from gpuq.domain.gpu_history import BUCKET, UnitUse, bucket_of
from gpuq.domain.model import JobResult
from gpuq.domain.states import JobState
from gpuq.store.api import Store
from gpuq.store.records import JobStart, NewJob, StateChange

GIB = 1024**3

# holds 20 GiB of its fake GPU at 70 % until the test creates `release`; its log carries markup
# that must stay text
JOB = (
    "import os, time, pathlib; "
    "from gpuq.agent.fake.gpu_state import claim_fake_vram, set_fake_utilization; "
    'gpu = os.environ["CUDA_VISIBLE_DEVICES"]; '
    "set_fake_utilization(gpu, 70); claim_fake_vram(gpu, 20 << 30); "
    'print("holding <img src=x id=xss>", flush=True); '
    'f = pathlib.Path("release"); '
    "[time.sleep(0.1) for _ in range(1200) if not f.exists()]; "
    'print("released", flush=True)'
)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    require_browser()  # before starting processes for nothing
    running = Cluster(tmp_path, 'web_listen = "127.0.0.1:0"\n[agent]\nsample_interval = 0.2\n')
    try:
        running.start_coordinator()
        running.start_agent("a", "2xA100-80GB")
        yield running
    finally:
        running.close()


def web_base(cluster: Cluster) -> str:
    address = json.loads((cluster.home / "coordinator.json").read_text())["web"]
    return f"http://{address}"


def sign_in_link(cluster: Cluster) -> str:
    """A one-time sign-in link for the test's user, as `gpuq web` prints it."""
    return str(cluster.client().web_login().url)


def until(driver: Any, condition: str, what: str, timeout: float = 30.0) -> Any:
    """Poll a JavaScript expression in the page until it is truthy; its value."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(
            lambda d: d.execute_script(f"return {condition};")
        )
    except TimeoutException:
        text = driver.execute_script("return document.body.innerText;")
        message = f"timed out after {timeout} s waiting for {what}; the page says:\n{text}"
        raise AssertionError(message) from None


def click(driver: Any, css: str, timeout: float = 10.0) -> None:
    """Click an element of a view that live updates re-render: one replaced between finding
    it and clicking it is found again (as a user's click lands on the new button)."""
    from selenium.common.exceptions import StaleElementReferenceException

    deadline = time.monotonic() + timeout
    while True:
        try:
            driver.find_element("css selector", css).click()
            return
        except StaleElementReferenceException:
            assert time.monotonic() < deadline, f"{css} kept being replaced"


def test_dashboard_shows_gpus_and_a_job_live_with_its_chart(cluster: Cluster, driver: Any) -> None:
    base = web_base(cluster)
    # unsigned: the sign-in view
    driver.get(base + "/")
    until(driver, "document.getElementById('token')", "the sign-in form")
    assert "gpuq web" in driver.find_element("css selector", "main").text
    # the browser reports the 401 that sent it there; nothing else may be in the console
    assert all("/api/me" in e and "401" in e for e in console_errors(driver))
    # a pasted token signs in too; then sign out
    token = cluster.client().issue_token(pwd.getpwuid(os.getuid()).pw_name)
    driver.find_element("id", "token").send_keys(token)
    driver.find_element("css selector", "form.login button[type=submit]").click()
    until(driver, "document.querySelectorAll('[data-gpu-uuid]').length === 2", "the cluster")
    driver.find_element("id", "logout").click()
    until(driver, "location.pathname === '/login' && document.getElementById('token')", "out")
    console_errors(driver)  # the 401s of the signed-out page

    driver.get(sign_in_link(cluster))
    until(driver, "location.pathname === '/' && location.hash === ''", "the ticket to go")
    until(driver, "document.querySelectorAll('[data-gpu-uuid]').length === 2", "2 GPU cards")
    units = {u.uuid for n in cluster.client().nodes() for u in n.gpus}
    shown = driver.execute_script(
        "return [...document.querySelectorAll('[data-gpu-uuid]')].map(e => e.dataset.gpuUuid);"
    )
    assert set(shown) == units
    load_id = driver.execute_script("return window.__loadId;")
    until(driver, "document.getElementById('live').dataset.live === 'live'", "the live badge")

    job = cluster.submit(f"{sys.executable} -c '{JOB}'", gpus=1, name="browser-e2e")
    (unit,) = cluster.wait_state(job, "running").gpus
    row = f"document.querySelector('#queue tr[data-job-id=\"{job}\"][data-state=running]')"
    until(driver, row, "the running job in the queue")
    card = f"document.querySelector('[data-gpu-uuid=\"{unit}\"]')"
    until(driver, f"{card}.dataset.holder === '{job}'", "the job as its GPU's holder")
    assert "browser-e2e" in driver.execute_script(f"return {row}.textContent;")
    until(driver, f"{card}.textContent.includes('util 70 %')", "the card's utilisation")
    assert driver.execute_script("return window.__loadId;") == load_id
    screenshot(driver, "dashboard-cluster.png")
    dark = [{"name": "prefers-color-scheme", "value": "dark"}]
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": dark})
    screenshot(driver, "dashboard-cluster-dark.png")
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})

    # the job page, in a second tab, while the job runs: chart points and the log tail
    cluster_tab = driver.current_window_handle
    driver.switch_to.new_window("tab")
    driver.get(f"{base}/jobs/{job}")
    points = "Number(document.querySelector('svg.chart')?.dataset.points || 0)"
    until(driver, f"{points} >= 3", "the chart to have points")
    until(driver, "document.querySelector('svg.chart path.util')?.getAttribute('d')", "a line")
    log = "document.getElementById('log')"
    until(driver, f"{log} && {log}.textContent.includes('<img src=x id=xss>')", "the log tail")
    assert driver.execute_script("return document.getElementById('xss');") is None
    state = "document.querySelector('h1 [data-state]')?.dataset.state"
    assert driver.execute_script(f"return {state};") == "running"
    job_load_id = driver.execute_script("return window.__loadId;")
    screenshot(driver, "dashboard-job.png")

    # the job ends: both pages follow without a reload
    (cluster.root / "release").touch()
    cluster.wait_state(job, "completed")
    until(driver, f"{state} === 'completed'", "the job page to say completed")
    assert driver.execute_script("return window.__loadId;") == job_load_id
    until(driver, f"{log}.textContent.includes('released')", "the log's last line")
    # an ended job's chart keeps its detail (its recent points are stored with the end)
    driver.refresh()
    until(driver, f"{state} === 'completed'", "the ended job's page")
    until(driver, f"{points} >= 3", "the ended job's chart to keep its points")
    # its history says what caused each change: the submission, a pass, its agent's report
    causes = driver.execute_script(
        "return [...document.querySelectorAll('#events tr')].map(r => r.lastChild.textContent);"
    )
    assert causes[-1] == "report from node a" and any(c.startswith("Submit by ") for c in causes)
    job_load_id = driver.execute_script("return window.__loadId;")
    screenshot(driver, "dashboard-job-ended.png")
    assert console_errors(driver) == []
    driver.close()
    driver.switch_to.window(cluster_tab)
    finished = f"document.querySelector('#finished tr[data-job-id=\"{job}\"]')"
    until(driver, f"{finished}?.dataset.state === 'completed'", "the job among finished ones")
    until(driver, f"!{row} && !{card}.dataset.holder", "the queue and card to let go")
    assert driver.execute_script("return window.__loadId;") == load_id
    screenshot(driver, "dashboard-cluster-ended.png")
    assert console_errors(driver) == []

    # a held job of the signed-in user: release it, then cancel it, with the page's buttons
    held = cluster.submit("sleep 60", gpus=1, name="held-e2e", hold=True)
    driver.get(f"{base}/jobs/{held}")
    until(driver, f"{state} === 'held'", "the held job's page")
    click(driver, "button[data-action=release]")
    cluster.wait_state(held, "pending", "running")
    until(driver, f"['pending', 'running'].includes({state})", "the page to show it released")
    outcome = "document.getElementById('status').textContent"
    until(driver, f"{outcome}.startsWith('{held}: ')", "the release's outcome")
    click(driver, "button[data-action=cancel]")
    cluster.wait_state(held, "cancelled")
    until(driver, f"{state} === 'cancelled'", "the page to show it cancelled")
    assert not driver.find_elements("css selector", "button[data-action]")
    assert console_errors(driver) == []


# ---- every page at a desktop's and a phone's width (issue 26) ------------------------------

WIDTHS = {
    "desktop": {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
    "phone": {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True},
}
HOUR = 3600.0
LOAD_TIME = 15.0  # seconds: a page's load, on a busy machine


def seed_past(cluster: Cluster, uuids: list[str], now: float) -> None:
    """The past day, as the store would hold it had the cluster run: ended jobs of alice and
    bob on node a's GPUs, and their 5-minute buckets (alice's busy, bob's held but idle).
    Written into the running coordinator's store before any job of the test holds a GPU."""
    store = Store.open(f"sqlite:///{cluster.home / 'gpuq.db'}")
    past = [
        ("alice", "train-big", uuids[0], now - 20 * HOUR, now - 9 * HOUR, 85.0, 60 * GIB),
        ("bob", "notebook", uuids[1], now - 18 * HOUR, now - 4 * HOUR, 2.0, 3 * GIB),
        ("alice", "finetune", uuids[0], now - 7 * HOUR, now - 2 * HOUR, 50.0, 30 * GIB),
    ]
    try:
        for owner, name, unit, start, end, util, memory in past:
            new = NewJob(make_spec(name, gpus=1), user=owner, qos="normal", priority=0)
            with store.transaction() as tx:
                [[job_id]] = tx.add_jobs([new], start - 60)
            with store.transaction() as tx:
                tx.start_jobs([JobStart(job_id, "a", (unit,))], now=start)
            with store.transaction() as tx:
                ok = JobResult(0, None, "")
                tx.transition([StateChange(job_id, JobState.COMPLETED, "exit code 0", ok)], end)
            uses = []
            for at in range(bucket_of(start), int(end), BUCKET):
                use = UnitUse("a", unit, at, job_id, owner)
                wave = (at // BUCKET) % 12 - 6  # some life in the figures
                use.add(max(0.0, min(100.0, util + wave * util / 20)), memory + wave * GIB)
                uses.append(use)
            with store.transaction() as tx:
                tx.add_gpu_usage(uses)
    finally:
        store.close()


def at_width(driver: Any, width: str) -> None:
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", WIDTHS[width])


def open_page(driver: Any, url: str, ready: str, what: str) -> None:
    """Load `url` and wait until `ready`: within LOAD_TIME, or a load stalled (as every load
    did after six, while the pages left behind held their live streams open)."""
    started = time.monotonic()
    driver.get(url)
    until(driver, "Number(document.body.dataset.loaded || 0) >= 1", f"{what} to load")
    until(driver, ready, what)
    took = time.monotonic() - started
    assert took < LOAD_TIME, f"{what} took {took:.0f} s"


def no_page_overflow(driver: Any) -> bool:
    """Nothing is wider than the window (tables and the map scroll in their own boxes)."""
    return bool(
        driver.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth "
            "&& document.body.scrollWidth <= window.innerWidth;"
        )
    )


def test_every_page_at_desktop_and_phone_widths_with_the_cluster_history(
    cluster: Cluster, driver: Any
) -> None:
    base = web_base(cluster)
    me = pwd.getpwuid(os.getuid()).pw_name
    uuids = sorted(u.uuid for n in cluster.client().nodes() for u in n.gpus)
    seed_past(cluster, uuids, time.time())
    gpu_job = cluster.submit(f"{sys.executable} -c '{JOB}'", gpus=1, name="browser-gpu")
    (unit,) = cluster.wait_state(gpu_job, "running").gpus
    cpu_job = cluster.submit("echo no GPUs here", gpus=0, name="cpu-only")
    cluster.wait_state(cpu_job, "completed")
    # the queue: behind the running job, two 2-GPU jobs wait (high first), one is held
    low = cluster.submit("true", gpus=2, name="sweep-low", qos="low")
    high = cluster.submit("true", gpus=2, name="sweep-high", qos="high")
    held = cluster.submit("true", gpus=2, name="later", hold=True)
    for job in (low, high):
        cluster.wait_state(job, "pending")

    driver.get(sign_in_link(cluster))
    until(driver, "location.pathname === '/' && location.hash === ''", "the sign-in")
    pages = {
        "cluster": ("/", "document.querySelectorAll('[data-gpu-uuid]').length === 2"),
        "queue": ("/queue", "document.querySelectorAll('#ranked tr[data-job-id]').length === 4"),
        "history": ("/history", "Number(document.querySelector('svg.heat')?.dataset.cells) > 0"),
        "job-gpu": (f"/jobs/{gpu_job}", "document.querySelector('svg.chart')"),
        "job-cpu": (f"/jobs/{cpu_job}", "document.getElementById('no-gpus')"),
        "user": (f"/users/{me}", "document.querySelector('#queue tr[data-job-id]')"),
    }
    shots = []
    for width in WIDTHS:
        at_width(driver, width)
        for page, (path, ready) in pages.items():
            open_page(driver, base + path, ready, f"the {page} page at {width} width")
            if width == "phone":
                assert no_page_overflow(driver), f"the {page} page scrolls sideways on a phone"
            shots.append(screenshot(driver, f"dashboard-{page}-{width}.png").name)
    assert console_errors(driver) == []

    # the queue, as the scheduler ranks it: high before low, then held, then running
    at_width(driver, "desktop")
    rows = "[...document.querySelectorAll('#ranked tr[data-job-id]')].map(r => r.dataset.jobId)"
    open_page(driver, base + "/queue", f"{rows}.length === 4", "the queue")
    assert driver.execute_script(f"return {rows};") == [str(i) for i in (high, low, held, gpu_job)]
    driver.find_element("css selector", "#queue-form input[name=name]").send_keys("SWEEP")
    click(driver, "#queue-form button[type=submit]")
    until(driver, f"{rows}.length === 2", "the name filter")
    assert driver.execute_script(f"return {rows};") == [str(high), str(low)]
    assert driver.execute_script("return location.search;") == "?name=SWEEP"

    # the history: the past day and the running job now, bob's held-but-idle GPU named
    open_page(driver, base + "/history?range=24h", "document.querySelector('svg.heat')", "map")
    row = f"document.querySelector('g.gpu-row[data-gpu-uuid=\"{unit}\"]')"
    cells = f"{row}.querySelectorAll('rect.cell')"
    until(driver, f"{cells}.length > 1", "the running job's GPU's cells")
    tap = "new MouseEvent('click', {bubbles: true})"
    driver.execute_script(f"const c = {cells}; c[c.length - 1].dispatchEvent({tap});")
    tip = "document.getElementById('heat-tip').textContent"
    until(driver, f"{tip}.includes('job {gpu_job}')", "the tooltip of the live cell")
    assert f"{me}, job {gpu_job}" in driver.execute_script(f"return {tip};")
    # 70 % but for the samples before the job set it: the column's mean
    util = re.search(r"util (\d+) %", driver.execute_script(f"return {tip};"))
    assert util is not None and 50 <= int(util.group(1)) <= 70
    idle = driver.find_element("id", "idle-gpus").text
    assert "Held but idle" in idle and "a GPU" in idle
    users = driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#usage tr[data-user]')]"
        ".map(r => [r.dataset.user, [...r.cells].map(c => c.textContent)]));"
    )
    assert users["alice"][1] == "16.0"  # 11 h and 5 h of one GPU, all in the last 24 h
    assert users["bob"][1] == "14.0" and users["bob"][4] == "2 %"
    assert users[me][2] == "1"  # running now
    click(driver, "button[data-metric=memory]")
    until(driver, "document.querySelector('button[data-metric=memory]').ariaPressed === 'true'", "")
    click(driver, "button[data-range='7d']")
    until(driver, "location.search === '?range=7d'", "the week's map")
    until(driver, "Number(document.querySelector('svg.heat')?.dataset.cells) > 0", "its cells")
    shots.append(screenshot(driver, "dashboard-history-7d-memory-desktop.png").name)
    assert console_errors(driver) == []
    print("screenshots:", ", ".join(shots))
    (cluster.root / "release").touch()
