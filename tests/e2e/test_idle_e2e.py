"""Idle jobs end to end: a real agent samples its fake GPU, and the coordinator cancels the job
its QOS says to. (The idle and hung rules as the coordinator applies them, flags, events and
cancels, on a clock moved by hand: tests/store/test_idle_coordinator.py, in process.)"""

from __future__ import annotations

import sys
from pathlib import Path

from e2e_cluster import Cluster

# normal: flag only; reaper: cancel idle jobs. Both: 2 s windows.
CONFIG = """
[qos.normal]
priority = 1000
default_time = 3600
idle_window = 2
hung_window = 2

[qos.reaper]
priority = 1000
default_time = 3600
idle_window = 2
idle_action = "cancel"
hung_window = 0
"""

IDLE_JOB = (
    "import os, time; from gpuq.agent.fake.gpu_state import claim_fake_vram, set_fake_utilization; "
    'gpu = os.environ["CUDA_VISIBLE_DEVICES"]; set_fake_utilization(gpu, 1); '
    "claim_fake_vram(gpu, 1 << 30); time.sleep(120)"
)


def test_a_real_agents_idle_job_is_cancelled_under_a_reaping_qos(tmp_path: Path) -> None:
    """The whole way: the real agent samples its fake GPU at 1 % busy, the coordinator flags
    the job idle after the QOS's window and cancels it with the reason."""
    cluster = Cluster(tmp_path, "[agent]\nsample_interval = 0.2\n" + CONFIG)
    cluster.start_coordinator()
    try:
        cluster.start_agent("a", "1xH100-80GB")
        job = cluster.submit(f"{sys.executable} -c '{IDLE_JOB}'", gpus=1, qos="reaper")
        ended = cluster.wait_state(job, "cancelled", timeout=30)
        assert ended.result is not None
        assert "idle: its GPUs below 5% for 2 s (qos reaper)" in ended.result.reason, ended
    finally:
        cluster.close()
