"""A running job's progress end to end, with real processes: a job prints tqdm bars (to stderr,
rewritten with \\r) or GPUQ_PROGRESS lines; its agent reads the tail of its output every
sample_interval, and `gpuq show --json` and `gpuq queue --long` show its rate and ETA while it
runs; a job whose rate falls is flagged; another user sees none of it (it comes from the job's
private output). (The rules through the coordinator in process, on a clock moved by hand:
tests/store/test_progress_coordinator.py.)"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import unix_users
from browser import console_errors, quit_driver, require_browser, screenshot, start_chromium
from e2e_cluster import Cluster, wait_for
from test_dashboard_browser_e2e import until, web_base
from test_web_e2e import gpuq_as, submit_as
from unix_users import UnixUser

pytestmark = pytest.mark.timeout(180)
user_homes = unix_users.user_homes
shared_root = unix_users.shared_root
users = unix_users.two_users

# tqdm's bar on stderr: STEPS steps, FAST ones at FAST_RATE, then the rest at SLOW_RATE
BAR = """
import sys, time
steps, fast = int(sys.argv[1]), int(sys.argv[2])
fast_rate, slow_rate = float(sys.argv[3]), float(sys.argv[4])
print("loading the data set", flush=True)
for i in range(1, steps + 1):
    rate = fast_rate if i <= fast else slow_rate
    filled = "#" * (10 * i // steps)
    bar = f"{100 * i // steps:3d}%|{filled:<10}| {i}/{steps}"
    sys.stderr.write(f"\\r{bar} [00:{i % 60:02d}<01:00, {rate:.2f}it/s, loss=0.1]")
    sys.stderr.flush()
    time.sleep(1 / rate)
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, "[agent]\nsample_interval = 0.2\n")
    try:
        running.start_coordinator()
        running.start_agent("a", "1xH100-80GB")
        (tmp_path / "bar.py").write_text(BAR)
        yield running
    finally:
        running.close()


def shown_json(cluster: Cluster, job: int) -> dict[str, Any]:
    shown = cluster.gpuq("show", "--json", str(job))
    assert shown.returncode == 0, shown.stderr
    data: dict[str, Any] = json.loads(shown.stdout)
    return data


def progress_now(cluster: Cluster, job: int) -> Any:
    """The job's progress as the coordinator says it now (the client, quicker than the CLI)."""
    message = cluster.client().detail_reply(job).job
    return message.progress if message.HasField("progress") else None


def test_a_tqdm_jobs_rate_and_eta_show_while_it_runs(cluster: Cluster) -> None:
    # stderr to a file of its own (where tqdm writes), stdout to another
    job = cluster.submit(f"{sys.executable} bar.py 400 400 10 10", gpus=1, error="bar-%j.err")
    cluster.wait_state(job, "running")
    wait_for(lambda: (p := progress_now(cluster, job)) is not None and p.done >= 3, 20, "progress")
    data = shown_json(cluster, job)
    assert data["state"] == "running" and data["stderr"].endswith(f"bar-{job}.err"), data
    progress = data["progress"]
    assert progress["source"] == "tqdm" and progress["unit"] == "it", progress
    assert progress["total"] == 400 and 0 < progress["done"] < 400, progress
    assert progress["rate"] == 10.0, progress  # the bar's own figure
    assert progress["eta"] == pytest.approx((400 - progress["done"]) / 10.0), progress
    assert 0 < progress["fraction"] < 1 and progress["read_at"] > data["start_time"], progress
    # gpuq show and gpuq queue --long say it in words
    text = cluster.gpuq("show", str(job)).stdout
    assert "Throughput: 10it/s" in text and "ETA: 00:00:" in text, text
    assert "/400 it, " in text and "% (tqdm, read " in text, text
    queue = cluster.gpuq("queue", "--long").stdout
    assert "PROGRESS" in queue and "10it/s ETA 00:00:" in queue, queue
    cluster.client().cancel(job)
    cluster.wait_state(job, "cancelled")
    assert shown_json(cluster, job)["progress"] is None  # an ended job's is not kept


