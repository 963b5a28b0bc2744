"""FakeNvmlLibrary: the part of pynvml that gpuq calls, over fake GPUs and a state folder.

It stands in for the `pynvml` module (NvmlGpuBackend(library=...)): same function names and
signatures, pynvml's own constants and exception classes (NVMLError(code) maps to the subclass;
NVMLLibraryMismatchError), opaque handles, Uninitialized before nvmlInit, NotSupported where a
board lacks a feature, stale MIG handles after a layout change. Its GPUs and their state are a
FakeGpuBox's (fake.nvml_box); what it pretends is described with the spec's grammar
(fake.gpu_spec) and the state folder's files (fake.gpu_state).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from gpuq.agent.fake.gpu_spec import FakeGpuModel
from gpuq.agent.fake.nvml_box import NO_ID, FakeGpuBox, Handle, slices_of
from gpuq.agent.fake.nvml_files import (
    PROCESS_KINDS,
    Mismatch,
    error_class,
    fabric_state,
    fake_bus_id,
    read_int,
    read_text,
    read_utilization,
    socket_cpus,
)
from gpuq.agent.gpu.device_paths import affinity_words, online_cpus

FAKE_DRIVER_RESERVED = 0.005  # share of a GPU's memory the fake driver keeps (v1 counts it)
# seconds between two looks at the xid files (a real wait blocks in the driver, costing nothing;
# each look here stats every GPU's xid file: an idle fake node makes one look per wait slice)
_EVENT_POLL = 1.0
# the fake board's power: idle watts, plus watts per percent of utilisation (400 W at 100 %)
FAKE_IDLE_WATTS = 50.0
FAKE_WATTS_PER_PERCENT = 3.5


@dataclass
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)  # GPU index -> event types


class FakeNvmlLibrary:
    """A module-like fake of pynvml; thread-safe like NVML (its state is per-file or immutable)."""

    gpuq_fake = True

    def __init__(
        self, gpus: list[FakeGpuModel], node_name: str, state_dir: Path | None, spec: str
    ) -> None:
        self.box = FakeGpuBox(gpus, node_name, state_dir)
        self.state_dir = state_dir
        self._spec = spec
        self.inits = 0  # successful nvmlInit calls, for tests of re-initialisation
        self._seen_xids: dict[str, int] = {}
        self._closing = threading.Event()  # gpuq_interrupt_waits was called
        self._xid_files: dict[str, tuple[tuple[int, ...], list[str]]] = {}  # path -> (stat, lines)
        # GPU index -> (its mig file's stat, its xid files with their GI and CI)
        self._xid_paths: dict[int, tuple[tuple[int, ...], list[tuple[str, int, int]]]] = {}
        self.gpuq_device_paths = self.box.device_paths
        self._socket_cpus = socket_cpus(online_cpus())
        self._energy_lock = threading.Lock()
        self._energy: dict[int, tuple[float, float]] = {}  # GPU index -> (when, millijoules)

    def __getattr__(self, name: str) -> Any:
        """pynvml's constants and exception classes; an NVML function the fake lacks is missing."""
        value = getattr(pynvml, name)
        if callable(value) and not isinstance(value, type):
            raise AttributeError(f"the fake NVML library has no {name}")
        return value

    # --- library ---------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.box.fault("nvmlInit", None)
        if self.box.file("nodriver").exists():
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        self.box.running = True
        self.inits += 1
        self.box.write_mig_minors()

    def nvmlShutdown(self) -> None:
        self.box.check("nvmlShutdown", None)
        self.box.running = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self.box.check("nvmlSystemGetDriverVersion", None)
        return f"fake ({self._spec})"

    def nvmlSystemGetNVMLVersion(self) -> str:
        self.box.check("nvmlSystemGetNVMLVersion", None)
        return "fake"

    def nvmlDeviceGetCount(self) -> int:
        self.box.check("nvmlDeviceGetCount", None)
        return len(self.box.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        if not 0 <= index < len(self.box.gpus):
            self.box.check("nvmlDeviceGetHandleByIndex", None)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        handle = Handle(index)
        self.box.check("nvmlDeviceGetHandleByIndex", handle)
        self.box.make_nodes(index)
        return handle

    # --- identity --------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        self.box.check("nvmlDeviceGetUUID", handle)
        return self.box.uuid(handle)

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        self.box.check("nvmlDeviceGetName", handle)
        name = self.box.gpus[handle.index].name
        return name if handle.layout is None else f"{name} MIG {self.box.slice(handle).profile}"

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> SimpleNamespace:
        self.box.check("nvmlDeviceGetPciInfo", handle, whole=True)
        return SimpleNamespace(busId=fake_bus_id(handle.index))

    def nvmlDeviceGetMinorNumber(self, handle: Handle) -> int:
        self.box.check("nvmlDeviceGetMinorNumber", handle, whole=True)
        return handle.index

    def nvmlDeviceGetCpuAffinity(self, handle: Handle, words: int) -> list[int]:
        self.box.check("nvmlDeviceGetCpuAffinity", handle)
        return affinity_words(self._socket_cpus[self.box.socket(handle.index)], words)

    # --- MIG -------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:
        self.box.check("nvmlDeviceGetMigMode", handle, whole=True)
        gpu = self.box.gpus[handle.index]
        layout = self.box.layout(handle.index)
        if not layout[1] and not gpu.mig_capable:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if layout[1] else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:
        self.box.check("nvmlDeviceGetMaxMigDeviceCount", handle, whole=True)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> Handle:
        self.box.check("nvmlDeviceGetMigDeviceHandleByIndex", handle, whole=True)
        text, _ = self.box.layout(handle.index)
        slices = self.box.slices(handle.index)
        if not slices:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= index < len(slices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        found = slices[index]
        return Handle(handle.index, text, index, found.gi, found.ci)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Handle) -> Handle:
        self.box.check("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
        return Handle(handle.index)

    def nvmlDeviceGetGpuInstanceId(self, handle: Handle) -> int:
        self.box.check("nvmlDeviceGetGpuInstanceId", handle, mig=True)
        return handle.gi

    def nvmlDeviceGetComputeInstanceId(self, handle: Handle) -> int:
        self.box.check("nvmlDeviceGetComputeInstanceId", handle, mig=True)
        return handle.ci

    # --- topology --------------------------------------------------------------------------

    def nvmlDeviceGetTopologyCommonAncestor(self, first: Handle, second: Handle) -> int:
        self.box.check("nvmlDeviceGetTopologyCommonAncestor", first, whole=True)
        self.box.check("nvmlDeviceGetTopologyCommonAncestor", second, whole=True)
        i, j = first.index, second.index
        if i == j:
            return int(pynvml.NVML_TOPOLOGY_INTERNAL)
        if i // 2 == j // 2:
            return int(pynvml.NVML_TOPOLOGY_MULTIPLE)
        if self.box.socket(i) == self.box.socket(j):
            return int(pynvml.NVML_TOPOLOGY_NODE)
        return int(pynvml.NVML_TOPOLOGY_SYSTEM)

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:
        self._nvlink(handle, link, "nvmlDeviceGetNvLinkState")
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Handle, link: int) -> SimpleNamespace:
        gpu = self._nvlink(handle, link, "nvmlDeviceGetNvLinkRemotePciInfo")
        models = sorted({g.name for g in self.box.gpus if g.nvlink})
        return SimpleNamespace(busId=f"00000000:{0xC0 + models.index(gpu.name):02X}:00.0")

    def _nvlink(self, handle: Handle, link: int, call: str) -> FakeGpuModel:
        self.box.check(call, handle, whole=True)
        gpu = self.box.gpus[handle.index]
        if not gpu.nvlink:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= 2:  # two links, both to the model's NVSwitch
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    # --- usage -----------------------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> Any:
        self.box.check(
            "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo", handle
        )
        total = self.box.total(handle)
        used = sum(used for _, used, _ in self.box.claims(handle))
        reserved = int(total * FAKE_DRIVER_RESERVED) // (1024 * 1024) * 1024 * 1024
        if version:
            free = max(total - reserved - used, 0)
            return SimpleNamespace(
                version=version, total=total, reserved=reserved, free=free, used=used
            )
        return SimpleNamespace(
            total=total, free=max(total - reserved - used, 0), used=used + reserved
        )

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        self.box.check("nvmlDeviceGetUtilizationRates", handle, whole=True)
        return SimpleNamespace(gpu=self._utilization(handle.index), memory=0)

    def nvmlDeviceSetComputeMode(self, handle: Handle, mode: int) -> None:
        """Whole GPUs; kept in GPU-UUID/compute_mode (write "noperm" there to refuse, as NVML
        does for a user that is not root)."""
        self.box.check("nvmlDeviceSetComputeMode", handle, whole=True)
        path = self.box.unit_file(handle, "compute_mode")
        if read_text(path) == "noperm":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        if self.state_dir is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{int(mode)}\n")

    def nvmlDeviceGetComputeMode(self, handle: Handle) -> int:
        self.box.check("nvmlDeviceGetComputeMode", handle, whole=True)
        return read_int(self.box.unit_file(handle, "compute_mode")) or 0

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Handle) -> int:
        """Millijoules since the library started: the GPU's energy file when there is one (a
        test sets the counter, even backwards, as a reset), else a counter that grows at
        FAKE_IDLE_WATTS plus FAKE_WATTS_PER_PERCENT per percent of its utilisation now."""
        self.box.check("nvmlDeviceGetTotalEnergyConsumption", handle, whole=True)
        fixed = read_int(self.box.unit_file(handle, "energy"))
        if fixed is not None:
            return max(fixed, 0)
        watts = FAKE_IDLE_WATTS + FAKE_WATTS_PER_PERCENT * self._utilization(handle.index)
        now = time.monotonic()
        with self._energy_lock:
            then, total = self._energy.get(handle.index, (now, 0.0))
            total += watts * max(now - then, 0.0) * 1000.0
            self._energy[handle.index] = (now, total)
        return int(total)

    def _utilization(self, index: int) -> int:
        return read_utilization(self.box.unit_file(Handle(index), "utilization"), time.time()) or 0

    def _processes(self, call: str, kind: str, handle: Handle) -> list[SimpleNamespace]:
        self.box.check(call, handle)
        gi = handle.gi if handle.layout is not None else NO_ID
        found = []
        for pid, used, ci in self.box.claims(handle, kind):
            found.append(
                SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=gi, computeInstanceId=ci)
            )
        return found

    # --- health ----------------------------------------------------------------------------

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, error_type: int, counter: int) -> int:
        self.box.check("nvmlDeviceGetTotalEccErrors", handle, whole=True)
        if not self.box.gpus[handle.index].ecc:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        uncorrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        if uncorrected and counter == pynvml.NVML_VOLATILE_ECC:
            return read_int(self.box.unit_file(handle, "ecc")) or 0
        return 0

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        self.box.check("nvmlDeviceGetRemappedRows", handle, whole=True)
        if not self.box.gpus[handle.index].ecc:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        state = read_text(self.box.unit_file(handle, "remap"))
        if state == "failure":
            return (0, 1, 0, 1)
        return (0, 0, 1, 0) if state == "pending" else (0, 0, 0, 0)

    def nvmlDeviceGetGpuFabricInfo(self, handle: Handle, info: Any) -> int:
        self.box.check("nvmlDeviceGetGpuFabricInfo", handle, whole=True)
        if not self.box.gpus[handle.index].nvlink:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        target = getattr(info, "_obj", info)  # ctypes.byref(struct) or the struct
        state, name = fabric_state(read_text(self.box.unit_file(handle, "fabric"), keep_case=True))
        error = (error_class(name) or pynvml.NVMLError_Unknown) if name else None
        target.state = state
        target.status = error().value if error is not None and error is not Mismatch else 0
        return int(pynvml.NVML_SUCCESS)

    # --- events ----------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> _EventSet:
        self.box.check("nvmlEventSetCreate", None)
        return _EventSet()

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self.box.check("nvmlEventSetFree", None)
        event_set.registered.clear()

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        self.box.check("nvmlDeviceGetSupportedEventTypes", handle, whole=True)
        return int(
            pynvml.nvmlEventTypeXidCriticalError
            | pynvml.nvmlEventTypeDoubleBitEccError
            | pynvml.nvmlEventTypeSingleBitEccError
            | pynvml.nvmlEventTypePState
        )

    def nvmlDeviceRegisterEvents(self, handle: Handle, types: int, event_set: _EventSet) -> None:
        self.box.check("nvmlDeviceRegisterEvents", handle, whole=True)
        event_set.registered[handle.index] = int(types)

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> SimpleNamespace:
        return self._wait("nvmlEventSetWait_v2", event_set, timeout_ms)

    def nvmlEventSetWait(self, event_set: _EventSet, timeout_ms: int) -> SimpleNamespace:
        return self._wait("nvmlEventSetWait", event_set, timeout_ms)

    def _wait(self, call: str, event_set: _EventSet, timeout_ms: int) -> SimpleNamespace:
        self.box.check(call, None)
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        while True:
            for index, types in list(event_set.registered.items()):
                if types & pynvml.nvmlEventTypeXidCriticalError:
                    found = self._next_xid(index)
                    if found is not None:
                        return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            interrupted = self._closing.wait(min(_EVENT_POLL, remaining))
            if interrupted or time.monotonic() >= deadline:  # the next wait looks first
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    def gpuq_interrupt_waits(self) -> None:
        """End every event wait now, and later ones at once (the backend is closing). A real
        wait blocks in the driver until its timeout; a fake node's agent, in tests, need not
        wait that long to stop."""
        self._closing.set()

    def _next_xid(self, index: int) -> SimpleNamespace | None:
        if self.state_dir is None:
            return None
        for path, gi, ci in self._xid_sources(index):
            lines = self._xid_lines(path)
            seen = self._seen_xids.get(path, 0)
            if len(lines) < seen:
                seen = 0  # rewritten
            if len(lines) > seen:
                self._seen_xids[path] = seen + 1
                if not lines[seen].isdigit():
                    continue
                return SimpleNamespace(
                    device=Handle(index),
                    eventType=pynvml.nvmlEventTypeXidCriticalError,
                    eventData=int(lines[seen]),
                    gpuInstanceId=gi,
                    computeInstanceId=ci,
                )
        return None

    def _xid_sources(self, index: int) -> list[tuple[str, int, int]]:
        """(xid file, GI, CI) of the GPU and of each slice of its layout now, built again only
        when its mig file changed: a look at an idle GPU is two stats."""
        mig_file = os.path.join(str(self.state_dir), self.box.uuids[index], "mig")
        signature = _signature(mig_file)
        known = self._xid_paths.get(index)
        if known is not None and known[0] == signature:
            return known[1]
        text, layout = self.box.layout(index)
        handles = [(Handle(index), NO_ID, NO_ID)] + [
            (Handle(index, text, slot, found.gi, found.ci), found.gi, found.ci)
            for slot, found in enumerate(slices_of(layout))
        ]
        base = str(self.state_dir)
        sources = [
            (os.path.join(base, self.box.uuid(handle), "xid"), gi, ci) for handle, gi, ci in handles
        ]
        self._xid_paths[index] = (signature, sources)
        return sources

    def _xid_lines(self, path: str) -> list[str]:
        """The xid file's lines, read again only when the file changed (a stat per look)."""
        signature = _signature(path)
        cached = self._xid_files.get(path)
        if cached is not None and cached[0] == signature:
            return cached[1]
        text = read_text(Path(path), keep_case=True) if signature else ""
        lines = [line for line in (raw.strip() for raw in text.splitlines()) if line]
        self._xid_files[path] = (signature, lines)
        return lines


def _signature(path: str) -> tuple[int, ...]:
    """What tells a file changed without reading it: (inode, size, mtime); () when missing.
    A file written within the last second has a signature of its own at every look (mtimes
    move in clock ticks: two writes of one size within a tick would look alike)."""
    try:
        found = os.stat(path)
    except OSError:
        return ()
    if time.time_ns() - found.st_mtime_ns < 1_000_000_000:
        return (found.st_ino, found.st_size, found.st_mtime_ns, time.monotonic_ns())
    return (found.st_ino, found.st_size, found.st_mtime_ns)


# --- process lists, by kind and binding version (all alike here) ----------------------------


def _process_call(name: str, kind: str) -> Callable[[FakeNvmlLibrary, Handle], list[Any]]:
    def call(self: FakeNvmlLibrary, handle: Handle) -> list[Any]:
        return self._processes(name, kind, handle)

    call.__name__ = name
    return call


for _kind, _base in zip(
    PROCESS_KINDS,
    (
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetMPSComputeRunningProcesses",
    ),
    strict=True,
):
    for _suffix in ("_v3", "_v2", ""):
        setattr(FakeNvmlLibrary, _base + _suffix, _process_call(_base + _suffix, _kind))
