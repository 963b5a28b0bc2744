"""The agent's GPU duties: health in every heartbeat, XID events, inventory rescans, a clean
hand-over of units between jobs, and each job's device rules and CPUs.

The backend never raises for NVML trouble (a unit it cannot read is unhealthy, with the
reason); this class adds what only the agent knows: which job holds which unit, which job a
process belongs to (by cgroup, gpuq.agent.jobs.attribution), and what to do about it
(gpu.handover_watch decides; this class does the reads and the kills).

Each read of the units also feeds every running job's telemetry (gpuq.agent.gpu.job_gpu_telemetry): a
sampler reads them every [agent] sample_interval while jobs run, and a heartbeat reuses a read
that recent instead of reading NVML again (one that must be current, such as the one sent
with a job's end, reads anew). Heartbeats carry each job's latest sample (job_samples), end
reports its telemetry (end_telemetry). An agent that restarts starts its jobs' telemetry
anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import stat
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

from gpuq.agent.gpu.backend import HEALTH_OK, GpuBackend, GpuEvent, GpuInventory, UnitUsage
from gpuq.agent.gpu.handover_watch import ProcessFacts, UnitVerdict, UnitWatch
from gpuq.agent.gpu.job_gpu_telemetry import JobTelemetry, UnitReading
from gpuq.agent.jobs.attribution import JobOfProcess, pid_alive, process_name
from gpuq.agent.jobs.isolation import DeviceNumber, choose_cpus, device_numbers, parse_cpulist
from gpuq.agent.jobs.mps_daemons import MpsDaemons, shared_units
from gpuq.agent.jobs.supervisors import SupervisorHub
from gpuq.config import AgentSettings
from gpuq.domain.units import format_size
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

log = logging.getLogger(__name__)
EVENT_WAIT = 0.2  # seconds one NVML event wait blocks (a stopping agent waits that long)
RESCAN_CHECK = 1.0  # seconds between two looks at whether the inventory must be read again
XID_GRACE = 10.0  # seconds a job on a failed GPU gets between SIGTERM and SIGKILL
MAX_NOTES = 8  # notes kept per unit and per job
XID_LOG_EVERY = 60.0  # seconds between two log lines for the same XID on the same unit
SHARE_GRACE = 10.0  # seconds a share job over its VRAM gets between SIGTERM and SIGKILL

StopJob = Callable[[int, str, str, float], Awaitable[object]]


class GpuCare:
    def __init__(
        self,
        backend: GpuBackend,
        settings: AgentSettings,
        hub: SupervisorHub,
        *,
        beat_now: Callable[[], None],
        units_changed: Callable[[], None],
        stop_job: StopJob,
    ) -> None:
        self.backend = backend
        self.settings = settings
        self.hub = hub
        self._beat_now = beat_now
        self._units_changed = units_changed
        self._stop_job = stop_job
        self.watch = UnitWatch(
            settings.handover_timeout, kill_foreign=settings.foreign_processes == "kill"
        )
        self.job_of = JobOfProcess(settings.cgroup_parent)
        self.job_units: dict[int, tuple[str, ...]] = {}  # running job -> the units it holds
        self.job_cpus: dict[int, tuple[int, ...]] = {}  # running job -> the CPUs it is bound to
        self.job_notes: dict[int, list[str]] = {}  # application XIDs, for the job's end reason
        self.verdicts: dict[str, UnitVerdict] = {}
        self._xid_logged: dict[tuple[str, int], float] = {}  # (unit, XID) -> when last logged
        self._closing = False
        # one read of the units at a time (the heartbeat's and the sampler's threads)
        self._read_lock = threading.Lock()
        self.last_read = -float("inf")  # monotonic time of the last read
        self._last_figures: list[pb.GpuUsage] = []
        # telemetry, shared between the reading thread and the event loop
        self._telemetry_lock = threading.Lock()
        self.telemetry: dict[int, JobTelemetry] = {}  # running job -> its figures so far
        self._output_bytes: dict[int, int] = {}  # running job -> its output's size, last read
        # ended jobs, until the coordinator has their ends: their telemetry (None: no sample)
        self._ended: dict[int, pb.GpuTelemetry | None] = {}
        self._outputs: dict[int, tuple[str, ...]] = {}  # job -> its stdout/stderr paths
        # MPS share jobs: their VRAM limit in bytes (measured use above it ends the job
        # out_of_memory; its neighbours on the GPU keep running), and those already stopped
        self.share_limits: dict[int, int] = {}
        self._over_share: set[int] = set()
        self._stops: set[asyncio.Task[object]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shared_warned: set[str] = set()  # [agent] shared_gpus entries that name no GPU
        # the agent's MPS daemons (set by the agent): their processes are never foreign
        self.mps: MpsDaemons | None = None
        # share jobs stopped over their VRAM: (state, reason) their end report gets (a
        # supervisor's stop ends a job "cancelled" with the reason given)
        self._end_as: dict[int, tuple[str, str]] = {}
        self._set_inventory(backend.inventory())

    # ---- the inventory ---------------------------------------------------------------------

    def _set_inventory(self, inventory: GpuInventory) -> None:
        # the GPUs the admin shares (MPS) are registered as such; a MIG slice never is
        shared, unknown = shared_units(inventory.units, self.settings.shared_gpus)
        for entry in unknown:
            if entry not in self._shared_warned:
                self._shared_warned.add(entry)
                log.warning(
                    "[agent] shared_gpus names %r, which is no whole GPU of this node", entry
                )
        if shared:
            units = tuple(
                dataclasses.replace(u, shared=True) if u.uuid in shared else u
                for u in inventory.units
            )
            inventory = dataclasses.replace(inventory, units=units)
        self.inventory = inventory
        self.units = {unit.uuid: unit for unit in inventory.units}
        self.device_numbers: dict[str, tuple[DeviceNumber, ...]] = {
            uuid: device_numbers(paths) for uuid, paths in inventory.devices.items()
        }

    def isolation(self) -> str:
        """How this node keeps a job off the GPUs it was not given (Register.isolation)."""
        if not self.units:
            return ""
        if os.geteuid() != 0:
            return "advisory: the agent does not run as root, so it cannot make device rules"
        missing = [u.index for u in self.units.values() if not self.device_numbers.get(u.uuid)]
        if missing:
            return f"advisory: no device nodes found for GPU {', '.join(map(str, missing))}"
        return device_cgroup_kind(Path("/proc/self/mounts").read_text(errors="replace"))

    # ---- launches and ends -----------------------------------------------------------------

    def place(self, job_id: int, gpus: tuple[str, ...], cpus: int) -> tuple[int, ...]:
        """Note the units a job is given; the CPUs to bind it to (free ones near its GPUs
        first; none when it asks for every CPU of the node)."""
        near = sorted({cpu for uuid in gpus for cpu in self.inventory.local_cpus.get(uuid, ())})
        online = sorted(os.sched_getaffinity(0))
        load = Counter(cpu for held in self.job_cpus.values() for cpu in held)
        chosen = choose_cpus(cpus, online, set(load), near, load) if cpus < len(online) else ()
        self.job_units[job_id] = gpus
        self.job_cpus[job_id] = tuple(chosen)
        return tuple(chosen)

    def launch_failed(self, job_id: int) -> None:
        self.job_units.pop(job_id, None)
        self.job_cpus.pop(job_id, None)
        self.share_limits.pop(job_id, None)

    def set_share(self, job_id: int, mem_limit: int) -> None:
        """The job is an MPS share with this VRAM limit (bytes), enforced by measure."""
        self.share_limits[job_id] = mem_limit

    def job_ended(self, job_id: int) -> bool:
        """Note that the job's processes are gone; True when it held units, which are then
        checked (the next heartbeat, sent with the end report, says whether they are clean)."""
        units = self.holders_of(job_id)
        self.job_units.pop(job_id, None)
        self.job_cpus.pop(job_id, None)
        self.share_limits.pop(job_id, None)
        self._over_share.discard(job_id)
        if units:
            self.watch.job_ended(job_id, units)
        return bool(units)

    def end_notes(self, job_id: int) -> str:
        """What to add to the job's end reason: the application XIDs it caused."""
        return "; ".join(self.job_notes.pop(job_id, []))

    def holders_of(self, job_id: int) -> tuple[str, ...]:
        if job_id not in self.job_units:
            self._adopt(job_id)
        return self.job_units.get(job_id, ())

    def _adopt(self, job_id: int) -> None:
        """A job started before this agent did: its units and CPUs from its launch spec."""
        spec = self.hub.launch_spec_of(job_id)
        if spec is None:  # its folder is gone or unreadable: no units known (not read again)
            self.job_units[job_id] = ()
            self.job_cpus[job_id] = ()
            return
        self.job_units[job_id] = tuple(str(u) for u in spec.extra.get("gpus", ()))
        if isinstance(limit := spec.extra.get("share_mem"), int) and limit > 0:
            self.share_limits[job_id] = limit
        cpuset = getattr(spec, "cpuset", None)
        self.job_cpus[job_id] = tuple(parse_cpulist(cpuset)) if cpuset else ()

    def holders(self) -> dict[str, int]:
        """unit uuid -> the running job holding it."""
        held: dict[str, int] = {}
        for job_id in self.hub.running_jobs():
            for uuid in self.holders_of(job_id):
                held[uuid] = job_id
        return held

    # ---- the heartbeat's figures -----------------------------------------------------------

    def usage(self, max_age: float = 0.0) -> list[pb.GpuUsage]:
        """Every unit's figures and health; blocking (NVML, /proc): run it in a thread.

        max_age: the figures of a read at most that many seconds old do (0: read now). A read
        feeds the running jobs' telemetry."""
        with self._read_lock:
            if max_age > 0 and time.monotonic() - self.last_read < max_age:
                return list(self._last_figures)
            figures = self._read()
            self._last_figures = figures
            self.last_read = time.monotonic()
            return list(figures)

    def _read(self) -> list[pb.GpuUsage]:
        samples = self.backend.usage()
        at = time.time()
        holders = self.holders()
        facts = self._facts(samples)
        self._record(samples, facts, at)
        watched, watch_facts = self._for_watch(samples, facts, holders)
        assessment = self.watch.assess(watched, holders, watch_facts)
        for finding in assessment.flagged:
            log.warning("foreign process on a GPU: %s", finding)
        for pid in assessment.kill:
            log.warning("killing pid %d (%s) on a GPU", pid, facts.name.get(pid, "?"))
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self.verdicts = assessment.verdicts
        return [self._proto(sample, facts) for sample in samples]

    def _for_watch(
        self, samples: list[UnitUsage], facts: ProcessFacts, holders: dict[str, int]
    ) -> tuple[list[UnitUsage], ProcessFacts]:
        """What the unit watch sees: a shared GPU's share jobs count as one holder (the one
        `holders` names), and the agent's own MPS processes are nobody's concern."""
        sharers: dict[str, set[int]] = {}
        for job_id in self.share_limits:
            for uuid in self.job_units.get(job_id, ()):
                sharers.setdefault(uuid, set()).add(job_id)
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

    # ---- telemetry -------------------------------------------------------------------------

    def _record(self, samples: list[UnitUsage], facts: ProcessFacts, at: float) -> None:
        """Feed one read to each running job holding units: its processes' bytes per unit
        (by cgroup), the units' utilisation and energy counters; and its output's size."""
        by_uuid = {sample.uuid: sample for sample in samples}
        for job_id in self.hub.running_jobs():
            units = self.holders_of(job_id)
            if not units or job_id in self._ended:
                continue
            readings = []
            for uuid in units:
                sample = by_uuid.get(uuid)
                if sample is None:  # the unit is gone (the GPUs changed): nothing known
                    readings.append(UnitReading(uuid, 0, None, None))
                    continue
                memory = sum(p.used for p in sample.processes if facts.owner.get(p.pid) == job_id)
                readings.append(UnitReading(uuid, memory, sample.utilization, sample.energy_mj))
                self._check_share(job_id, uuid, memory)
            output = self._output_size(job_id)
            with self._telemetry_lock:
                if job_id in self._ended or job_id not in self.job_units:
                    continue  # it ended while this read was made
                figures = self.telemetry.get(job_id)
                if figures is None:
                    figures = self.telemetry[job_id] = JobTelemetry(job_id)
                figures.add(at, readings)
                self._output_bytes[job_id] = output

    def _check_share(self, job_id: int, uuid: str, memory: int) -> None:
        """A share job over its VRAM limit (measured, exactly) ends out_of_memory."""
        limit = self.share_limits.get(job_id)
        if limit is None or memory <= limit or job_id in self._over_share:
            return
        self._over_share.add(job_id)
        unit = self.units.get(uuid)
        where = f"GPU {unit.index}" if unit is not None else uuid
        reason = (
            f"used {format_size(memory)} of its {format_size(limit)} GPU share (MPS) on {where}"
        )
        log.warning("job %d %s: ending it", job_id, reason)
        loop = self._loop
        if loop is None:
            return
        loop.call_soon_threadsafe(self._start_stop, job_id, reason)

    def release_share(self, job_id: int) -> None:
        """The job ended or never started: the last share job on a GPU stops its daemon."""
        if self.mps is not None:
            self.mps.release(job_id)

    def end_state(self, job_id: int, end_state: str, reason: str) -> str:
        """The state a job's end report says: out_of_memory for a share this agent stopped
        over its VRAM (when that stop decided the end), else `end_state`."""
        decided = self._end_as.pop(job_id, None)
        if decided is not None and end_state == "cancelled" and reason.startswith(decided[1]):
            return decided[0]
        return end_state

    def _start_stop(self, job_id: int, reason: str) -> None:
        self._end_as[job_id] = ("out_of_memory", reason)
        task: asyncio.Task[object] = asyncio.ensure_future(
            self._stop_job(job_id, "out_of_memory", reason, SHARE_GRACE)
        )
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    def _output_size(self, job_id: int) -> int:
        """Bytes in the job's stdout/stderr files (lstat: a symlink a job put there is not
        followed, and counts 0, as does a missing file)."""
        paths = self._outputs.get(job_id)
        if paths is None:
            spec = self.hub.launch_spec_of(job_id)
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
        with self._telemetry_lock:
            found = [
                figures.sample(self._output_bytes.get(job_id, 0))
                for job_id, figures in sorted(self.telemetry.items())
            ]
        return [sample for sample in found if sample is not None]

    def end_telemetry(self, job_id: int) -> pb.GpuTelemetry | None:
        """The job ended: its telemetry (None: no sample of it), kept for its end report
        until forget(); it gets no more samples."""
        with self._telemetry_lock:
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
        with self._telemetry_lock:
            return self._ended.get(job_id)

    def forget(self, job_id: int) -> None:
        """The coordinator recorded the job's end: a later start of it is measured anew."""
        with self._telemetry_lock:
            self._ended.pop(job_id, None)
            self.telemetry.pop(job_id, None)
            self._output_bytes.pop(job_id, None)
        self._outputs.pop(job_id, None)

    async def _sampling(self) -> None:
        """Read the units every sample_interval while jobs run (a heartbeat's read counts)."""
        interval = self.settings.sample_interval
        while not self._closing:
            wait = self.last_read + interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            if not self.units or not self.hub.running_jobs():
                await asyncio.sleep(interval)
                continue
            try:
                await asyncio.to_thread(self.usage, interval / 2)
            except Exception:  # the backend promises not to raise; a bug must not end this
                log.exception("sampling the GPUs failed")
                await asyncio.sleep(interval)

    def _facts(self, samples: list[UnitUsage]) -> ProcessFacts:
        pids = {process.pid for sample in samples for process in sample.processes}
        supervisors = self.hub.supervisor_pids() if pids else {}
        owner = {pid: self.job_of(pid, supervisors) for pid in pids}
        alive = {pid: pid_alive(pid) for pid in pids}
        names = {pid: process_name(pid) for pid in pids}
        return ProcessFacts(owner, alive, names)

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

    # ---- events and rescans ----------------------------------------------------------------

    async def run(self) -> None:
        """The event thread and the rescan timer, until cancelled."""
        self._loop = asyncio.get_running_loop()
        tasks = [
            asyncio.create_task(self._events(), name="gpu-events"),
            asyncio.create_task(self._rescans(), name="gpu-rescans"),
            asyncio.create_task(self._sampling(), name="gpu-samples"),
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            self._closing = True
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _events(self) -> None:
        if not self.units:
            return
        while not self._closing:
            try:
                events = await asyncio.to_thread(self.backend.wait_events, EVENT_WAIT)
            except Exception:  # the backend promises not to raise; a bug must not end this
                log.exception("reading GPU events failed")
                await asyncio.sleep(EVENT_WAIT)
                continue
            for event in events:
                await self._on_event(event)

    async def _on_event(self, event: GpuEvent) -> None:
        unit = self.units.get(event.uuid)
        where = f"GPU {unit.index}" if unit is not None else event.uuid
        if unit is not None and unit.mig_profile:
            where += f" (MIG {unit.mig_profile})"
        holder = self.holders().get(event.uuid)
        # a faulting program can raise an XID storm: each (unit, XID) is logged once a minute
        now = time.monotonic()
        key = (event.uuid, event.xid)
        loud = now - self._xid_logged.get(key, -XID_LOG_EVERY) >= XID_LOG_EVERY
        if loud:
            self._xid_logged[key] = now
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
            await self._stop_job(holder, "node_fail", reason, XID_GRACE)

    async def _rescans(self) -> None:
        next_scan = time.monotonic() + self.settings.gpu_rescan
        while not self._closing:
            await asyncio.sleep(RESCAN_CHECK)
            due = time.monotonic() >= next_scan or getattr(self.backend, "needs_refresh", False)
            if not due:
                continue
            next_scan = time.monotonic() + self.settings.gpu_rescan
            try:
                changed = await asyncio.to_thread(self.backend.refresh)
            except Exception:
                log.exception("reading the GPU inventory again failed")
                continue
            if changed:
                self._set_inventory(self.backend.inventory())
                log.warning(
                    "the GPUs changed (%d units now); registering them again",
                    len(self.inventory.units),
                )
                self._units_changed()


def device_cgroup_kind(mounts: str, prefer: str | None = None) -> str:
    """How the supervisor will enforce device rules on this machine, chosen as it chooses
    (gpuq/agent/native/proc.c): the v1 devices controller, else a v2 device program; on a
    machine with both, GPUQ_DEVICE_CGROUP=v2 picks the program."""
    prefer = os.environ.get("GPUQ_DEVICE_CGROUP") if prefer is None else prefer
    v1 = v2 = False
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        if fields[2] == "cgroup2":
            v2 = True
        elif fields[2] == "cgroup" and "devices" in fields[3].split(","):
            v1 = True
    if v1 and not (v2 and prefer == "v2"):
        return "devices cgroup v1"
    if v2:
        return "cgroup v2 device program"
    return "advisory: no devices cgroup on this machine (neither v1 devices nor cgroup2)"
