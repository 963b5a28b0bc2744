"""Reading what a node has from NVML: GPUs, MIG slices, topology, device nodes, nearby CPUs.

read_inventory makes one pass over the driver and reports, per GPU, either what it found or
why it could not (the backend keeps the previous units of a GPU it could not read, unhealthy:
a lost GPU must not vanish silently). Every call goes through NvmlCalls, so nothing raises but
CallError, and only for the device count, without which there is nothing to read.

MIG: a compute instance is a unit. Compute instances that share one GPU instance each report the
whole instance's memory in NVML; here each gets an equal share of it (rounded down to a MiB), so
that a node's units add up to its memory and a GPU instance is counted once. Their usage is
shared the same way (gpu.nvml_backend).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from gpuq.agent.gpu.backend import distance_for_nvml_level
from gpuq.agent.gpu.device_paths import (
    DevicePaths,
    cpus_from_affinity,
    gpu_device_node,
    make_caps_nodes,
    mig_device_nodes,
    parse_mig_minors,
    sysfs_local_cpus,
)
from gpuq.agent.gpu.nvml_calls import CallError, NvmlCalls
from gpuq.domain.model import DISTANCE_NVLINK, GpuUnit

MIB = 1024**2
_MIG_PROFILE_RE = re.compile(r"\bMIG\s+(\S+)\s*$")  # "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
_DEFAULT_MAX_LINKS = 18


@dataclass(frozen=True, slots=True)
class PhysicalGpu:
    """A GPU as found: its handle and what units, events and health polling need."""

    handle: Any
    index: int
    uuid: str
    name: str
    memory: int
    bus: str
    minor: int | None  # /dev/nvidiaN; None when NVML would not say


@dataclass(frozen=True, slots=True)
class UnitSlot:
    """An allocatable unit with what the backend needs to read it."""

    unit: GpuUnit
    handle: Any  # None: not readable now (kept from an earlier inventory)
    gpu_uuid: str  # the physical GPU (the unit itself for a whole GPU)
    gi: int | None = None  # GPU and compute instance ids of a MIG slice
    ci: int | None = None
    share: int = 1  # compute instances sharing its GPU instance (memory is divided by it)


@dataclass
class InventoryRead:
    gpus: list[PhysicalGpu] = field(default_factory=list)
    slots: list[UnitSlot] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)  # GPU index -> why it was not read
    distances: dict[tuple[str, str], int] = field(default_factory=dict)
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    local_cpus: dict[str, tuple[int, ...]] = field(default_factory=dict)


def text(value: object) -> str:
    """A name, UUID or bus id as str: pynvml returns bytes before 11.515 and str after."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).rstrip("\x00").strip()


def normalize_bus_id(value: object) -> str:
    """`00000000:1B:00.0` for any of NVML's spellings (`0000:1b:00.0`, bytes, ...)."""
    found = text(value)
    match = re.match(r"^([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])$", found)
    if match is None:
        return found.upper()
    domain, bus, device, function = (int(part, 16) for part in match.groups())
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function:X}"


def read_inventory(calls: NvmlCalls, paths: DevicePaths) -> InventoryRead:
    """Everything NVML says about this node's GPUs; CallError only if it cannot count them."""
    read = InventoryRead()
    count = int(calls.call("nvmlDeviceGetCount"))
    minors = _mig_minors(paths)
    for index in range(count):
        try:
            gpu = _gpu(calls, index)
            slots = _units_of(calls, gpu)
        except CallError as failed:
            read.failed[index] = failed.reason
            continue
        read.gpus.append(gpu)
        read.slots.extend(slots)
        cpus = _local_cpus(calls, gpu, paths)
        for slot in slots:
            read.local_cpus[slot.unit.uuid] = cpus
            nodes = _device_nodes(paths, minors, gpu, slot)
            if nodes:
                read.devices[slot.unit.uuid] = nodes
    read.distances = _gpu_distances(calls, read.gpus)
    return read


def _gpu(calls: NvmlCalls, index: int) -> PhysicalGpu:
    handle = calls.call("nvmlDeviceGetHandleByIndex", index)
    try:
        minor: int | None = int(calls.call("nvmlDeviceGetMinorNumber", handle))
    except CallError:
        minor = None
    return PhysicalGpu(
        handle=handle,
        index=index,
        uuid=text(calls.call("nvmlDeviceGetUUID", handle)),
        name=text(calls.call("nvmlDeviceGetName", handle)),
        memory=int(calls.call("nvmlDeviceGetMemoryInfo", handle).total),
        bus=normalize_bus_id(calls.call("nvmlDeviceGetPciInfo", handle).busId),
        minor=minor,
    )


