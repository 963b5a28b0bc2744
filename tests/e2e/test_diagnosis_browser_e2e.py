"""A job's diagnosis on the dashboard's job page, in headless Chromium: a job whose output ends
with a PyTorch CUDA OOM shows the verdict, its evidence and the expandable_segments next step,
as text (the output it quotes never becomes markup). Screenshot: dashboard-job-diagnosis.png
in $GPUQ_TEST_ARTIFACTS (else <repo>/.artifacts)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import console_errors, require_browser, screenshot
from e2e_cluster import Cluster
from test_dashboard_browser_e2e import sign_in_link, until, web_base

LOG = Path(__file__).resolve().parents[1] / "unit" / "diagnosis_logs" / "torch_oom_fragmented.log"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    require_browser()
    running = Cluster(tmp_path, 'web_listen = "127.0.0.1:0"\n')
    try:
        running.start_coordinator()
        running.start_agent("a", "2xA100-80GB")
        yield running
    finally:
        running.close()


def test_the_job_page_shows_the_verdict_its_evidence_and_next_step(
    cluster: Cluster, driver: Any
) -> None:
    job = cluster.submit(
        f"cat {LOG} >&2; echo '<img src=x id=xss> CUDA error: boom' >&2; exit 1", gpus=1
    )
    cluster.wait_state(job, "failed")
    driver.get(sign_in_link(cluster))
    until(driver, "location.pathname === '/' && location.hash === ''", "the ticket to go")
    driver.get(f"{web_base(cluster)}/jobs/{job}")
    section = "document.getElementById('diagnosis')"
    until(driver, f"{section} && {section}.textContent.includes('[cuda-oom]')", "the diagnosis")
    text = driver.execute_script(f"return {section}.textContent;")
    assert "GPU out of memory" in text
    assert "Next step: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in text
    assert "reserved but unallocated" in text
    assert "[python-traceback]" in text and "[cuda-error]" in text
    assert driver.execute_script("return document.getElementById('xss');") is None
    screenshot(driver, "dashboard-job-diagnosis.png")
    assert console_errors(driver) == []
