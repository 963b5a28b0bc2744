"""What the agent does about an XID (or other critical event) on one of its units.

An application XID (the job's own fault: an illegal address, a killed context) is noted for the
job holding the unit, and said in its end reason; a hardware XID makes the unit unhealthy (the
backend marks it; the next heartbeat says so at once) and ends the job holding it node_fail, so
that its QOS decides on a requeue. A faulting program can raise an XID storm: each (unit, XID)
is logged once a minute.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from gpuq.agent.gpu.backend import GpuEvent
from gpuq.agent.gpu.unit_holders import StopJob, UnitHolders
from gpuq.domain.model import GpuUnit
from gpuq.domain.states import JobState

log = logging.getLogger(__name__)
XID_GRACE = 10.0  # seconds a job on a failed GPU gets between SIGTERM and SIGKILL
MAX_NOTES = 8  # notes kept per job
XID_LOG_EVERY = 60.0  # seconds between two log lines for the same XID on the same unit


class XidEvents:
    def __init__(
        self,
        units: Callable[[], Mapping[str, GpuUnit]],
        holders: UnitHolders,
        *,
        beat_now: Callable[[], None],
        stop_job: StopJob,
    ) -> None:
        self._units = units
        self.holders = holders
        self._beat_now = beat_now
        self._stop_job = stop_job
        # what a job's end reason adds: its application XIDs (and the launcher's notes)
        self.job_notes: dict[int, list[str]] = {}
        self._logged: dict[tuple[str, int], float] = {}  # (unit, XID) -> when last logged

    async def on_event(self, event: GpuEvent) -> None:
        unit = self._units().get(event.uuid)
        where = f"GPU {unit.index}" if unit is not None else event.uuid
        if unit is not None and unit.mig_profile:
            where += f" (MIG {unit.mig_profile})"
        holder = self.holders.holders().get(event.uuid)
        now = time.monotonic()
        key = (event.uuid, event.xid)
        loud = now - self._logged.get(key, -XID_LOG_EVERY) >= XID_LOG_EVERY
        if loud:
            self._logged[key] = now
        if not event.hardware:
            log.log(
                logging.WARNING if loud else logging.DEBUG,
                "%s: %s (job %s)",
                where,
                event.text,
                holder,
            )
            if holder is not None:
                notes = self.job_notes.setdefault(holder, [])
                note = f"{event.text} on {where}"
                if len(notes) < MAX_NOTES and note not in notes:
                    notes.append(note)
            return
        log.log(
            logging.ERROR if loud else logging.DEBUG,
            "%s: %s; the GPU takes no more jobs",
            where,
            event.text,
        )
        self._beat_now()
        if holder is not None:
            reason = f"{where} failed: {event.text}"
            await self._stop_job(holder, JobState.NODE_FAIL, reason, XID_GRACE)

    def end_notes(self, job_id: int) -> str:
        """What to add to the job's end reason: the application XIDs it caused, and notes."""
        return "; ".join(self.job_notes.pop(job_id, []))
