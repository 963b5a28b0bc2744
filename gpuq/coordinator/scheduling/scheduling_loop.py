"""The scheduling loop: one pass at a time, whenever something asked for one (`wake`), at
most one per PASS_GAP; under load whatever arrived meanwhile (submissions, job ends) shares one
pass and one commit. A pass that fails reloads memory from the store (waiting out a store
outage) and tries again. Also the periodic re-ranking of the queue (age and fair share move;
SLURM's PriorityCalcPeriod), and reading the measured run times that estimated starts use
(beside the passes, never holding one up).
"""

from __future__ import annotations

import asyncio
import logging
import time

from gpuq.coordinator.background_tasks import Background
from gpuq.coordinator.changes.effects import Cause
from gpuq.coordinator.changes.event_bus import EventBus
from gpuq.coordinator.changes.store_writer import RETRY_FIRST, RETRY_MOST, is_storage_error
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.memory_loader import MemoryLoader
from gpuq.coordinator.memory.scheduler_inputs import SchedulerInputs
from gpuq.coordinator.scheduling.scheduling_pass import SchedulingPass

log = logging.getLogger(__name__)

# seconds from one scheduling pass to the next, at least: when idle a pass runs at once, and
# under load whatever arrived meanwhile (submissions, job ends) shares one pass and one commit
PASS_GAP = 0.005


class PassRequests:
    """Asks for a scheduling pass: many asks before it runs make one pass."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def wake(self) -> None:
        self.event.set()


class SchedulingLoop:
    def __init__(
        self,
        requests: PassRequests,
        scheduling: SchedulingPass,
        jobs: LiveJobs,
        inputs: SchedulerInputs,
        loader: MemoryLoader,
        bus: EventBus,
    ) -> None:
        self.requests = requests
        self.scheduling = scheduling
        self.jobs = jobs
        self.inputs = inputs
        self.loader = loader
        self.bus = bus
        self.passes = 0
        self.clock = scheduling.clock
        self.reading = Background("reading measured run times")

    def wake(self) -> None:
        self.requests.wake()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        last = -PASS_GAP
        dirty = self.requests.event
        while True:
            await dirty.wait()
            if (wait := last + PASS_GAP - loop.time()) > 0:
                await asyncio.sleep(wait)
            dirty.clear()
            last = loop.time()
            self.passes += 1
            self._read_run_times()
            try:
                await self._timed_pass()
            except Exception as exc:
                if is_storage_error(exc):
                    log.warning("scheduling pass failed: the job store failed (%s)", exc)
                else:
                    log.exception("scheduling pass failed; reloading live jobs from the store")
                await self._reload_until_done()
                self.wake()
                await asyncio.sleep(0.5)

    def _read_run_times(self) -> None:
        """Read the measured run times when they are due (SchedulerInputs.run_times_due), in
        the background; once read, queued jobs are explained afresh."""
        if self.reading.tasks or not self.inputs.run_times_due(self.clock()):
            return

        async def read() -> None:
            await self.loader.read_run_times()
            self.scheduling.forget_explanation()

        self.reading.spawn(read())

    async def close(self) -> None:
        await self.reading.cancel()

    async def _timed_pass(self) -> None:
        started = time.perf_counter()
        try:
            await self.scheduling.run(Cause.chore(f"scheduling pass {self.passes}"))
        finally:
            self.bus.pass_ran(time.perf_counter() - started)

    async def _reload_until_done(self) -> None:
        """Reload live jobs after a failed pass; while the store is down, wait for it (with
        backoff) instead of ending the scheduler."""
        delay = RETRY_FIRST
        while True:
            try:
                await self.loader.reload_jobs()
                return
            except Exception as exc:
                if not is_storage_error(exc):
                    raise
                log.debug("reloading live jobs: the job store is still down (%s)", exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MOST)

    def rerank(self) -> None:
        """Recompute fair shares and every pending job's priority, then schedule."""
        now = self.clock()
        jobs = self.jobs
        self.inputs.refresh_shares({j.user for j in jobs.jobs.values()}, now)
        jobs.rerank()
        wanted = {(d.job_id, d.task) for j in jobs.jobs.values() for d in j.spec.dependencies}
        self.inputs.finished = {k: v for k, v in self.inputs.finished.items() if k in wanted}
        self.wake()
