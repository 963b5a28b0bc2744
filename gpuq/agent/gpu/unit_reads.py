"""Reading the node's units: the heartbeat's figures and health, and everything a read feeds.

The backend never raises for NVML trouble (a unit it cannot read is unhealthy, with the
reason); a read adds what only the agent knows: which job a process belongs to (by cgroup,
gpuq.agent.jobs.attribution), whether each unit can be handed to the next job
(gpu.handover_watch decides; this does the reads and the kills), each running job's telemetry
(gpu.telemetry_book) and whether a share job is over its VRAM (gpu.share_guard).

A heartbeat may reuse a read made moments ago (max_age) instead of reading NVML again; one
that must be current, such as the one sent with a job's end, reads anew: the units the ended
jobs held (`fresh`), the others' figures taken from a read at most max_age old. Under a drain
of short jobs that is a read of one unit per end instead of every unit per end report (issue
27: the reads of all 8 fake GPUs with each end were half the agent's CPU). Blocking (NVML,
/proc): run it in a thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Collection

from gpuq.agent.gpu.backend import HEALTH_OK, GpuBackend, UnitUsage
from gpuq.agent.gpu.handover_watch import ProcessFacts, UnitVerdict, UnitWatch
from gpuq.agent.gpu.job_gpu_telemetry import UnitReading
from gpuq.agent.gpu.share_guard import ShareGuard
from gpuq.agent.gpu.telemetry_book import TelemetryBook
from gpuq.agent.gpu.unit_holders import RunningJobs, UnitHolders
from gpuq.agent.jobs.attribution import JobOfProcess, pid_alive, process_name
from gpuq.agent.jobs.mps_daemons import MpsDaemons
from gpuq.v1 import types_pb2 as pb

log = logging.getLogger(__name__)
MAX_NOTES = 8  # notes kept per unit


class UnitReader:
    """`mps`: the agent's MPS daemons, whose processes are never foreign (None: none);
    `refresh_wanted`: told after a read that left the backend wanting a refresh (its
    needs_refresh), from the reading thread."""

    def __init__(
        self,
        backend: GpuBackend,
        jobs: RunningJobs,
        holders: UnitHolders,
        watch: UnitWatch,
        job_of: JobOfProcess,
        telemetry: TelemetryBook,
        shares: ShareGuard,
        mps: MpsDaemons | None = None,
        *,
        refresh_wanted: Callable[[], None] = lambda: None,
    ) -> None:
        self.backend = backend
        self.refresh_wanted = refresh_wanted
        self.jobs = jobs
        self.holders = holders
        self.watch = watch
        self.job_of = job_of
        self.telemetry = telemetry
        self.shares = shares
        self.mps = mps
        self.verdicts: dict[str, UnitVerdict] = {}
        # one read of the units at a time (the heartbeat's and the sampler's threads)
        self._lock = threading.Lock()
        self.last_read = -float("inf")  # monotonic time of the last read of every unit
        self._last_figures: list[pb.GpuUsage] = []

    def usage(self, max_age: float = 0.0, fresh: Collection[str] = ()) -> list[pb.GpuUsage]:
        """Every unit's figures and health.

        max_age: the figures of a read at most that many seconds old do (0: read now), but
        for the units in `fresh`, which are read now. A read feeds the running jobs'
        telemetry (a read of some units, only the jobs that hold nothing else)."""
        with self._lock:
            recent = max_age > 0 and time.monotonic() - self.last_read < max_age
            if recent and not fresh:
                return list(self._last_figures)
            if recent:
                figures = self._read(set(fresh))
            else:
                figures = self._read()
                self.last_read = time.monotonic()
            self._last_figures = figures
            return list(figures)

    def _read(self, only: set[str] | None = None) -> list[pb.GpuUsage]:
        """Read every unit, or `only` those (the others' figures as the last read found
        them); telemetry (utilisation, energy) only of the units jobs hold, the others'
        health only."""
        holders = self.holders.holders()
        samples = self.backend.usage(telemetry=holders.keys(), only=only)
        if getattr(self.backend, "needs_refresh", False):
            self.refresh_wanted()
        at = time.time()
        facts = self._facts(samples)
        self._record(samples, facts, at, only)
        watched, watch_facts = self._for_watch(samples, facts, holders)
        assessment = self.watch.assess(watched, holders, watch_facts, partial=only is not None)
        for finding in assessment.flagged:
            log.warning("foreign process on a GPU: %s", finding)  # a container's says so
        for pid in assessment.kill:
            log.warning("killing pid %d (%s) on a GPU", pid, facts.name.get(pid, "?"))
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if only is None:
            self.verdicts = assessment.verdicts
            return [self._proto(sample, facts) for sample in samples]
        self.verdicts.update(assessment.verdicts)
        read = {sample.uuid: self._proto(sample, facts) for sample in samples}
        return [read.pop(f.uuid, f) for f in self._last_figures] + list(read.values())

    def _record(
        self, samples: list[UnitUsage], facts: ProcessFacts, at: float, only: set[str] | None
    ) -> None:
        """Feed one read to each running job holding units: its processes' bytes per unit
        (by cgroup), the units' utilisation and energy counters; and its output's size.
        `only`: the units read now (a job holding any other is not fed old figures again)."""
        by_uuid = {sample.uuid: sample for sample in samples}
        for job_id in self.jobs.running_jobs():
            units = self.holders.holders_of(job_id)
            if not units or self.telemetry.has_ended(job_id):
                continue
            if only is not None and not only.issuperset(units):
                continue
            readings = []
            for uuid in units:
                sample = by_uuid.get(uuid)
                if sample is None:  # the unit is gone (the GPUs changed): nothing known
                    readings.append(UnitReading(uuid, 0, None, None))
                    continue
                memory = sum(p.used for p in sample.processes if facts.owner.get(p.pid) == job_id)
                readings.append(UnitReading(uuid, memory, sample.utilization, sample.energy_mj))
                self.shares.check(job_id, uuid, memory)
            self.telemetry.add(job_id, at, readings, self.holders.job_units)

    def _for_watch(
        self, samples: list[UnitUsage], facts: ProcessFacts, holders: dict[str, int]
    ) -> tuple[list[UnitUsage], ProcessFacts]:
        """What the unit watch sees: a shared GPU's share jobs count as one holder (the one
        `holders` names), and the agent's own MPS processes are nobody's concern."""
        sharers = self.holders.sharers()
        owner = dict(facts.owner)
        watched: list[UnitUsage] = []
        for sample in samples:
            jobs = sharers.get(sample.uuid, set())
            holder = holders.get(sample.uuid)
            kept = []
            for process in sample.processes:
                found = owner.get(process.pid)
                if found is None and self.mps is not None and self.mps.is_ours(process.pid):
                    continue  # an MPS daemon or server this agent started
                if holder is not None and found in jobs:
                    owner[process.pid] = holder  # a neighbour share job's process
                kept.append(process)
            if len(kept) != len(sample.processes):
                sample = dataclasses.replace(sample, processes=tuple(kept))
            watched.append(sample)
        return watched, dataclasses.replace(facts, owner=owner)

    def _facts(self, samples: list[UnitUsage]) -> ProcessFacts:
        pids = {process.pid for sample in samples for process in sample.processes}
        supervisors = self.jobs.supervisor_pids() if pids else {}
        owner = {pid: self.job_of(pid, supervisors) for pid in pids}
        alive = {pid: pid_alive(pid) for pid in pids}
        names = {pid: process_name(pid) for pid in pids}
        foreign = [pid for pid, job in owner.items() if job is None]
        containers = {pid: found for pid in foreign if (found := self.job_of.container(pid))}
        return ProcessFacts(owner, alive, names, containers)

    def _proto(self, sample: UnitUsage, facts: ProcessFacts) -> pb.GpuUsage:
        verdict = self.verdicts.get(sample.uuid, UnitVerdict(HEALTH_OK))
        jobs = {facts.owner.get(p.pid) for p in sample.processes}
        message = pb.GpuUsage(
            uuid=sample.uuid,
            memory_used=sample.memory_used,
            job_ids=sorted(job for job in jobs if job is not None),
            health=verdict.health,
            health_reason=verdict.reason,
            notes=list(verdict.notes[:MAX_NOTES]),
        )
        if sample.utilization is not None:
            message.utilization = sample.utilization
        return message
