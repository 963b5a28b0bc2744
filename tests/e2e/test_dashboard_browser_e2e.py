"""The web dashboard in a real browser (issue 14): headless Chromium against a running
coordinator and agent with fake GPUs. The page signs in through a real one-time ticket, shows a
card per GPU and a running job as its holder, updates over server-sent events when the job ends
(no reload: the page's load marker stays), and renders the job's chart and log tail. Screenshots
go to $GPUQ_TEST_ARTIFACTS (else <repo>/.artifacts)."""

from __future__ import annotations

import json
import os
import pwd
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import console_errors, quit_driver, require_browser, screenshot, start_chromium
from e2e_cluster import Cluster

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


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Any]:
    require_browser()
    profile = tmp_path / "chromium-profile"
    chromium = start_chromium(profile)
    try:
        yield chromium
    finally:
        quit_driver(chromium, profile)


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