def _units_of(calls: NvmlCalls, gpu: PhysicalGpu) -> list[UnitSlot]:
    """The GPU as one unit, or its MIG compute instances when it is in MIG mode.

    A GPU in MIG mode with no slices configured yields none: it has nothing a job could use,
    and offering the parent instead would be wrong.
    """
    mode = calls.optional("nvmlDeviceGetMigMode", gpu.handle)
    if mode is None or int(mode[0]) != int(calls.nvml.NVML_DEVICE_MIG_ENABLE):
        unit = GpuUnit(gpu.uuid, gpu.index, gpu.name, gpu.memory, gpu.bus)
        return [UnitSlot(unit, gpu.handle, gpu.uuid)]
    found: list[tuple[Any, str, str, int, int | None, int | None]] = []
    for slot in range(int(calls.call("nvmlDeviceGetMaxMigDeviceCount", gpu.handle))):
        try:
            handle = calls.call("nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, slot)
        except CallError as failed:
            if failed.name in ("NotFound", "InvalidArgument"):
                continue  # an empty slot
            raise
        name = calls.optional("nvmlDeviceGetName", handle)
        name = text(name) if name is not None else f"{gpu.name} MIG"
        uuid = text(calls.call("nvmlDeviceGetUUID", handle))
        memory = int(calls.call("nvmlDeviceGetMemoryInfo", handle).total)
        gi = _optional_id(calls, "nvmlDeviceGetGpuInstanceId", handle)
        ci = _optional_id(calls, "nvmlDeviceGetComputeInstanceId", handle)
        found.append((handle, uuid, name, memory, gi, ci))
    sharing = Counter(gi for *_, gi, _ci in found if gi is not None)
    slots = []
    for handle, uuid, name, memory, gi, ci in found:
        share = sharing[gi] if gi is not None else 1
        profile = _MIG_PROFILE_RE.search(name)
        unit = GpuUnit(
            uuid=uuid,
            index=gpu.index,
            name=name,
            memory=memory // share // MIB * MIB if share > 1 else memory,
            pci_bus_id=gpu.bus,
            parent_uuid=gpu.uuid,
            mig_profile=profile.group(1) if profile else None,
        )
        slots.append(UnitSlot(unit, handle, gpu.uuid, gi, ci, share))
    return slots


def _optional_id(calls: NvmlCalls, function: str, handle: Any) -> int | None:
    try:
        return int(calls.call(function, handle))
    except CallError:
        return None


def _mig_minors(paths: DevicePaths) -> dict[tuple[int, int, int | None], int]:
    try:
        return parse_mig_minors(paths.mig_minors.read_text())
    except OSError:
        return {}


def _device_nodes(
    paths: DevicePaths,
    minors: dict[tuple[int, int, int | None], int],
    gpu: PhysicalGpu,
    slot: UnitSlot,
) -> tuple[str, ...]:
    """The unit's device nodes, all of which exist; () when any is unknown or missing."""
    if gpu.minor is None:
        return ()
    if slot.unit.parent_uuid is None:
        nodes: tuple[str, ...] = (gpu_device_node(paths.dev_root, gpu.minor),)
    elif slot.gi is None or slot.ci is None:
        return ()
    else:
        nodes = mig_device_nodes(paths.dev_root, minors, gpu.minor, slot.gi, slot.ci)
        if nodes and paths.make_caps and not all(os.path.exists(node) for node in nodes[1:]):
            make_caps_nodes(paths, gpu.minor, slot.gi, slot.ci)  # a fresh layout: none yet
    return nodes if nodes and all(os.path.exists(node) for node in nodes) else ()


def _local_cpus(calls: NvmlCalls, gpu: PhysicalGpu, paths: DevicePaths) -> tuple[int, ...]:
    """NVML's CPU affinity of the GPU, else sysfs local_cpulist; () when neither says."""
    words = max(1, -(-(os.cpu_count() or 1) // 64))
    try:
        cpus = cpus_from_affinity(calls.call("nvmlDeviceGetCpuAffinity", gpu.handle, words))
    except CallError:
        cpus = ()
    return cpus or sysfs_local_cpus(paths.pci_devices, gpu.bus)


def _gpu_distances(calls: NvmlCalls, gpus: list[PhysicalGpu]) -> dict[tuple[str, str], int]:
    """Distance per pair of physical GPUs: NVLink if linked, else their PCIe ancestor."""
    linked = _nvlink_pairs(calls, gpus)
    distances: dict[tuple[str, str], int] = {}
    for first, second in combinations(gpus, 2):
        pair = (min(first.uuid, second.uuid), max(first.uuid, second.uuid))
        if pair in linked:
            distances[pair] = DISTANCE_NVLINK
            continue
        try:
            level = calls.call("nvmlDeviceGetTopologyCommonAncestor", first.handle, second.handle)
        except CallError:
            level = 50  # NVML_TOPOLOGY_SYSTEM: never believe two GPUs closer than they are
        distances[pair] = distance_for_nvml_level(int(level))
    return distances


def _nvlink_pairs(calls: NvmlCalls, gpus: list[PhysicalGpu]) -> set[tuple[str, str]]:
    """Pairs joined by an active NVLink, directly or through a shared NVSwitch.

    A link's remote PCI device is either one of our GPUs (a direct link) or something else,
    in practice an NVSwitch: GPUs that reach the same one are all linked to each other.
    """
    by_bus = {gpu.bus: gpu.uuid for gpu in gpus}
    switches: dict[str, set[str]] = {}
    pairs: set[tuple[str, str]] = set()
    for gpu in gpus:
        for remote in _active_link_remotes(calls, gpu.handle):
            peer = by_bus.get(remote)
            if peer is None:
                switches.setdefault(remote, set()).add(gpu.uuid)
            elif peer != gpu.uuid:
                pairs.add((min(gpu.uuid, peer), max(gpu.uuid, peer)))
    for members in switches.values():
        pairs.update(combinations(sorted(members), 2))
    return pairs


def _active_link_remotes(calls: NvmlCalls, handle: Any) -> set[str]:
    """Bus ids at the far end of the GPU's active NVLinks; empty without NVLink."""
    nvml = calls.nvml
    enabled = int(getattr(nvml, "NVML_FEATURE_ENABLED", 1))
    remotes: set[str] = set()
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", _DEFAULT_MAX_LINKS))):
        try:
            if int(calls.call("nvmlDeviceGetNvLinkState", handle, link)) != enabled:
                continue
            remote = calls.call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        except CallError as failed:
            if failed.name in ("NotSupported", "InvalidArgument") and link == 0:
                break  # no NVLink on this board: do not ask 36 times
            continue
        remotes.add(normalize_bus_id(remote.busId))
    return remotes
