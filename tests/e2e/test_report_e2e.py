"""GPU telemetry end to end (issue 12): a real coordinator and a raw agent stream that runs
nothing and reports what its jobs' GPUs did (heartbeat samples with `so_far`, and telemetry on
ENDED reports). What it reports is kept with each job, `gpuq show` prints the efficiency line,
`gpuq history` its columns, and `gpuq report --json` totals match the sum of the jobs' records.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for
from raw_agent import RawAgent

from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

GIB = 1 << 30


class ReportingAgent(RawAgent):
    """Takes starts and runs nothing; every 0.2 s a heartbeat whose samples carry `so_far[job]`
    (when set); `end(job, telemetry)` reports the job completed with those figures."""

    def __init__(self, cluster: Cluster, node: str, gpus: int) -> None:
        self.so_far: dict[int, pb.GpuTelemetry] = {}
        super().__init__(cluster, node, gpus, sampler=self._reported)

    def _reported(self, job_id: int, launch: apb.JobLaunch) -> apb.JobSample:
        return apb.JobSample(
            job_id=job_id,
            at=time.time(),
            gpu_mem=GIB,
            units=[apb.UnitSample(uuid=u, util=50.0, memory=GIB) for u in launch.gpus],
            **({"so_far": self.so_far[job_id]} if job_id in self.so_far else {}),
        )


def measured(peak_gib: float, util: float | None, joules: float | None) -> pb.GpuTelemetry:
    return pb.GpuTelemetry(
        peak_gpu_mem=int(peak_gib * GIB),
        util_mean=util,
        util_p95=None if util is None else min(100.0, util * 2),
        energy=joules,
        samples=10,
        seconds=2.0,
    )


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Cluster, ReportingAgent]:
    cluster = Cluster(tmp_path)
    cluster.start_coordinator()
    agent = ReportingAgent(cluster, "raw", gpus=5)
    try:
        cluster.wait_node("raw", "up")
    except BaseException:
        agent.close()
        cluster.close()
        raise
    return cluster, agent


def test_report_totals_match_the_jobs_records(setup: tuple[Cluster, ReportingAgent]) -> None:
    cluster, agent = setup
    try:
        big = cluster.submit("sleep 600", gpus=2)
        small = cluster.submit("sleep 600", gpus=1)
        quiet = cluster.submit("sleep 600", gpus=1)  # its agent measures nothing
        beat = cluster.submit("sleep 600", gpus=1)  # figures only from heartbeats
        for job in (big, small, quiet, beat):
            cluster.wait_state(job, "running")
            wait_for(lambda job=job: job in agent.running, what=f"job {job}'s start")
        agent.so_far[beat] = measured(3.0, 80.0, 7.2e5)
        # a heartbeat carried it: the coordinator shows it with the running job
        wait_for(
            lambda: (
                (seen := cluster.job(beat).telemetry) is not None and seen.peak_gpu_mem == 3 * GIB
            ),
            what="a heartbeat to carry the figures so far",
        )
        agent.end(big, telemetry=measured(31.0, 12.0, 6.84e6))
        agent.end(small, telemetry=measured(2.5, None, 3.6e5))  # utilisation unknown
        agent.end(quiet)
        agent.end(beat)  # the latest heartbeat's figures stand in
        jobs = [cluster.wait_state(j, "completed") for j in (big, small, quiet, beat)]

        # the figures are kept with each job
        by_id = {j.id: j for j in jobs}
        assert by_id[quiet].telemetry is None
        assert by_id[big].telemetry is not None and by_id[big].telemetry.util_mean == 12.0
        assert by_id[small].telemetry is not None and by_id[small].telemetry.util_mean is None
        assert by_id[beat].telemetry is not None
        assert by_id[beat].telemetry.peak_gpu_mem == 3 * GIB

        # gpuq report --json: the sums over the jobs' records
        result = cluster.gpuq("report", "--json")
        assert result.returncode == 0, result.stderr
        [row] = json.loads(result.stdout)
        held = {j.id: len(j.gpus) * (j.end_time - j.start_time) for j in jobs}  # type: ignore[operator]
        assert row["user"] == jobs[0].user and row["jobs"] == 4
        assert row["gpu_hours"] == pytest.approx(sum(held.values()) / 3600)
        joules = sum(j.telemetry.energy for j in jobs if j.telemetry and j.telemetry.energy)
        assert row["energy_kwh"] == pytest.approx(joules / 3.6e6)
        known = [j for j in jobs if j.telemetry and j.telemetry.util_mean is not None]
        weight = sum(held[j.id] for j in known)
        mean = sum(j.telemetry.util_mean * held[j.id] for j in known) / weight  # type: ignore[union-attr,operator]
        assert row["mean_util"] == pytest.approx(mean)
        assert row["measured_gpu_hours"] == pytest.approx(weight / 3600)
        assert json.loads(cluster.gpuq("report", "--user", "nobody", "--json").stdout) == []
        later = cluster.gpuq("report", "--since", "2100-01-01", "--json")
        assert later.returncode == 0 and json.loads(later.stdout) == []
        text = cluster.gpuq("report")
        assert text.returncode == 0 and "GPU-HOURS" in text.stdout

        # gpuq show: the efficiency line, unknown parts said so
        show = cluster.gpuq("show", str(big))
        assert show.returncode == 0, show.stderr
        assert "Efficiency: used 31 of 160 GiB peak on 2 GPUs, mean SM busy 12 %, 1.9 kWh" in (
            show.stdout
        )
        show = cluster.gpuq("show", str(small)).stdout
        assert "mean SM busy unknown, 0.1 kWh" in show
        assert (
            "Efficiency: unknown on 1 GPU (nothing measured)"
            in cluster.gpuq("show", str(quiet)).stdout
        )
        data = json.loads(cluster.gpuq("show", "--json", str(big)).stdout)
        assert data["telemetry"]["peak_gpu_mem"] == 31 * GIB
        assert data["efficiency"].startswith("used 31 of 160 GiB")

        # gpuq history: its columns
        history = cluster.gpuq("history").stdout
        assert "VRAM" in history and "31G" in history and "12%" in history
    finally:
        agent.close()
        cluster.close()
