"""MPS share jobs held to their VRAM limit, by measure.

MPS bounds a share job's pinned memory only as far as the job's CUDA runtime honours
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, so the agent measures: a share job whose processes use more
VRAM on its GPU than its limit (exactly: bytes as NVML reports them) is stopped, and ends
out_of_memory; its neighbours on the GPU keep running. The supervisor ends a stopped job
"cancelled" with the reason it was given, so the end report is corrected here (end_state).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from gpuq.agent.gpu.unit_holders import StopJob, UnitHolders
from gpuq.domain.model import GpuUnit
from gpuq.domain.states import JobState
from gpuq.domain.units import format_size

log = logging.getLogger(__name__)
SHARE_GRACE = 10.0  # seconds a share job over its VRAM gets between SIGTERM and SIGKILL


class ShareGuard:
    """`loop`: the agent's event loop, where stops go from the thread that reads the units
    (set when the GPU duties start running; None: over-limit jobs are only logged)."""

    def __init__(
        self,
        holders: UnitHolders,
        stop_job: StopJob,
        units: Callable[[], Mapping[str, GpuUnit]],
    ) -> None:
        self.holders = holders
        self._stop_job = stop_job
        self._units = units
        self.loop: asyncio.AbstractEventLoop | None = None
        self._over: set[int] = set()  # share jobs already stopped over their VRAM
        # share jobs stopped over their VRAM: (state, reason) their end report gets
        self._end_as: dict[int, tuple[JobState, str]] = {}
        self._stops: set[asyncio.Task[object]] = set()

    def check(self, job_id: int, uuid: str, memory: int) -> None:
        """A share job over its VRAM limit (measured, exactly) ends out_of_memory. Called from
        the thread that reads the units."""
        limit = self.holders.share_limits.get(job_id)
        if limit is None or memory <= limit or job_id in self._over:
            return
        self._over.add(job_id)
        unit = self._units().get(uuid)
        where = f"GPU {unit.index}" if unit is not None else uuid
        reason = (
            f"used {format_size(memory)} of its {format_size(limit)} GPU share (MPS) on {where}"
        )
        log.warning("job %d %s: ending it", job_id, reason)
        loop = self.loop
        if loop is None:
            return
        loop.call_soon_threadsafe(self._start_stop, job_id, reason)

    def _start_stop(self, job_id: int, reason: str) -> None:
        self._end_as[job_id] = (JobState.OUT_OF_MEMORY, reason)
        task: asyncio.Task[object] = asyncio.ensure_future(
            self._stop_job(job_id, JobState.OUT_OF_MEMORY, reason, SHARE_GRACE)
        )
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    def end_state(self, job_id: int, end_state: JobState, reason: str) -> JobState:
        """The state a job's end report says: out_of_memory for a share this agent stopped
        over its VRAM (when that stop decided the end), else `end_state`."""
        decided = self._end_as.pop(job_id, None)
        if (
            decided is not None
            and end_state == JobState.CANCELLED
            and reason.startswith(decided[1])
        ):
            return decided[0]
        return end_state

    def job_ended(self, job_id: int) -> None:
        self._over.discard(job_id)
