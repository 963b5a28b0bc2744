"""The real GPU backend: NVML through nvidia-ml-py (import name `pynvml`).

pynvml is imported when a backend is made, never at module import, so the agent (and the
coordinator, and tests) import gpuq.agent.gpus on machines without a driver.

NVML differs between drivers and boards: consumer GPUs answer NotSupported for MIG and NVLink,
MIG slices for utilisation, and old bindings return bytes where new ones return str. Every
optional question tolerates NotSupported and falls back to the conservative answer (no MIG, no
NVLink, utilisation unknown); any other NVML error propagates, because it means a broken driver.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from gpuq.agent.gpus import (
    GpuInventory,
    NoNvidiaDriver,
    UnitUsage,
    distance_for_nvml_level,
    unit_topology,
)
from gpuq.domain.model import DISTANCE_NVLINK, GpuUnit

_MIG_PROFILE_RE = re.compile(r"\bMIG\s+(\S+)\s*$")  # "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
_DEFAULT_MAX_LINKS = 18


@dataclass(frozen=True, slots=True)
class _Gpu:
    """A physical GPU as found: its handle and what a GpuUnit needs."""

    handle: Any
    index: int
    uuid: str
    name: str
    memory: int
    bus: str


def _text(value: object) -> str:
    """A name, UUID or bus id as str: pynvml returns bytes before 11.515 and str after."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).rstrip("\x00").strip()


def normalize_bus_id(value: object) -> str:
    """`00000000:1B:00.0` for any of NVML's spellings (`0000:1b:00.0`, bytes, ...)."""
    text = _text(value)
    match = re.match(r"^([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])$", text)
    if match is None:
        return text.upper()
    domain, bus, device, function = (int(part, 16) for part in match.groups())
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function:X}"


