"""Each job's GPU telemetry while it runs, and after it ends until the coordinator has it.

Each read of the units feeds every running job's figures (gpu.job_gpu_telemetry.JobTelemetry)
and notes the size of its output files. Heartbeats carry each job's latest sample
(job_samples), end reports its telemetry (end_telemetry), kept until the coordinator recorded
the end (forget), for an end report sent again. An agent that restarts starts its jobs'
telemetry anew. Reads happen on a thread of their own, the rest on the event loop: the figures
are shared under a lock.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Container, Sequence

from gpuq.agent.gpu.job_gpu_telemetry import JobTelemetry, UnitReading
from gpuq.agent.gpu.unit_holders import RunningJobs
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb


class TelemetryBook:
    def __init__(self, jobs: RunningJobs) -> None:
        self.jobs = jobs
        self._lock = threading.Lock()
        self.telemetry: dict[int, JobTelemetry] = {}  # running job -> its figures so far
        self._output_bytes: dict[int, int] = {}  # running job -> its output's size, last read
        # ended jobs, until the coordinator has their ends: their telemetry (None: no sample)
        self._ended: dict[int, pb.GpuTelemetry | None] = {}
        self._outputs: dict[int, tuple[str, ...]] = {}  # job -> its stdout/stderr paths

    def has_ended(self, job_id: int) -> bool:
        return job_id in self._ended

    def add(
        self, job_id: int, at: float, readings: Sequence[UnitReading], held: Container[int]
    ) -> None:
        """One read of the job's units, at `at`; and its output's size now. Nothing when the
        job ended (or no longer holds units: `held`) while the read was made."""
        output = self._output_size(job_id)
        with self._lock:
            if job_id in self._ended or job_id not in held:
                return  # it ended while this read was made
            figures = self.telemetry.get(job_id)
            if figures is None:
                figures = self.telemetry[job_id] = JobTelemetry(job_id)
            figures.add(at, readings)
            self._output_bytes[job_id] = output

    def _output_size(self, job_id: int) -> int:
        """Bytes in the job's stdout/stderr files (lstat: a symlink a job put there is not
        followed, and counts 0, as does a missing file)."""
        paths = self._outputs.get(job_id)
        if paths is None:
            spec = self.jobs.launch_spec_of(job_id)
            if spec is None:
                return 0
            found = {spec.stdout_path, spec.stderr_path} - {""}
            paths = tuple(sorted(os.path.join(spec.cwd, path) for path in found))
            self._outputs[job_id] = paths
        total = 0
        for path in paths:
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
        return total

    def job_samples(self) -> list[apb.JobSample]:
        """The latest sample of each running job holding units, for the next heartbeat."""
        with self._lock:
            found = [
                figures.sample(self._output_bytes.get(job_id, 0))
                for job_id, figures in sorted(self.telemetry.items())
            ]
        return [sample for sample in found if sample is not None]

    def end_telemetry(self, job_id: int) -> pb.GpuTelemetry | None:
        """The job ended: its telemetry (None: no sample of it), kept for its end report
        until forget(); it gets no more samples."""
        with self._lock:
            if job_id in self._ended:
                return self._ended[job_id]
            figures = self.telemetry.pop(job_id, None)
            self._output_bytes.pop(job_id, None)
            found = None if figures is None or not figures.samples else figures.telemetry()
            self._ended[job_id] = found
        self._outputs.pop(job_id, None)
        return found

    def ended_telemetry(self, job_id: int) -> pb.GpuTelemetry | None:
        """An ended job's telemetry, for its end report sent again (None: none known)."""
        with self._lock:
            return self._ended.get(job_id)

    def forget(self, job_id: int) -> None:
        """The coordinator recorded the job's end: a later start of it is measured anew."""
        with self._lock:
            self._ended.pop(job_id, None)
            self.telemetry.pop(job_id, None)
            self._output_bytes.pop(job_id, None)
        self._outputs.pop(job_id, None)
