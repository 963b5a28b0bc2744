"""The GPU backend: NVML through nvidia-ml-py (`pynvml`), or through an injected fake library.

pynvml is imported when a backend is made, never at module import, so the agent (and the
coordinator, and tests) import gpuq.agent.gpu on machines without a driver. The fake GPUs
(fake.gpu_backend) are this backend over a FakeNvmlLibrary: one code path for both.

Nothing here raises for NVML trouble (DESIGN.md: NVML errors are per unit and per call):

- Every call is guarded (nvml_calls). A unit whose calls fail reports health "unhealthy" with
  the call and error; optional features (MIG, NVLink, utilisation, ECC, fabric) tolerate
  NotSupported. Process queries and the memory query fall back to older versions the driver has.
- Library-level errors (Uninitialized, LibraryNotFound, DriverNotLoaded, RM version mismatch,
  or every unit failing at once) make refresh() shut NVML down and initialise it again, at most
  every reinit_interval seconds, and read the inventory anew.
- Handles go stale when MIG is reconfigured or a GPU is reset: usage() errors set needs_refresh;
  the agent calls refresh() then (and on a timer). refresh() returns True when the set of units
  (uuid, memory, profile) changed. A GPU that cannot be read keeps its units, unhealthy.
- Health polling in usage() (every health_every calls): volatile uncorrected ECC, remapped rows
  pending or failed, NVSwitch fabric registration failed, and an NVSwitch fabric still not
  started or in progress fabric_grace seconds after the backend first saw it so (no fabric
  manager); a fabric that completes later makes the GPU ok again at the next poll.
- wait_events() (nvml_events) delivers XIDs; a hardware XID makes its units unhealthy until NVML
  is re-initialised or refresh() sees the unit come back after it was unreadable (a reset GPU).
  An XID on a GPU that was never unreadable stays until the agent restarts, by design: it was
  serviced only if someone reset it, and that shows as a lost-and-back GPU.

Minimum driver: MIN_DRIVER (R450.80.02, the first with production MIG, GPU/compute instance ids
in process records and nvmlEventSetWait_v2). Newer calls are used when present: memory v2 and
_v3 process queries (R510+), fabric info (R530+, NVSwitch systems); older drivers fall back.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import math
import threading
import time
from collections.abc import Collection, Iterable
from typing import Any

from gpuq.agent.gpu.backend import (
    HEALTH_OK,
    HEALTH_UNHEALTHY,
    GpuEvent,
    GpuInventory,
    GpuProcess,
    UnitUsage,
    unit_topology,
)
from gpuq.agent.gpu.device_paths import DevicePaths
from gpuq.agent.gpu.nvml_calls import CallError, MemoryQuery, NvmlCalls, process_fallbacks
from gpuq.agent.gpu.nvml_events import EventWatcher, handle_key
from gpuq.agent.gpu.nvml_health import (
    FABRIC_NOT_SUPPORTED,
    ecc_reason,
    fabric_reason,
    fabric_waiting,
    remap_reason,
)
from gpuq.agent.gpu.nvml_inventory import (
    InventoryRead,
    UnitSlot,
    normalize_bus_id,
    read_inventory,
    text,
)

__all__ = ["MIN_DRIVER", "NvmlGpuBackend", "normalize_bus_id"]

log = logging.getLogger(__name__)

MIN_DRIVER = "450.80.02"
CPU_ONLY = "this node offers no GPUs and runs CPU jobs only"
# seconds an NVSwitch fabric may stay "not started" or "in progress" before its GPUs are
# unhealthy ([agent] fabric_grace); nvidia-fabricmanager registers a box within a minute of boot
DEFAULT_FABRIC_GRACE = 120.0
_NO_DRIVER_ERRORS = ("LibraryNotFound", "DriverNotLoaded", "Missing")


class NvmlGpuBackend:
    """A GpuBackend over NVML (pynvml, or `library`: any object with pynvml's names)."""

    def __init__(
        self,
        library: Any = None,
        *,
        health_every: int = 10,
        reinit_interval: float = 30.0,
        paths: DevicePaths | None = None,
        fabric_grace: float = DEFAULT_FABRIC_GRACE,
    ) -> None:
        """Start NVML and read the inventory; never raises (see inventory().problem).

        health_every: usage() calls between two health polls (1: every call).
        reinit_interval: seconds between two attempts to re-initialise NVML.
        paths: where device nodes, MIG minors and PCI sysfs are (default: the library's
        gpuq_device_paths, else the real /dev, /proc and /sys).
        fabric_grace: seconds an NVSwitch fabric may wait for its fabric manager (see
        nvml_health.fabric_reason).
        """
        self._lock = threading.RLock()  # every field below; never held while waiting on NVML
        self.health_every = max(1, health_every)
        self.reinit_interval = reinit_interval
        self.fabric_grace = fabric_grace
        self._fabric_since: dict[
            str, float
        ] = {}  # GPU uuid -> when its fabric was first seen waiting
        self._import_problem = ""
        if library is None:
            try:
                library = importlib.import_module("pynvml")
            except ImportError as missing:  # nvidia-ml-py not installed
                self._import_problem = f"nvidia-ml-py (pynvml) is not installed: {missing}"
        self._nvml = library
        self._fake = bool(getattr(library, "gpuq_fake", False))
        self._paths = paths or getattr(library, "gpuq_device_paths", None) or DevicePaths()
        self._calls = NvmlCalls(library)
        self._memory = MemoryQuery()
        self._processes = process_fallbacks()
        self._open = False
        self._closed = False
        self._problem = ""
        self._driver = "unknown"
        self._slots: dict[str, UnitSlot] = {}
        self._gpu_handles: dict[str, Any] = {}  # physical GPU uuid -> handle
        self._distances: dict[tuple[str, str], int] = {}
        self._devices: dict[str, tuple[str, ...]] = {}
        self._local_cpus: dict[str, tuple[int, ...]] = {}
        self._inventory = GpuInventory((), (), self._fake, "unknown")
        self._sticky: dict[str, str] = {}  # unit uuid -> hardware XID text
        self._polled: dict[str, str] = {}  # GPU uuid -> ECC / row remap / fabric reason
        self._missing: dict[str, str] = {}  # unit uuid -> why it has no handle now
        self._needs_refresh = False
        self._reinit_wanted = False
        self._usage_calls = 0
        self._last_init = -math.inf
        self.generation = 0  # bumped whenever handles change (the event set follows it)
        self._events = EventWatcher(self)
        with self._lock:
            self._init()
            self._read()

    # --- the GpuBackend protocol -----------------------------------------------------------

    def inventory(self) -> GpuInventory:
        """The units as last read (at start and by refresh())."""
        with self._lock:
            return self._inventory

    @property
    def needs_refresh(self) -> bool:
        """usage() met errors that a refresh() may cure (stale handles, a reset, the library)."""
        return self._needs_refresh

    def refresh(self) -> bool:
        """Re-initialise NVML if it is down (rate-limited), read the inventory again; True when
        the set of units (uuid, memory, MIG profile) changed."""
        with self._lock:
            if self._closed:
                return False
            before = _unit_keys(self._inventory)
            if not self._open or self._reinit_wanted:
                self._reinit()
            self._read()
            self._needs_refresh = False
            return _unit_keys(self._inventory) != before

    def usage(
        self, telemetry: Collection[str] | None = None, only: Collection[str] | None = None
    ) -> list[UnitUsage]:
        """Memory, processes and health of each unit (`only`: of those units, the ones a job's
        end left to check), and the telemetry counters (utilisation, energy) of those in
        `telemetry` (None: every unit); never raises. Health is polled every health_every reads
        of all units.

        A unit no job holds is read for its health only: its utilisation is read only while
        processes are on it (a foreign one, a job's leaving), else it is 0 (whole GPUs; a MIG
        slice's is unknown, as NVML has none); its energy is never read. An idle node makes a
        third fewer NVML calls per heartbeat."""
        with self._lock:
            slots = self._slots
            if only is not None:
                slots = {uuid: slot for uuid, slot in slots.items() if uuid in only}
            if not self._open:
                self._needs_refresh = bool(self._slots)
                return [self._failed_usage(uuid, self._problem) for uuid in slots]
            if only is None:
                if self._usage_calls % self.health_every == 0:
                    self._poll_health()
                self._usage_calls += 1
            results: list[UnitUsage] = []
            troubled = readable = 0
            for uuid, slot in slots.items():
                if slot.handle is None:
                    results.append(self._failed_usage(uuid, self._missing.get(uuid, "")))
                    continue
                readable += 1
                wanted = telemetry is None or uuid in telemetry
                usage, errors = self._unit_usage(slot, telemetry=wanted)
                results.append(usage)
                if errors:
                    self._needs_refresh = True
                    if all(e.library or e.name == "Unknown" for e in errors):
                        troubled += 1
            if only is None and readable and troubled == readable:
                self._reinit_wanted = True  # every unit failing alike: the library, not GPUs
            return results

    def wait_events(self, timeout: float) -> list[GpuEvent]:
        """Critical events (XIDs) within timeout seconds; [] on timeout. Safe on another thread."""
        return self._events.wait(timeout)

    def close(self) -> None:
        """Shut NVML down once; later calls do nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._events.close()
            if self._open:
                self._open = False
                try:
                    self._calls.call("nvmlShutdown")
                except CallError as failed:
                    log.debug("NVML shutdown: %s", failed.reason)

    # --- what the event watcher needs --------------------------------------------------------

    def event_targets(self) -> tuple[int, bool, Any, dict[str, Any]]:
        """(generation, NVML open, library calls, GPU uuid -> handle) for the event thread."""
        with self._lock:
            return (
                self.generation,
                self._open and not self._closed,
                self._calls,
                dict(self._gpu_handles),
            )

    def event_units(self, gpu_uuid: str, gi: int | None, ci: int | None) -> list[str]:
        """The units an event on gpu_uuid (narrowed to a GPU/compute instance) concerns."""
        with self._lock:
            units = [s for s in self._slots.values() if s.gpu_uuid == gpu_uuid]
            if gi is not None:
                narrowed = [s for s in units if s.gi == gi and (ci is None or s.ci == ci)]
                units = narrowed or units
            return [s.unit.uuid for s in units]

    def mark_unhealthy(self, units: Iterable[str], reason: str) -> None:
        """A hardware XID: sticky until NVML re-initialises or the unit comes back (a reset)."""
        with self._lock:
            for uuid in units:
                if uuid in self._slots:
                    self._sticky[uuid] = reason

    def fabric_states(self) -> dict[str, tuple[int, str]]:
        """GPU uuid -> (NVML fabric state, the error registration completed with, or "") for
        the GPUs that report one (NVSwitch systems), read now: what `gpuq admin doctor` shows."""
        with self._lock:
            found: dict[str, tuple[int, str]] = {}
            for gpu_uuid, handle in self._gpu_handles.items():
                try:
                    info = self._fabric_info(handle)
                except CallError as failed:
                    log.debug("fabric state of %s: %s", gpu_uuid, failed.reason)
                    continue
                if info is not None and info[0] != FABRIC_NOT_SUPPORTED:
                    found[gpu_uuid] = (info[0], info[2])
            return found

    def nvml_version(self) -> str:
        """NVML's own version (nvmlSystemGetNVMLVersion), "unknown" where it cannot be read."""
        with self._lock:
            try:
                return (
                    text(self._calls.call("nvmlSystemGetNVMLVersion")) if self._open else "unknown"
                )
            except CallError:
                return "unknown"

    def set_compute_mode(self, uuid: str, mode: int) -> None:
        """nvmlDeviceSetComputeMode on whole GPU uuid (0 DEFAULT, 3 EXCLUSIVE_PROCESS: MPS);
        CallError when NVML refuses (not root: NoPermission), LookupError for an unknown GPU."""
        with self._lock:
            handle = self._gpu_handles.get(uuid)
            if handle is None or not self._open:
                raise LookupError(f"no open NVML handle for GPU {uuid}")
            self._calls.call("nvmlDeviceSetComputeMode", handle, mode)

    # --- internals ---------------------------------------------------------------------------

    def _init(self) -> None:
        """nvmlInit; on failure the backend has no NVML and says why in inventory().problem."""
        self._last_init = time.monotonic()
        if self._import_problem:
            self._problem = f"no NVIDIA driver: {self._import_problem}; {CPU_ONLY}"
            return
        try:
            self._calls.call("nvmlInit")
        except CallError as failed:
            self._open = False
            if failed.name in _NO_DRIVER_ERRORS or isinstance(failed.error, OSError):
                self._problem = f"no NVIDIA driver: {failed.reason}; {CPU_ONLY}"
            else:
                self._problem = f"NVML cannot start: {failed.reason}; {CPU_ONLY}"
            return
        self._open = True
        self.generation += 1  # a new NVML session: handles and event sets start anew
        self._problem = ""
        self._reinit_wanted = False
        self._sticky.clear()
        self._polled.clear()
        for fallback in self._processes.values():
            fallback.reset()
        self._memory.v2 = True
        try:
            self._driver = text(self._calls.call("nvmlSystemGetDriverVersion"))
        except CallError:
            self._driver = "unknown"
        if not self._fake and older_driver(self._driver, MIN_DRIVER):
            log.warning(
                "NVIDIA driver %s is older than %s: expect NotSupported", self._driver, MIN_DRIVER
            )

    def _reinit(self) -> None:
        """Shut NVML down and start it again, at most every reinit_interval seconds."""
        if time.monotonic() - self._last_init < self.reinit_interval:
            return
        self._events.reset()  # waits for the event thread to leave NVML
        if self._open:
            try:
                self._calls.call("nvmlShutdown")
            except CallError as failed:
                log.debug("NVML shutdown before re-init: %s", failed.reason)
            self._open = False
        self._init()
        log.info("NVML re-initialised: %s", self._problem or "ok")

    def _read(self) -> None:
        """Read the inventory; keep units of GPUs that cannot be read, unhealthy."""
        if not self._open:
            read, lost = InventoryRead(), self._problem
        else:
            try:
                read, lost = read_inventory(self._calls, self._paths), ""
            except CallError as failed:
                read, lost = InventoryRead(), f"cannot list GPUs: {failed.reason}"
                if failed.library:
                    self._reinit_wanted = True
        found = {slot.unit.uuid: slot for slot in read.slots}
        for uuid in found:
            if self._missing.pop(uuid, None) is not None:  # unreadable, now back: a reset GPU
                self._sticky.pop(uuid, None)
        read_gpus = {gpu.uuid for gpu in read.gpus}
        slots, devices, cpus = dict(found), dict(read.devices), dict(read.local_cpus)
        missing: dict[str, str] = {}
        for uuid, slot in self._slots.items():
            if uuid in found or slot.gpu_uuid in read_gpus:
                continue  # read, or a slice a MIG change removed
            missing[uuid] = lost or read.failed.get(slot.unit.index) or "GPU not listed by NVML"
            slots[uuid] = UnitSlot(slot.unit, None, slot.gpu_uuid, slot.gi, slot.ci, slot.share)
            if uuid in self._devices:
                devices[uuid] = self._devices[uuid]
            if uuid in self._local_cpus:
                cpus[uuid] = self._local_cpus[uuid]
        self._missing = missing
        self._slots = dict(sorted(slots.items(), key=lambda item: item[1].unit.index))
        handles = {gpu.uuid: gpu.handle for gpu in read.gpus}
        if _handle_keys(handles) != _handle_keys(self._gpu_handles):
            self.generation += 1  # the event set must register the new handles
        self._gpu_handles = handles
        self._distances = {**self._distances, **read.distances}
        self._devices, self._local_cpus = devices, cpus
        units = tuple(slot.unit for slot in self._slots.values())
        self._inventory = GpuInventory(
            units,
            unit_topology(units, self._distances),
            self._fake,
            self._driver,
            devices=dict(devices),
            local_cpus=dict(cpus),
            problem=self._problem if not units else "",
        )

    def _unit_usage(
        self, slot: UnitSlot, *, telemetry: bool = True
    ) -> tuple[UnitUsage, list[CallError]]:
        calls, handle, errors = self._calls, slot.handle, []
        used = 0
        try:
            used, _total = self._memory.used_and_total(calls, handle)
        except CallError as failed:
            errors.append(failed)
        utilization = self._utilization(handle, errors) if telemetry else None
        processes: list[GpuProcess] = []
        for kind, fallback in self._processes.items():
            try:
                running = fallback.call(calls, handle)
            except CallError as failed:
                # graphics and MPS lists are optional; without a compute list the agent could
                # not tell a dirty unit from a clean one, so that makes the unit unhealthy
                if kind == "compute" or not (failed.not_supported or failed.missing):
                    errors.append(failed)
                continue
            processes.extend(_processes(running, kind, slot))
        if not telemetry:
            if processes:  # a foreign process, a job's leaving: what it does is worth a read
                utilization = self._utilization(handle, errors)
            elif not slot.unit.parent_uuid:
                utilization = 0  # a whole GPU nothing runs on
        energy = self._energy(slot) if telemetry else None
        if slot.share > 1:
            used //= slot.share  # each compute instance reports its whole GPU instance
        reasons = [errors[0].reason] if errors else []
        reasons += [
            r for r in (self._sticky.get(slot.unit.uuid), self._polled.get(slot.gpu_uuid)) if r
        ]
        health = HEALTH_UNHEALTHY if reasons else HEALTH_OK
        unique = sorted(set(processes), key=lambda p: (p.pid, p.kind))
        return UnitUsage(
            slot.unit.uuid, used, utilization, tuple(unique), health, "; ".join(reasons), energy
        ), errors

    def _utilization(self, handle: Any, errors: list[CallError]) -> int | None:
        """The unit's utilisation in percent; None where it has no counter (a MIG slice)."""
        try:
            return int(self._calls.call("nvmlDeviceGetUtilizationRates", handle).gpu)
        except CallError as failed:  # MIG slices have no utilisation counter: unknown
            if not (failed.not_supported or failed.missing):
                errors.append(failed)
            return None

    def _energy(self, slot: UnitSlot) -> int | None:
        """The board's energy counter in millijoules since the driver loaded; None for a MIG
        slice (the counter is the whole board's) and on any error (never makes a unit
        unhealthy: boards before Volta lack it)."""
        if slot.unit.parent_uuid:
            return None
        try:
            value = self._calls.call("nvmlDeviceGetTotalEnergyConsumption", slot.handle)
            return int(value)
        except (CallError, TypeError, ValueError):
            return None

    def _failed_usage(self, uuid: str, reason: str) -> UnitUsage:
        reasons = [r for r in (reason or "not readable", self._sticky.get(uuid)) if r]
        return UnitUsage(uuid, 0, None, (), HEALTH_UNHEALTHY, "; ".join(reasons))

    def _poll_health(self) -> None:
        """ECC, row remapping and fabric state per physical GPU; NotSupported means fine.

        Each check is guarded on its own; a failing one is left to usage(), which reports the
        unit's errors (the same GPU fails its usage calls too when something is really wrong).
        """
        for gpu_uuid, handle in self._gpu_handles.items():
            reasons: list[str] = []
            for check in (self._ecc, self._remap, self._fabric):
                try:
                    reasons.append(check(handle, gpu_uuid))
                except CallError as failed:
                    log.debug("health poll of %s: %s", gpu_uuid, failed.reason)
            self._polled[gpu_uuid] = "; ".join(r for r in reasons if r)

    def _ecc(self, handle: Any, gpu_uuid: str) -> str:
        nvml = self._nvml
        uncorrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        volatile = getattr(nvml, "NVML_VOLATILE_ECC", 0)
        count = self._calls.optional(
            "nvmlDeviceGetTotalEccErrors", handle, uncorrected, volatile, default=0
        )
        return ecc_reason(int(count))

    def _remap(self, handle: Any, gpu_uuid: str) -> str:
        rows = self._calls.optional("nvmlDeviceGetRemappedRows", handle)
        return "" if rows is None else remap_reason(int(rows[2]), int(rows[3]))

    def _fabric(self, handle: Any, gpu_uuid: str) -> str:
        """The fabric's reason; counts how long a waiting fabric has waited, per GPU."""
        info = self._fabric_info(handle)
        if info is None:
            return ""
        state, status, name = info
        now = time.monotonic()
        if fabric_waiting(state):
            since = self._fabric_since.setdefault(gpu_uuid, now)
        else:
            self._fabric_since.pop(gpu_uuid, None)
            since = now
        return fabric_reason(state, status, name, now - since, self.fabric_grace)

    def _fabric_info(self, handle: Any) -> tuple[int, int, str] | None:
        """(state, status, status's error name or "") of nvmlDeviceGetGpuFabricInfo; None
        where the driver or GPU has no fabric info (pre-R530, no NVSwitch)."""
        nvml = self._nvml
        struct = getattr(nvml, "c_nvmlGpuFabricInfo_t", None)
        if struct is None:
            return None
        info = struct()
        if self._calls.optional("nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(info)) is None:
            return None
        status, name = int(info.status), ""
        if status:
            try:
                name = type(nvml.NVMLError(status)).__name__.removeprefix("NVMLError_")
            except Exception:  # an unknown code
                name = f"error {status}"
        return int(info.state), status, name


def _processes(running: Iterable[Any], kind: str, slot: UnitSlot) -> list[GpuProcess]:
    """GpuProcesses of one NVML list; for a shared GPU instance, only this compute instance's."""
    found = []
    for process in running:
        ci = getattr(process, "computeInstanceId", None)
        if slot.share > 1 and ci is not None and ci != 0xFFFFFFFF and int(ci) != slot.ci:
            continue
        # usedGpuMemory is None where the driver cannot tell (e.g. no permission): count 0.
        found.append(GpuProcess(int(process.pid), int(process.usedGpuMemory or 0), kind))  # type: ignore[arg-type]
    return found


def _handle_keys(handles: dict[str, Any]) -> dict[str, Any]:
    return {uuid: handle_key(handle) for uuid, handle in handles.items()}


def _unit_keys(inventory: GpuInventory) -> frozenset[tuple[str, int, str | None]]:
    return frozenset((u.uuid, u.memory, u.mig_profile) for u in inventory.units)


def older_driver(version: str, minimum: str) -> bool:
    """Whether driver version "535.104.05" is older than minimum; False when unreadable."""

    def parts(value: str) -> tuple[int, ...]:
        return tuple(int(p) for p in value.split(".") if p.isdigit())

    found = parts(version)
    return bool(found) and found < parts(minimum)
