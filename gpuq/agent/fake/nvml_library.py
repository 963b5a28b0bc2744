"""FakeNvmlLibrary: the part of pynvml that gpuq calls, over fake GPUs and a state folder.

It stands in for the `pynvml` module (NvmlGpuBackend(library=...)): same function names and
signatures, pynvml's own constants and exception classes (NVMLError(code) maps to the subclass;
NVMLLibraryMismatchError), opaque handles, Uninitialized before nvmlInit, NotSupported where a
board lacks a feature, stale MIG handles after a layout change. What it pretends is described,
with the state folder's fault files, in gpus_fake's module docstring.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from gpuq.agent.fake.gpu_spec import (
    FakeGpuInstance,
    FakeGpuModel,
    _BadSpec,
    fake_uuid,
    parse_mig_layout,
)
from gpuq.agent.fake.nvml_files import (
    CI_IDS,
    GI_IDS,
    PROCESS_KINDS,
    Mismatch,
    cap_minor,
    error_class,
    fake_bus_id,
    make_char_device,
    read_claim,
    read_int,
    read_text,
    read_utilization,
    socket_cpus,
)
from gpuq.agent.gpu.device_paths import NVIDIA_MAJOR, DevicePaths, affinity_words, online_cpus

NVIDIA_CAPS_MAJOR = 237  # a typical dynamic major of nvidia-caps; any value works for tests
FAKE_DRIVER_RESERVED = 0.005  # share of a GPU's memory the fake driver keeps (v1 counts it)
_NO_ID = 0xFFFFFFFF
_EVENT_POLL = 0.2  # seconds between two looks at the xid files (a real wait blocks in the driver)
# the fake board's power: idle watts, plus watts per percent of utilisation (400 W at 100 %)
FAKE_IDLE_WATTS = 50.0
FAKE_WATTS_PER_PERCENT = 3.5


@dataclass(frozen=True, slots=True)
class _Handle:
    """Opaque, like c_nvmlDevice_t: index of the GPU, and for a MIG slice its place."""

    index: int
    layout: str | None = None  # the MIG layout the slice belongs to; None: the whole GPU
    slot: int = -1  # flattened compute-instance number within the layout
    gi: int = -1  # GPU instance id (1..)
    ci: int = -1  # compute instance id (0..)


@dataclass
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)  # GPU index -> event types


@dataclass(frozen=True, slots=True)
class _Slice:
    profile: str
    gi: int
    ci: int
    instance: FakeGpuInstance


class FakeNvmlLibrary:
    """A module-like fake of pynvml; thread-safe like NVML (its state is per-file or immutable)."""

    gpuq_fake = True

    def __init__(
        self, gpus: list[FakeGpuModel], node_name: str, state_dir: Path | None, spec: str
    ) -> None:
        self._gpus = gpus
        self._node = node_name
        self.state_dir = state_dir
        self._spec = spec
        self._running = False
        self.inits = 0  # successful nvmlInit calls, for tests of re-initialisation
        self._seen_xids: dict[Path, int] = {}
        self._uuids = [fake_uuid("GPU", node_name, f"gpu/{i}") for i in range(len(gpus))]
        base = state_dir if state_dir is not None else Path("/nonexistent-gpuq-fake")
        self.gpuq_device_paths = DevicePaths(base / "dev", base / "mig-minors", base / "pci")
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
        self._fault("nvmlInit", None)
        if self._file("nodriver").exists():
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        self._running = True
        self.inits += 1
        self._write_mig_minors()

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown", None)
        self._running = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion", None)
        return f"fake ({self._spec})"

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount", None)
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self._gpus):
            self._check("nvmlDeviceGetHandleByIndex", None)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        handle = _Handle(index)
        self._check("nvmlDeviceGetHandleByIndex", handle)
        self._make_nodes(index)
        return handle

    # --- identity --------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._check("nvmlDeviceGetUUID", handle)
        return self._uuid(handle)

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._check("nvmlDeviceGetName", handle)
        name = self._gpus[handle.index].name
        return name if handle.layout is None else f"{name} MIG {self._slice(handle).profile}"

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> SimpleNamespace:
        self._check("nvmlDeviceGetPciInfo", handle, whole=True)
        return SimpleNamespace(busId=fake_bus_id(handle.index))

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetMinorNumber", handle, whole=True)
        return handle.index

    def nvmlDeviceGetCpuAffinity(self, handle: _Handle, words: int) -> list[int]:
        self._check("nvmlDeviceGetCpuAffinity", handle)
        return affinity_words(self._socket_cpus[self._socket(handle.index)], words)

    # --- MIG -------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._check("nvmlDeviceGetMigMode", handle, whole=True)
        gpu = self._gpus[handle.index]
        layout = self._layout(handle.index)
        if not layout[1] and not gpu.mig_capable:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if layout[1] else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount", handle, whole=True)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        self._check("nvmlDeviceGetMigDeviceHandleByIndex", handle, whole=True)
        text, _ = self._layout(handle.index)
        slices = self._slices(handle.index)
        if not slices:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= index < len(slices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        found = slices[index]
        return _Handle(handle.index, text, index, found.gi, found.ci)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: _Handle) -> _Handle:
        self._check("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
        return _Handle(handle.index)

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetGpuInstanceId", handle, mig=True)
        return handle.gi

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetComputeInstanceId", handle, mig=True)
        return handle.ci

    # --- topology --------------------------------------------------------------------------

    def nvmlDeviceGetTopologyCommonAncestor(self, first: _Handle, second: _Handle) -> int:
        self._check("nvmlDeviceGetTopologyCommonAncestor", first, whole=True)
        self._check("nvmlDeviceGetTopologyCommonAncestor", second, whole=True)
        i, j = first.index, second.index
        if i == j:
            return int(pynvml.NVML_TOPOLOGY_INTERNAL)
        if i // 2 == j // 2:
            return int(pynvml.NVML_TOPOLOGY_MULTIPLE)
        if self._socket(i) == self._socket(j):
            return int(pynvml.NVML_TOPOLOGY_NODE)
        return int(pynvml.NVML_TOPOLOGY_SYSTEM)

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        self._nvlink(handle, link, "nvmlDeviceGetNvLinkState")
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: _Handle, link: int) -> SimpleNamespace:
        gpu = self._nvlink(handle, link, "nvmlDeviceGetNvLinkRemotePciInfo")
        models = sorted({g.name for g in self._gpus if g.nvlink})
        return SimpleNamespace(busId=f"00000000:{0xC0 + models.index(gpu.name):02X}:00.0")

    def _nvlink(self, handle: _Handle, link: int, call: str) -> FakeGpuModel:
        self._check(call, handle, whole=True)
        gpu = self._gpus[handle.index]
        if not gpu.nvlink:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= 2:  # two links, both to the model's NVSwitch
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    # --- usage -----------------------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        self._check("nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo", handle)
        total = self._total(handle)
        used = sum(used for _, used, _ in self._claims(handle))
        reserved = int(total * FAKE_DRIVER_RESERVED) // (1024 * 1024) * 1024 * 1024
        if version:
            free = max(total - reserved - used, 0)
            return SimpleNamespace(
                version=version, total=total, reserved=reserved, free=free, used=used
            )
        return SimpleNamespace(
            total=total, free=max(total - reserved - used, 0), used=used + reserved
        )

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> SimpleNamespace:
        self._check("nvmlDeviceGetUtilizationRates", handle, whole=True)
        return SimpleNamespace(gpu=self._utilization(handle.index), memory=0)

    def nvmlDeviceSetComputeMode(self, handle: _Handle, mode: int) -> None:
        """Whole GPUs; kept in GPU-UUID/compute_mode (write "noperm" there to refuse, as NVML
        does for a user that is not root)."""
        self._check("nvmlDeviceSetComputeMode", handle, whole=True)
        path = self._unit_file(handle, "compute_mode")
        if read_text(path) == "noperm":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        if self.state_dir is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{int(mode)}\n")

    def nvmlDeviceGetComputeMode(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetComputeMode", handle, whole=True)
        return read_int(self._unit_file(handle, "compute_mode")) or 0

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        """Millijoules since the library started: the GPU's energy file when there is one (a
        test sets the counter, even backwards, as a reset), else a counter that grows at
        FAKE_IDLE_WATTS plus FAKE_WATTS_PER_PERCENT per percent of its utilisation now."""
        self._check("nvmlDeviceGetTotalEnergyConsumption", handle, whole=True)
        fixed = read_int(self._unit_file(handle, "energy"))
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
        return read_utilization(self._unit_file(_Handle(index), "utilization"), time.time()) or 0

    def _processes(self, call: str, kind: str, handle: _Handle) -> list[SimpleNamespace]:
        self._check(call, handle)
        gi = handle.gi if handle.layout is not None else _NO_ID
        found = []
        for pid, used, ci in self._claims(handle, kind):
            found.append(
                SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=gi, computeInstanceId=ci)
            )
        return found

    # --- health ----------------------------------------------------------------------------

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter: int) -> int:
        self._check("nvmlDeviceGetTotalEccErrors", handle, whole=True)
        if not self._gpus[handle.index].ecc:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        uncorrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        if uncorrected and counter == pynvml.NVML_VOLATILE_ECC:
            return read_int(self._unit_file(handle, "ecc")) or 0
        return 0

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        self._check("nvmlDeviceGetRemappedRows", handle, whole=True)
        if not self._gpus[handle.index].ecc:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        state = read_text(self._unit_file(handle, "remap"))
        if state == "failure":
            return (0, 1, 0, 1)
        return (0, 0, 1, 0) if state == "pending" else (0, 0, 0, 0)

    def nvmlDeviceGetGpuFabricInfo(self, handle: _Handle, info: Any) -> int:
        self._check("nvmlDeviceGetGpuFabricInfo", handle, whole=True)
        if not self._gpus[handle.index].nvlink:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        target = getattr(info, "_obj", info)  # ctypes.byref(struct) or the struct
        name = read_text(self._unit_file(handle, "fabric"), keep_case=True)
        error = error_class(name) if name else None
        target.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        target.status = error().value if error is not None and error is not Mismatch else 0
        return int(pynvml.NVML_SUCCESS)

    # --- events ----------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> _EventSet:
        self._check("nvmlEventSetCreate", None)
        return _EventSet()

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._check("nvmlEventSetFree", None)
        event_set.registered.clear()

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetSupportedEventTypes", handle, whole=True)
        return int(
            pynvml.nvmlEventTypeXidCriticalError
            | pynvml.nvmlEventTypeDoubleBitEccError
            | pynvml.nvmlEventTypeSingleBitEccError
            | pynvml.nvmlEventTypePState
        )

    def nvmlDeviceRegisterEvents(self, handle: _Handle, types: int, event_set: _EventSet) -> None:
        self._check("nvmlDeviceRegisterEvents", handle, whole=True)
        event_set.registered[handle.index] = int(types)

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> SimpleNamespace:
        return self._wait("nvmlEventSetWait_v2", event_set, timeout_ms)

    def nvmlEventSetWait(self, event_set: _EventSet, timeout_ms: int) -> SimpleNamespace:
        return self._wait("nvmlEventSetWait", event_set, timeout_ms)

    def _wait(self, call: str, event_set: _EventSet, timeout_ms: int) -> SimpleNamespace:
        self._check(call, None)
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        while True:
            for index, types in list(event_set.registered.items()):
                if types & pynvml.nvmlEventTypeXidCriticalError:
                    found = self._next_xid(index)
                    if found is not None:
                        return found
            if time.monotonic() >= deadline:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(min(_EVENT_POLL, max(deadline - time.monotonic(), 0)))

    def _next_xid(self, index: int) -> SimpleNamespace | None:
        if self.state_dir is None:
            return None
        sources = [(_Handle(index), _NO_ID, _NO_ID)]
        text, _ = self._layout(index)
        for slot, found in enumerate(self._slices(index)):
            sources.append((_Handle(index, text, slot, found.gi, found.ci), found.gi, found.ci))
        for handle, gi, ci in sources:
            path = self.state_dir / self._uuid(handle) / "xid"
            lines = [line.strip() for line in read_text(path, keep_case=True).splitlines()]
            lines = [line for line in lines if line]
            seen = self._seen_xids.get(path, 0)
            if len(lines) < seen:
                seen = 0  # rewritten
            if len(lines) > seen:
                self._seen_xids[path] = seen + 1
                if not lines[seen].isdigit():
                    continue
                return SimpleNamespace(
                    device=_Handle(index),
                    eventType=pynvml.nvmlEventTypeXidCriticalError,
                    eventData=int(lines[seen]),
                    gpuInstanceId=gi,
                    computeInstanceId=ci,
                )
        return None

    # --- the fake's own state --------------------------------------------------------------

    def _check(
        self, call: str, handle: _Handle | None, *, whole: bool = False, mig: bool = False
    ) -> None:
        """Raise what NVML would: Uninitialized, GpuIsLost, an injected error, a stale handle."""
        if not self._running:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if handle is not None:
            if not isinstance(handle, _Handle) or not 0 <= handle.index < len(self._gpus):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            uuids = {self._uuids[handle.index]}
            if handle.layout is not None:
                uuids.add(self._uuid(handle))
            if self.state_dir is not None and any(
                (self.state_dir / uuid / "lost").exists() for uuid in uuids
            ):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            self._fault(call, uuids)
            if handle.layout is not None:
                if self._layout(handle.index)[0] != handle.layout:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # stale
                if whole:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            elif mig:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        else:
            self._fault(call, None)

    def _fault(self, call: str, uuids: set[str] | None) -> None:
        text = read_text(self._file("errors"), keep_case=True)
        for line in text.splitlines():
            words = line.split()
            if len(words) < 2 or words[0] != call:
                continue
            if len(words) >= 3 and (uuids is None or words[2] not in uuids):
                continue
            error = error_class(words[1])
            if error is Mismatch:
                raise pynvml.NVMLLibraryMismatchError(f"injected: {call} needs a newer driver")
            if error is not None:
                raise error()

    def _file(self, name: str) -> Path:
        return (self.state_dir or Path("/nonexistent-gpuq-fake")) / name

    def _unit_file(self, handle: _Handle, name: str) -> Path:
        return self._file(self._uuid(handle)) / name

    def _uuid(self, handle: _Handle) -> str:
        if handle.layout is None:
            return self._uuids[handle.index]
        text = handle.layout
        suffix = "" if text == self._gpus[handle.index].mig_text else f"/{text}"
        return fake_uuid("MIG", self._node, f"gpu/{handle.index}/mig/{handle.slot}{suffix}")

    def _layout(self, index: int) -> tuple[str, tuple[FakeGpuInstance, ...]]:
        """The GPU's MIG layout now: its mig file if valid, else the spec's."""
        gpu = self._gpus[index]
        override = read_text(self._file(self._uuids[index]) / "mig")
        if override:
            if override == "off":
                return "", ()
            with contextlib.suppress(_BadSpec):
                return override, parse_mig_layout(override, gpu.memory)
        return gpu.mig_text, gpu.mig

    def _slices(self, index: int) -> list[_Slice]:
        """The compute instances of the current layout, GI ids from 1, CI ids from 0."""
        _text, layout = self._layout(index)
        slices: list[_Slice] = []
        for gi, instance in enumerate(layout, start=1):
            for ci, profile in enumerate(instance.unit_profiles()):
                slices.append(_Slice(profile, gi, ci, instance))
        return slices

    def _slice(self, handle: _Handle) -> _Slice:
        return self._slices(handle.index)[handle.slot]

    def _total(self, handle: _Handle) -> int:
        if handle.layout is None:
            return self._gpus[handle.index].memory
        return self._slice(handle).instance.memory  # every CI reports its whole instance

    def _claims(self, handle: _Handle, kind: str | None = None) -> list[tuple[int, int, int]]:
        """(pid, bytes, compute instance id) of the claims on a GPU or a slice's GPU instance."""
        if self.state_dir is None:
            return []
        targets: list[tuple[str, int]] = [(self._uuid(handle), _NO_ID)]
        if handle.layout is not None:
            targets = [
                (self._uuid(_Handle(handle.index, handle.layout, slot, s.gi, s.ci)), s.ci)
                for slot, s in enumerate(self._slices(handle.index))
                if s.gi == handle.gi
            ]
        found: list[tuple[int, int, int]] = []
        for uuid, ci in targets:
            folder = self.state_dir / uuid
            with contextlib.suppress(OSError):
                for entry in folder.iterdir():
                    claim = read_claim(entry)
                    if claim is not None and (kind is None or claim[2] == kind):
                        found.append((claim[0], claim[1], ci))
        return found

    def _socket(self, index: int) -> int:
        switches = math.ceil(len(self._gpus) / 2)
        per_socket = math.ceil(switches / 2)
        return (index // 2) // per_socket

    def _write_mig_minors(self) -> None:
        """A mig-minors file in the driver's format, for every GPU, GI id and CI id."""
        if self.state_dir is None or not any(g.mig_capable or g.mig for g in self._gpus):
            return
        lines = []
        for gpu in range(len(self._gpus)):
            for gi in range(1, GI_IDS + 1):
                lines.append(f"gpu{gpu}/gi{gi}/access {cap_minor(gpu, gi, None)}")
                for ci in range(CI_IDS):
                    lines.append(f"gpu{gpu}/gi{gi}/ci{ci}/access {cap_minor(gpu, gi, ci)}")
        with contextlib.suppress(OSError):
            self.state_dir.mkdir(parents=True, exist_ok=True)
            path = self.gpuq_device_paths.mig_minors
            partial = path.with_name(f".mig-minors.{os.getpid()}")
            partial.write_text("\n".join(lines) + "\n")
            os.replace(partial, path)

    def _make_nodes(self, index: int) -> None:
        """As root: /dev/nvidiaN and the slices' capability nodes under state_dir/dev."""
        if self.state_dir is None or os.geteuid() != 0:
            return
        dev = self.gpuq_device_paths.dev_root
        nodes = [(dev / f"nvidia{index}", NVIDIA_MAJOR, index)]
        for found in self._slices(index):
            for minor in (cap_minor(index, found.gi, None), cap_minor(index, found.gi, found.ci)):
                nodes.append((dev / "nvidia-caps" / f"nvidia-cap{minor}", NVIDIA_CAPS_MAJOR, minor))
        for path, major, minor in nodes:
            make_char_device(path, major, minor)


# --- process lists, by kind and binding version (all alike here) ----------------------------


def _process_call(name: str, kind: str) -> Callable[[FakeNvmlLibrary, _Handle], list[Any]]:
    def call(self: FakeNvmlLibrary, handle: _Handle) -> list[Any]:
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
