"""GPU telemetry end to end (issue 12): a real coordinator and a raw agent stream that runs
nothing and reports what its jobs' GPUs did (heartbeat samples with `so_far`, and telemetry on
ENDED reports). What it reports is kept with each job, `gpuq show` prints the efficiency line,
`gpuq history` its columns, and `gpuq report --json` totals match the sum of the jobs' records.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from pathlib import Path

import grpc
import pytest
from e2e_cluster import Cluster, wait_for

from gpuq.identity import create_key_file, node_metadata
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import agent_pb2_grpc
from gpuq.v1 import types_pb2 as pb

GIB = 1 << 30


class ReportingAgent:
    """Takes starts and runs nothing; every 0.2 s a heartbeat whose samples carry `so_far[job]`
    (when set); `end(job, telemetry)` reports the job completed with those figures."""

    def __init__(self, cluster: Cluster, node: str, gpus: int) -> None:
        self.uuids = [f"GPU-{node}-{i}" for i in range(gpus)]
        self.running: dict[int, apb.JobLaunch] = {}
        self.so_far: dict[int, pb.GpuTelemetry] = {}
        self._outbox: queue.Queue[apb.AgentMessage | None] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        key = create_key_file(cluster.home / "nodes" / f"{node}.key")
        self._channel = grpc.insecure_channel(f"unix:{cluster.home / 'gpuq.sock'}")
        register = apb.Register(
            node=node,
            cpus=8,
            mem=64 * GIB,
            fake=True,
            gpus=[
                pb.GpuUnit(uuid=u, index=i, name="fake", memory=80 * GIB)
                for i, u in enumerate(self.uuids)
            ],
        )
        self._outbox.put(apb.AgentMessage(register=register))
        self._stream = agent_pb2_grpc.AgentLinkStub(self._channel).Connect(
            iter(self._outbox.get, None), metadata=(node_metadata(node, key),)
        )
        self._threads = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._beat, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read(self) -> None:
        with contextlib.suppress(grpc.RpcError):
            for message in self._stream:
                with self._lock:
                    for launch in message.start:
                        self.running[launch.job_id] = launch

    def _beat(self) -> None:
        while not self._closed.wait(0.2):
            with self._lock:
                samples = [
                    apb.JobSample(
                        job_id=job_id,
                        at=time.time(),
                        gpu_mem=GIB,
                        units=[apb.UnitSample(uuid=u, util=50.0, memory=GIB) for u in launch.gpus],
                        **({"so_far": self.so_far[job_id]} if job_id in self.so_far else {}),
                    )
                    for job_id, launch in self.running.items()
                ]
            usage = [pb.GpuUsage(uuid=u, health="ok") for u in self.uuids]
            heartbeat = apb.Heartbeat(at=time.time(), usage=usage, jobs=samples)
            self._outbox.put(apb.AgentMessage(heartbeat=heartbeat))

    def end(self, job_id: int, telemetry: pb.GpuTelemetry | None) -> None:
        with self._lock:
            launch = self.running.pop(job_id)
        report = apb.JobReport(
            job_id=job_id,
            kind=apb.JobReport.ENDED,
            end_state="completed",
            result=pb.JobResult(exit_code=0, reason="exit code 0"),
            at=time.time(),
            attempt=launch.attempt,
            **({"telemetry": telemetry} if telemetry is not None else {}),
        )
        self._outbox.put(apb.AgentMessage(reports=[report]))

    def close(self) -> None:
        self._closed.set()
        self._outbox.put(None)
        self._stream.cancel()
        self._channel.close()
        for thread in self._threads:
            thread.join(5)


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
        time.sleep(1.0)  # a few heartbeats carry it
        agent.end(big, measured(31.0, 12.0, 6.84e6))
        agent.end(small, measured(2.5, None, 3.6e5))  # utilisation unknown
        agent.end(quiet, None)
        agent.end(beat, None)  # the latest heartbeat's figures stand in
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