class NvmlGpuBackend:
    """A GpuBackend over the NVIDIA driver; raises NoNvidiaDriver where there is none."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as missing:  # nvidia-ml-py not installed
            raise NoNvidiaDriver(f"nvidia-ml-py is not installed: {missing}") from missing
        self._nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
        except (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded) as missing:
            raise NoNvidiaDriver(f"NVML: {missing}") from missing
        except OSError as missing:  # the library exists but cannot be loaded
            raise NoNvidiaDriver(f"NVML library cannot be loaded: {missing}") from missing
        self._open = True
        self._handles: dict[str, Any] = {}  # allocatable unit uuid -> NVML handle

    def inventory(self) -> GpuInventory:
        """Every allocatable unit, with NVML's topology; refreshes the handles usage() reads."""
        nvml = self._nvml
        gpus = [self._gpu(index) for index in range(int(nvml.nvmlDeviceGetCount()))]
        units: list[GpuUnit] = []
        handles: dict[str, Any] = {}
        for gpu in gpus:
            slices = self._mig_slices(gpu)
            if slices is None:
                units.append(GpuUnit(gpu.uuid, gpu.index, gpu.name, gpu.memory, gpu.bus))
                handles[gpu.uuid] = gpu.handle
            for unit, handle in slices or ():
                units.append(unit)
                handles[unit.uuid] = handle
        self._handles = handles
        topology = unit_topology(units, self._gpu_distances(gpus))
        return GpuInventory(tuple(units), topology, False, self._driver_version())

    def usage(self) -> list[UnitUsage]:
        """Memory, utilisation and compute processes of each allocatable unit."""
        if not self._handles:
            self.inventory()
        return [self._unit_usage(uuid, handle) for uuid, handle in self._handles.items()]

    def close(self) -> None:
        """Shut NVML down once; later calls do nothing."""
        if self._open:
            self._open = False
            self._nvml.nvmlShutdown()

    def _gpu(self, index: int) -> _Gpu:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        return _Gpu(
            handle=handle,
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            memory=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
            bus=normalize_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId),
        )

    def _mig_slices(self, gpu: _Gpu) -> list[tuple[GpuUnit, Any]] | None:
        """The GPU's MIG slices with their handles, or None when it is not in MIG mode.

        A GPU in MIG mode with no slices configured yields an empty list: it has nothing a job
        could use, and offering the parent instead would be wrong.
        """
        nvml = self._nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(gpu.handle)
        except nvml.NVMLError_NotSupported:
            return None
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return None
        slices: list[tuple[GpuUnit, Any]] = []
        for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu.handle))):
            try:
                handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
            except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
                continue  # an empty slot
            slices.append((self._mig_unit(gpu, handle), handle))
        return slices

    def _mig_unit(self, gpu: _Gpu, handle: Any) -> GpuUnit:
        """A slice as a unit: its own UUID and memory, its parent's index and bus."""
        nvml = self._nvml
        try:
            name = _text(nvml.nvmlDeviceGetName(handle))
        except nvml.NVMLError_NotSupported:
            name = f"{gpu.name} MIG"
        profile_match = _MIG_PROFILE_RE.search(name)
        return GpuUnit(
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            index=gpu.index,
            name=name,
            memory=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
            pci_bus_id=gpu.bus,
            parent_uuid=gpu.uuid,
            mig_profile=profile_match.group(1) if profile_match else None,
        )

    def _gpu_distances(self, gpus: list[_Gpu]) -> dict[tuple[str, str], int]:
        """Distance per pair of physical GPUs: NVLink if linked, else their PCIe ancestor."""
        nvml = self._nvml
        linked = self._nvlink_pairs(gpus)
        distances: dict[tuple[str, str], int] = {}
        for first, second in combinations(gpus, 2):
            pair = (min(first.uuid, second.uuid), max(first.uuid, second.uuid))
            if pair in linked:
                distances[pair] = DISTANCE_NVLINK
                continue
            try:
                level = nvml.nvmlDeviceGetTopologyCommonAncestor(first.handle, second.handle)
            except nvml.NVMLError_NotSupported:
                level = nvml.NVML_TOPOLOGY_SYSTEM
            distances[pair] = distance_for_nvml_level(int(level))
        return distances

    def _nvlink_pairs(self, gpus: list[_Gpu]) -> set[tuple[str, str]]:
        """Pairs joined by an active NVLink, directly or through a shared NVSwitch.

        A link's remote PCI device is either one of our GPUs (a direct link) or something else,
        in practice an NVSwitch: GPUs that reach the same one are all linked to each other.
        """
        by_bus = {gpu.bus: gpu.uuid for gpu in gpus}
        switches: dict[str, set[str]] = {}
        pairs: set[tuple[str, str]] = set()
        for gpu in gpus:
            for remote in self._active_link_remotes(gpu.handle):
                peer = by_bus.get(remote)
                if peer is None:
                    switches.setdefault(remote, set()).add(gpu.uuid)
                elif peer != gpu.uuid:
                    pairs.add((min(gpu.uuid, peer), max(gpu.uuid, peer)))
        for members in switches.values():
            pairs.update(combinations(sorted(members), 2))
        return pairs

    def _active_link_remotes(self, handle: Any) -> set[str]:
        """Bus ids at the far end of the GPU's active NVLinks; empty without NVLink."""
        nvml = self._nvml
        tolerated = (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument)
        remotes: set[str] = set()
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", _DEFAULT_MAX_LINKS))):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                    continue
                remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            except tolerated:
                continue
            remotes.add(normalize_bus_id(remote.busId))
        return remotes

    def _unit_usage(self, uuid: str, handle: Any) -> UnitUsage:
        nvml = self._nvml
        used = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
        try:
            utilization: int | None = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nvml.NVMLError_NotSupported:
            utilization = None  # MIG slices have no utilisation counter
        try:
            running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except nvml.NVMLError_NotSupported:
            running = []
        # usedGpuMemory is None where the driver cannot tell (e.g. no permission): count 0.
        processes = sorted((int(p.pid), int(p.usedGpuMemory or 0)) for p in running)
        return UnitUsage(uuid, used, utilization, tuple(processes))

    def _driver_version(self) -> str:
        try:
            return _text(self._nvml.nvmlSystemGetDriverVersion())
        except self._nvml.NVMLError:
            return "unknown"