def test_gpuq_progress_lines_give_a_rate_from_the_counts(cluster: Cluster) -> None:
    script = 'for i in $(seq 1 400); do echo "GPUQ_PROGRESS $i/400 samples"; sleep 0.1; done'
    job = cluster.submit(script)  # no GPU: progress all the same
    cluster.wait_state(job, "running")
    wait_for(
        lambda: (p := progress_now(cluster, job)) is not None and p.HasField("eta"),
        20,
        "a rate and an ETA from GPUQ_PROGRESS lines",
    )
    progress = shown_json(cluster, job)["progress"]
    assert (progress["source"], progress["unit"], progress["total"]) == ("gpuq", "samples", 400)
    assert 2 < progress["rate"] < 20, progress  # about 10 a second (sleep 0.1 and bash)
    assert progress["eta"] > 0, progress
    cluster.client().cancel(job)


def test_a_collapse_of_throughput_is_flagged(cluster: Cluster) -> None:
    job = cluster.submit(f"{sys.executable} bar.py 1000 40 20 0.5")  # 2 s at 20 it/s, then slow
    cluster.wait_state(job, "running")
    flagged = wait_for(
        lambda: [f for f in cluster.client().detail_reply(job).job.flags if "throughput" in f],
        30,
        "a throughput collapse flag",
    )
    assert flagged[0].startswith("throughput fell from 20 to 0.5 it/s at "), flagged
    data = shown_json(cluster, job)
    assert flagged[0] in data["flags"] and data["progress"]["collapse"] == flagged[0], data
    cluster.client().cancel(job)


def test_the_dashboard_shows_a_jobs_progress_in_the_queue_and_on_its_page(tmp_path: Path) -> None:
    require_browser()
    cluster = Cluster(tmp_path, 'web_listen = "127.0.0.1:0"\n[agent]\nsample_interval = 0.2\n')
    profile = tmp_path / "chromium-profile"
    driver = None
    try:
        cluster.start_coordinator()
        cluster.start_agent("a", "1xH100-80GB")
        (tmp_path / "bar.py").write_text(BAR)
        job = cluster.submit(f"{sys.executable} bar.py 600 600 10 10", gpus=1)
        wait_for(lambda: progress_now(cluster, job) is not None, 20, "progress")
        driver = start_chromium(profile)
        driver.get(str(cluster.client().web_login().url))
        cell_text = f"document.querySelector('[data-progress=\"{job}\"]')?.textContent"
        cell = until(driver, cell_text, "the queue's progress")
        assert "10 it/s ETA 00:0" in cell and "%" in cell, cell
        # progress moves without a job event: the page follows (nodes events, every 5 s)
        moved = f"{cell_text} && {cell_text} !== {json.dumps(cell)}"
        until(driver, moved, "the queue's progress to move", 20)
        driver.get(web_base(cluster) + f"/jobs/{job}")
        page = until(
            driver,
            "[...document.querySelectorAll('dt')].find(d => d.textContent === 'Progress')"
            "?.nextElementSibling.textContent",
            "the job page's progress",
        )
        assert "10 it/s ETA 00:0" in page, page
        screenshot(driver, "progress-job-page.png")
        assert console_errors(driver) == []
        cluster.client().cancel(job)
    finally:
        if driver is not None:
            quit_driver(driver, profile)
        cluster.close()


def test_another_user_sees_no_progress_of_a_job(
    shared_root: Path, users: tuple[UnixUser, UnixUser]
) -> None:
    """alice's job runs as alice: the root agent reads her output as hers; bob, who may not
    read it, sees no progress in `gpuq show --json`, nor in `gpuq queue --long`."""
    alice, bob = users
    cluster = Cluster(shared_root, "[agent]\nsample_interval = 0.2\n")
    try:
        cluster.start_coordinator()
        cluster.start_agent("n1", "1xH100-80GB")
        lines = 'for i in $(seq 1 600); do echo "GPUQ_PROGRESS $i/600"; sleep 0.1; done'
        job = submit_as(alice, cluster.home, "--wrap", lines)
        wait_for(lambda: progress_now(cluster, int(job)) is not None, 30, "alice's progress")

        def shown_to(user: UnixUser) -> dict[str, Any]:
            code, out, err = gpuq_as(user, cluster.home, "show", "--json", job)
            assert code == 0, err
            data: dict[str, Any] = json.loads(out)
            return data

        assert shown_to(alice)["progress"]["source"] == "gpuq"
        theirs = shown_to(bob)
        assert theirs["state"] == "running" and theirs["progress"] is None, theirs
        code, out, err = gpuq_as(bob, cluster.home, "queue", "--long")
        assert code == 0 and job in out, err
        [row] = [line for line in out.splitlines() if line.startswith(job + " ")]
        assert "%" not in row and "ETA" not in row, row
        cluster.client().cancel(int(job))
    finally:
        cluster.close()
