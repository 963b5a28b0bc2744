"""The agent's GPU duties, in one place: this node's units and the loops that watch them.

It holds the inventory as the agent registers it (with the GPUs the admin shares through MPS
marked, and each unit's device nodes for a job's device rules), and runs three loops while the
agent runs: NVML's critical events (gpu.xid_events), inventory rescans (a MIG change or a
reset GPU makes the agent register again), and a sampler that reads the units every [agent]
sample_interval while jobs run, so that their telemetry is measured between heartbeats
(gpu.unit_reads; a heartbeat reuses a read that recent). Its parts:

- holders (gpu.unit_holders): which running job holds which unit and CPUs;
- reads (gpu.unit_reads): the heartbeat's figures and health, and the hand-over of units;
- telemetry (gpu.telemetry_book): each job's GPU telemetry until the coordinator has it;
- shares (gpu.share_guard): MPS share jobs held to their VRAM limit;
- xids (gpu.xid_events): what an XID means for the job holding the unit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable

from gpuq.agent.gpu.backend import GpuBackend, GpuEvent, GpuInventory
from gpuq.agent.gpu.handover_watch import UnitWatch
from gpuq.agent.gpu.share_guard import ShareGuard
from gpuq.agent.gpu.telemetry_book import TelemetryBook
from gpuq.agent.gpu.unit_holders import RunningJobs, StopJob, UnitHolders
from gpuq.agent.gpu.unit_reads import UnitReader
from gpuq.agent.gpu.xid_events import XidEvents
from gpuq.agent.jobs.attribution import JobOfProcess
from gpuq.agent.jobs.isolation import (
    DeviceLoads,
    DeviceNumber,
    MountTable,
    device_cgroup_kind,
    device_numbers,
)
from gpuq.agent.jobs.mps_daemons import MpsDaemons
from gpuq.agent.jobs.mps_share import shared_units
from gpuq.config.settings import AgentSettings

log = logging.getLogger(__name__)
# seconds one NVML event wait blocks (one slice, gpu.nvml_events.WAIT_SLICE): the event thread
# wakes this often on an idle node, and a stopping agent waits at most this long for it
EVENT_WAIT = 1.0


# the same mounts text (MountTable hands out one string until the mounts change) has one kind
_device_kind = functools.lru_cache(maxsize=1)(device_cgroup_kind)


class NodeGpus:
    """`jobs`: the node's supervisors; `stop_job` ends a job whose GPU failed or a share job
    over its VRAM; `beat_now` sends a heartbeat at once (a unit's health changed);
    `units_changed` registers the units again; `mps`: the agent's MPS daemons, whose processes
    are never foreign."""

    def __init__(
        self,
        backend: GpuBackend,
        settings: AgentSettings,
        jobs: RunningJobs,
        *,
        beat_now: Callable[[], None],
        units_changed: Callable[[], None],
        stop_job: StopJob,
        mps: MpsDaemons | None = None,
        cgroup_problem: Callable[[], str] = lambda: "",
    ) -> None:
        self.backend = backend
        self.settings = settings
        self.jobs = jobs
        self._units_changed = units_changed
        watch = UnitWatch(
            settings.handover_timeout, kill_foreign=settings.foreign_processes == "kill"
        )
        self.holders = UnitHolders(jobs, watch)
        self.telemetry = TelemetryBook(jobs)
        self.shares = ShareGuard(self.holders, stop_job, lambda: self.units)
        job_of = JobOfProcess(settings.cgroup_parent)
        self.reads = UnitReader(
            backend,
            jobs,
            self.holders,
            watch,
            job_of,
            self.telemetry,
            self.shares,
            mps,
            refresh_wanted=self._refresh_wanted,
        )
        self._rescan_due = asyncio.Event()  # read the inventory again now
        self._loop: asyncio.AbstractEventLoop | None = None  # the agent's, once run() runs
        self.xids = XidEvents(
            lambda: self.units, self.holders, beat_now=beat_now, stop_job=stop_job
        )
        self._closing = False
        # what jobs' device rules really did, and why job cgroups are not where they should be
        # (gpuq.agent.jobs.job_cgroups): both make the node's claim advisory, with the reason
        self.device_loads = DeviceLoads()
        self._cgroup_problem = cgroup_problem
        self._mounts = MountTable()
        self._shared_warned: set[str] = set()  # [agent] shared_gpus entries that name no GPU
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
        """How this node keeps a job off the GPUs it was not given (Register.isolation, and
        every heartbeat's: it changes when a job's device rules fail or apply again)."""
        if not self.units:
            return ""
        if os.geteuid() != 0:
            return "advisory: the agent does not run as root, so it cannot make device rules"
        missing = sorted(
            {u.index for u in self.units.values() if not self.device_numbers.get(u.uuid)}
        )
        if missing:
            return f"advisory: no device nodes found for GPU {', '.join(map(str, missing))}"
        claim = self.device_loads.claim(_device_kind(self._mounts.text()))
        problem = self._cgroup_problem()
        if problem and not claim.startswith("advisory"):
            # device programs still hold (they need no controller), so the claim stays; what
            # suffers is the memory and pids limits, which the node then says beside it
            return f"{claim}; warning: {problem}"
        return claim

    # ---- launches and ends -----------------------------------------------------------------

    def place(self, job_id: int, gpus: tuple[str, ...], cpus: int) -> tuple[int, ...]:
        """Note the units a job is given; the CPUs to bind it to (free ones near its GPUs
        first; none when it asks for every CPU of the node)."""
        online = sorted(os.sched_getaffinity(0))
        return self.holders.place(job_id, gpus, cpus, self.inventory.local_cpus, online)

    def job_ended(self, job_id: int) -> tuple[str, ...]:
        """Note that the job's processes are gone; the units it held, which are then checked
        (the next heartbeat, sent with the end report, says whether they are clean)."""
        self.shares.job_ended(job_id)
        return self.holders.job_ended(job_id)

    # ---- the loops -------------------------------------------------------------------------

    async def run(self) -> None:
        """The event thread, the rescan timer and the sampler, until cancelled."""
        self.shares.loop = self._loop = asyncio.get_running_loop()
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
        """Deliver NVML's critical events from a thread of their own that blocks in NVML's wait
        a whole slice at a time (EVENT_WAIT): an idle node wakes once a slice, not for every
        short wait handed to the default executor (which woke this loop and a pool thread five
        times a second)."""
        if not self.units:
            return
        loop = asyncio.get_running_loop()
        arrived: asyncio.Queue[list[GpuEvent]] = asyncio.Queue()
        stop = threading.Event()

        def deliver(events: list[GpuEvent]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the agent is stopping
                loop.call_soon_threadsafe(arrived.put_nowait, events)

        thread = threading.Thread(
            target=_wait_for_events, args=(self.backend, stop, deliver), name="gpu-events"
        )
        thread.daemon = True  # a wait in NVML never holds the process up
        thread.start()
        try:
            while True:
                for event in await arrived.get():
                    await self.xids.on_event(event)
        finally:
            stop.set()

    async def _rescans(self) -> None:
        """Read the inventory again every gpu_rescan, and at once when a read of the units
        met errors that a refresh may cure (`_refresh_wanted`): an idle node's loop wakes for
        neither in between (a look every second was half its wakeups)."""
        loop = asyncio.get_running_loop()
        if getattr(self.backend, "needs_refresh", False):  # a read before the loop ran
            self._rescan_due.set()
        while not self._closing:
            timer = loop.call_later(self.settings.gpu_rescan, self._rescan_due.set)
            try:
                await self._rescan_due.wait()
            finally:
                timer.cancel()
            self._rescan_due.clear()
            try:
                changed = await asyncio.to_thread(self.backend.refresh)
            except Exception:
                log.exception("reading the GPU inventory again failed")
                continue
            inventory = self.backend.inventory()
            if changed or inventory.devices != self.inventory.devices:
                # new units, or device nodes that appeared (a MIG slice's caps nodes after a
                # fresh layout): the node's isolation and device rules change with them
                self._set_inventory(inventory)
                log.warning(
                    "the GPUs or their device nodes changed (%d units now); registering again",
                    len(self.inventory.units),
                )
                self._units_changed()

    def _refresh_wanted(self) -> None:
        """A read of the units (on a worker thread) left the backend wanting a refresh (stale
        handles after a MIG change, a reset GPU, the library gone): rescan now. A refresh that
        failed is tried again at the next read that still wants one."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the agent is stopping
                loop.call_soon_threadsafe(self._rescan_due.set)

    async def _sampling(self) -> None:
        """Read the units every sample_interval while jobs run (a heartbeat's read counts)."""
        interval = self.settings.sample_interval
        while not self._closing:
            wait = self.reads.last_read + interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            if not self.units or not self.jobs.running_jobs():
                await asyncio.sleep(interval)
                continue
            try:
                await asyncio.to_thread(self.reads.usage, interval / 2)
            except Exception:  # the backend promises not to raise; a bug must not end this
                log.exception("sampling the GPUs failed")
                await asyncio.sleep(interval)


def _wait_for_events(
    backend: GpuBackend, stop: threading.Event, deliver: Callable[[list[GpuEvent]], None]
) -> None:
    """The event thread: wait for critical events until `stop`, handing each batch over."""
    while not stop.is_set():
        try:
            events = backend.wait_events(EVENT_WAIT)
        except Exception:  # the backend promises not to raise; a bug must not end this
            log.exception("reading GPU events failed")
            stop.wait(EVENT_WAIT)
            continue
        if events and not stop.is_set():
            deliver(events)
