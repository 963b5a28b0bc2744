"""Idle and hung jobs end to end: a real coordinator, and a raw agent stream (a node's key, its
own heartbeats) that runs nothing and says what its jobs' GPUs do (Heartbeat.jobs). A job held
idle past its QOS's window is flagged (on its record and in its events) and, under a QOS that
cancels idle jobs, cancelled with the reason; one whose GPUs get busy loses the flag; a 2-GPU
job whose GPUs stay at one figure with no output is flagged possibly hung."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from e2e_cluster import Cluster, wait_for
from raw_agent import RawAgent

from gpuq.v1 import agent_pb2 as apb

GIB = 1 << 30
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


class IdleAgent(RawAgent):
    """A node that runs no processes: it takes starts, answers stops with an end, and every
    0.2 s sends a heartbeat whose job samples carry `utils[job]` (per unit; unset: 0 %) and
    output that grows for jobs in `writing`."""

    def __init__(self, cluster: Cluster, node: str, gpus: int) -> None:
        self.utils: dict[int, list[float | None]] = {}
        self.writing: set[int] = set()  # jobs whose output grows at every heartbeat
        super().__init__(cluster, node, gpus, sampler=self._idle_sample)

    def _idle_sample(self, job_id: int, launch: apb.JobLaunch) -> apb.JobSample:
        utils = self.utils.get(job_id, [0.0] * len(launch.gpus))
        units = [
            apb.UnitSample(uuid=u, memory=GIB, **({} if util is None else {"util": util}))
            for u, util in zip(launch.gpus, utils, strict=False)
        ]
        return apb.JobSample(
            job_id=job_id,
            at=time.time(),
            gpu_mem=GIB * len(units),
            units=units,
            output_bytes=int(time.time() * 1000) if job_id in self.writing else 0,
        )


def flags(cluster: Cluster, job_id: int) -> list[str]:
    job, _ = cluster.client().detail(job_id)
    return list(job.flags)


def notes(cluster: Cluster, job_id: int) -> list[str]:
    _, events = cluster.client().detail(job_id)
    return [e.reason for e in events if e.from_state == e.to_state]


def started(cluster: Cluster, agent: IdleAgent, job_id: int) -> None:
    cluster.wait_state(job_id, "running")
    wait_for(lambda: job_id in agent.running, what=f"job {job_id}'s start to reach the agent")


def test_idle_jobs_are_flagged_cleared_and_cancelled_by_qos(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, CONFIG)
    cluster.start_coordinator()
    agent = IdleAgent(cluster, "raw", gpus=4)
    try:
        cluster.wait_node("raw", "up")
        watched = cluster.submit("sleep 600", gpus=1)
        reaped = cluster.submit("sleep 600", gpus=1, qos="reaper")
        unknown = cluster.submit("sleep 600", gpus=1)
        for job in (watched, reaped, unknown):
            started(cluster, agent, job)
        agent.utils[unknown] = [None]  # unknown is never idle
        agent.utils[watched] = [0.0]

        # flag only: the flag shows on the job and in its events, and the job keeps running
        [line] = wait_for(lambda: flags(cluster, watched), 15, "the idle flag")
        assert line.startswith("idle since ") and line.endswith("below 5% for 2 s"), line
        assert notes(cluster, watched) == [line]
        assert cluster.job(watched).state.value == "running"

        # auto-cancel: cancelled with the reason
        done = cluster.wait_state(reaped, "cancelled", timeout=15)
        assert done.reason == "cancelled: idle: its GPUs below 5% for 2 s (qos reaper)"
        assert any(s.job_id == reaped and s.end_state == "cancelled" for s in agent.stops)
        assert notes(cluster, reaped)[0].startswith("idle since ")
        assert flags(cluster, reaped) == []  # an ended job has none

        # the GPUs get busy: the flag goes, and that is in the events too
        agent.utils[watched] = [80.0]
        wait_for(lambda: not flags(cluster, watched), 15, "the idle flag to clear")
        assert notes(cluster, watched) == [line, f"flag cleared: {line}"]

        assert flags(cluster, unknown) == [] and notes(cluster, unknown) == []
        assert cluster.job(unknown).state.value == "running"
    finally:
        agent.close()
        cluster.close()


def test_a_multi_gpu_job_stuck_at_one_figure_is_possibly_hung(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, CONFIG)
    cluster.start_coordinator()
    agent = IdleAgent(cluster, "raw", gpus=2)
    try:
        cluster.wait_node("raw", "up")
        job = cluster.submit("sleep 600", gpus=2)
        agent.utils[job] = [100.0, 100.0]
        started(cluster, agent, job)
        [line] = wait_for(lambda: flags(cluster, job), 15, "the hung flag")
        assert line.startswith("possibly hung (NCCL?) since "), line
        assert line.endswith("2 GPUs at 100% with unchanged memory and no output for 2 s")
        # it writes output: not hung (and stays so while it writes)
        agent.writing.add(job)
        wait_for(lambda: not flags(cluster, job), 15, "the hung flag to clear")
        time.sleep(3)  # past another window
        assert flags(cluster, job) == [] and cluster.job(job).state.value == "running"
    finally:
        agent.close()
        cluster.close()


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
