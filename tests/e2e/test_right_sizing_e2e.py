"""Right-sizing on the real command line (issue 26): a real coordinator and a raw agent stream
that runs nothing and reports what its jobs' GPUs did. A history of jobs that asked --gpu-mem
40G and peaked at 10G gets `gpuq report --advice` (text and --json) suggesting a smaller
--gpu-mem; `gpuq eff` of one of them says so too; `gpuq eff` of a job that does not exist is
one clear error."""

from __future__ import annotations

import json
from pathlib import Path

from e2e_cluster import Cluster, wait_for
from raw_agent import RawAgent

from gpuq.v1 import types_pb2 as pb

GIB = 1 << 30


def peaked_at(gib: float) -> pb.GpuTelemetry:
    return pb.GpuTelemetry(
        peak_gpu_mem=int(gib * GIB), util_mean=70.0, util_p95=90.0, energy=3.6e5, samples=5
    )


def test_advice_and_eff_on_the_command_line(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    cluster.start_coordinator()
    agent = RawAgent(cluster, "raw", gpus=1)  # one 80 GiB GPU
    try:
        cluster.wait_node("raw", "up")
        jobs = []
        for peak in (10.0, 9.0, 8.0):
            job = cluster.submit("python train.py", gpus=1, gpu_mem="40G", name="train")
            wait_for(lambda job=job: job in agent.running, what=f"job {job}'s start")
            agent.end(job, telemetry=peaked_at(peak))
            cluster.wait_state(job, "completed")
            jobs.append(job)

        text = cluster.gpuq("report", "--advice")
        assert text.returncode == 0, text.stderr
        assert "Right-sizing advice for" in text.stdout
        assert "train: 3 jobs; GPU memory peak 10 GiB (p95 10 GiB) of 40 GiB asked" in text.stdout
        assert "would fit: --gpu-mem 12G --time 00:05:00" in text.stdout

        data = json.loads(cluster.gpuq("report", "--advice", "--json").stdout)
        [advice] = data["advice"]
        assert advice["name"] == "train" and advice["jobs"] == 3
        assert advice["gpu_mem_asked"] == 40 * GIB and advice["gpu_mem_peak"] == 10 * GIB
        assert advice["suggest"]["gpu_mem"] == 12 * GIB < advice["gpu_mem_asked"]
        assert data["idle"] == [] and [r["jobs"] for r in data["usage"]] == [3]
        # without --advice the report is what it was: a list of rows
        assert isinstance(json.loads(cluster.gpuq("report", "--json").stdout), list)

        eff = cluster.gpuq("eff", str(jobs[0]))
        assert eff.returncode == 0, eff.stderr
        assert "GPU memory: peak 10 GiB of 40 GiB asked (25%)" in eff.stdout
        assert "GPU memory: peak 10 GiB of 40 GiB asked (25%): --gpu-mem 12G would fit" in (
            eff.stdout
        )
        assert "Host memory: no --mem asked; peak not reported" in eff.stdout
        figures = json.loads(cluster.gpuq("eff", "--json", str(jobs[0])).stdout)
        assert figures["state"] == "completed" and figures["time_limit"] == 86400
        assert figures["gpu_mem_peak"] == 10 * GIB and figures["gpu_mem_used_percent"] == 25.0
        assert figures["card_mem"] == 80 * GIB and figures["util_mean"] == 70.0
        assert any(v.startswith("GPU memory: peak 10 GiB") for v in figures["verdicts"])

        missing = cluster.gpuq("eff", "99999")
        assert missing.returncode != 0 and missing.stdout == ""
        assert missing.stderr.strip().splitlines() == ["gpuq: error: no job 99999"], missing.stderr
        bad = cluster.gpuq("eff", "abc")
        assert bad.returncode != 0 and "expected a job id such as 42" in bad.stderr
    finally:
        agent.close()
        cluster.close()
