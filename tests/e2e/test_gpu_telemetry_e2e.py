"""Per-job GPU telemetry end to end on fake GPUs with real processes: a job "allocates" VRAM
through the fake NVML's claim files and keeps its GPU busy; its agent samples it every
sample_interval and reports the peak, utilisation and energy with the job's end."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for

GIB = 1024**3

# claims 20 GiB on its GPU, makes it look 60 % busy, holds both for 3 s, writes a line
HOLD = (
    "import os, time; from gpuq.agent.fake.gpu_state import claim_fake_vram, set_fake_utilization; "
    'gpu = os.environ["CUDA_VISIBLE_DEVICES"]; '
    "set_fake_utilization(gpu, 60); claim_fake_vram(gpu, 20 << 30); "
    'print("holding", flush=True); time.sleep(3); print("done", flush=True)'
)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, "[agent]\nsample_interval = 0.2\n")
    try:
        running.start_coordinator()
        running.start_agent("a", "2xH100-80GB")
        yield running
    finally:
        running.close()


def ended_telemetry(cluster: Cluster, job: int) -> str:
    """The telemetry the agent put in the job's end report (its debug log says it)."""
    log = (cluster.root / "agent-a.log").read_text(errors="replace")
    found = re.findall(rf"job {job}: GPU telemetry (.*)", log)
    return found[-1] if found else ""


def test_a_jobs_end_report_carries_its_peak_vram_utilisation_and_energy(cluster: Cluster) -> None:
    job = cluster.submit(f"{sys.executable} -c '{HOLD}'", gpus=1)
    ended = cluster.wait_state(job, "completed", timeout=30)
    line = wait_for(lambda: ended_telemetry(cluster, job), 10, "the agent's telemetry line")
    assert f"peak_gpu_mem: {20 * GIB}" in line
    samples = int(re.search(r"samples: (\d+)", line).group(1))  # type: ignore[union-attr]
    assert samples >= 5  # 3 s at 0.2 s
    # 60 % from just after its start: a sample or two before (Python starting) saw 0 %
    assert re.search(r"util_p95: 60\b", line), line
    assert "energy:" in line  # a whole GPU: its board's counter
    (unit,) = ended.gpus
    assert f'uuid: "{unit}" peak_mem: {20 * GIB}' in line
    # the coordinator keeps it with the job, and gpuq show says it
    stored = cluster.job(job).telemetry
    assert stored is not None and stored.peak_gpu_mem == 20 * GIB
    assert stored.samples == samples
    shown = cluster.gpuq("show", str(job))
    assert shown.returncode == 0, shown.stderr
    efficiency = next(line for line in shown.stdout.splitlines() if "Efficiency" in line)
    assert "used 20 of 80 GiB peak on 1 GPU" in efficiency, efficiency
    assert re.search(r", [0-9.]+ k?Wh$", efficiency) and " 0 Wh" not in efficiency, efficiency
