"""The agent's CPU cost of sampling its GPUs: prints figures, asserts nothing.

    python bench/telemetry_bench.py [--gpus 8] [--samples 200] [--interval 5]

Runs the agent's real sampling path (NodeGpus.reads.usage: the NVML backend's usage() over the
fake NVML library, attribution of every GPU process to its job (by cgroup, then by ancestry to a
job's supervisor, as on a node without job cgroups), the hand-over watch, and each job's
telemetry accumulator) on --gpus fake H100s with one running job per GPU, each a real process
holding VRAM through the fake's claim files at a changing utilisation. Reports the median CPU
time (time.process_time: user + system of this process, all threads) per sample and what
that is as a share of one core at --interval seconds between samples (the default
[agent] sample_interval), plus the cost of building the heartbeat's job samples.
Target (issue 12): < 1 % of a core at 5 s with 8 GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from gpuq.agent.fake.gpu_backend import FakeGpuBackend
from gpuq.agent.fake.gpu_spec import GIB
from gpuq.agent.fake.gpu_state import claim_fake_vram, set_fake_utilization
from gpuq.agent.gpu.node_gpus import NodeGpus
from gpuq.config.settings import AgentSettings


class BenchHub:
    """What NodeGpus asks of the supervisors: running jobs, their supervisors, launch specs."""

    def __init__(self, supervisors: dict[int, int], out: Path) -> None:
        self.supervisors = supervisors
        self.out = out

    def running_jobs(self) -> list[int]:
        return sorted(self.supervisors.values())

    def supervisor_pids(self) -> dict[int, int]:
        return dict(self.supervisors)

    def launch_spec_of(self, job_id: int) -> object:
        from types import SimpleNamespace

        path = str(self.out / f"job-{job_id}.out")
        return SimpleNamespace(cwd="/", stdout_path=path, stderr_path=path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuq-telemetry-bench-") as folder:
        root = Path(folder)
        state = root / "fake-gpus"
        backend = FakeGpuBackend(f"{args.gpus}xH100-80GB", "bench", state_dir=state)
        units = [u.uuid for u in backend.inventory().units]
        jobs = [subprocess.Popen(["sleep", "3600"]) for _ in units]
        try:
            supervisors = {job.pid: number for number, job in enumerate(jobs, start=1)}
            hub = BenchHub(supervisors, root)
            care = NodeGpus(
                backend,
                AgentSettings(node_name="bench"),
                hub,  # type: ignore[arg-type]
                beat_now=lambda: None,
                units_changed=lambda: None,
                stop_job=lambda *_: asyncio.sleep(0),
            )
            for number, (job, uuid) in enumerate(zip(jobs, units, strict=True), start=1):
                care.holders.job_units[number] = (uuid,)
                claim_fake_vram(uuid, (number + 4) * GIB, pid=job.pid, state_dir=state)
                set_fake_utilization(uuid, [10 * number, 90, 0, 50], state_dir=state, every=0.01)
                (root / f"job-{number}.out").write_bytes(b"x" * 1000 * number)
            care.reads.usage()  # warm up: first reads, lazy imports
            costs = []
            for _ in range(args.samples):
                start = time.process_time()
                care.reads.usage()
                costs.append(time.process_time() - start)
            reads = []  # the backend alone (the fake NVML's file reads), for comparison
            for _ in range(args.samples):
                start = time.process_time()
                backend.usage()
                reads.append(time.process_time() - start)
            beats = []
            for _ in range(args.samples):
                start = time.process_time()
                samples = care.telemetry.job_samples()
                beats.append(time.process_time() - start)
            assert len(samples) == len(units) and all(s.so_far.samples for s in samples)
        finally:
            for job in jobs:
                job.kill()
                job.wait()
            backend.close()
    median = statistics.median(costs)
    beat = statistics.median(beats)
    print(f"{args.gpus} fake GPUs, {len(jobs)} running jobs, {args.samples} samples")
    print(f"  sample (usage + attribution + accumulate): median {median * 1e6:.0f} us CPU")
    print(f"    of which backend.usage() alone: median {statistics.median(reads) * 1e6:.0f} us")
    print(f"  heartbeat's job samples (build {len(jobs)} JobSample): median {beat * 1e6:.0f} us")
    share = (median + beat) / args.interval * 100
    print(f"  at one sample every {args.interval:g} s: {share:.3f} % of a core (target < 1 %)")


if __name__ == "__main__":
    main()
