"""What a node's GPUs are to the agent: the backend Protocol and the facts it reports.

An agent registers a GpuInventory (the allocatable units and how far apart they are) and sends
UnitUsage in its heartbeats. One backend produces them behind one Protocol:

- gpu.nvml_backend.NvmlGpuBackend talks to the NVIDIA driver through nvidia-ml-py (`pynvml`);
- fake.gpu_backend.FakeGpuBackend is that same backend over a fake NVML library
  (fake.nvml_library), built from a spec such as `2xH100-80GB,2xL4-24GB` and driven by fault
  files, so that tests and `gpuq serve` run the whole system. Fakes only when asked for
  (`--fake-gpus`): never as a fallback. gpu.choose_backend picks one.

An allocatable unit is a whole GPU, or, when a GPU is in MIG mode, each of its MIG slices instead
of the GPU: CUDA cannot run work on a MIG-mode GPU except inside a slice, so offering both would
let two jobs believe they own the same silicon.

This module holds what both backends share; it imports neither of them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from gpuq.domain.model import (
    DISTANCE_HOST_BRIDGE,
    DISTANCE_NUMA_NODE,
    DISTANCE_PCIE_SWITCH,
    DISTANCE_SAME_BOARD,
    DISTANCE_SYSTEM,
    GpuUnit,
)

Topology = tuple[tuple[str, str, int], ...]  # (uuid a, uuid b, distance), a < b, one per pair

# nvmlGpuTopologyLevel_t -> distance, as documented next to the DISTANCE_* constants. Both backends
# go through this table (the fake models its box in NVML levels) so that they rank pairs alike.
_NVML_LEVEL_DISTANCE: dict[int, int] = {
    0: DISTANCE_SAME_BOARD,  # NVML_TOPOLOGY_INTERNAL: the same board (and MIG slices of one GPU)
    10: DISTANCE_SAME_BOARD,  # NVML_TOPOLOGY_SINGLE: one PCIe switch (PIX)
    20: DISTANCE_PCIE_SWITCH,  # NVML_TOPOLOGY_MULTIPLE: several switches, no host bridge (PXB)
    30: DISTANCE_HOST_BRIDGE,  # NVML_TOPOLOGY_HOSTBRIDGE (PHB)
    40: DISTANCE_NUMA_NODE,  # NVML_TOPOLOGY_NODE: same CPU socket / NUMA node
    50: DISTANCE_SYSTEM,  # NVML_TOPOLOGY_SYSTEM: across sockets (SMP interconnect)
}


@dataclass(frozen=True, slots=True)
class GpuInventory:
    """What an agent registers: its allocatable units and their pairwise distances.

    devices and local_cpus stay on the node (they are not sent): what the agent needs to
    enforce a job's units (device cgroup rules) and to bind its CPUs near them.
    """

    units: tuple[GpuUnit, ...]
    topology: Topology
    fake: bool
    driver: str  # the NVIDIA driver version, or "fake (SPEC)"
    # unit uuid -> the device nodes a job given that unit must be able to open: /dev/nvidiaN
    # for a GPU; for a MIG slice its parent's /dev/nvidiaN and its GPU- and compute-instance
    # access nodes under /dev/nvidia-caps. Every node listed for some unit and not for a
    # job's units is denied to that job. Missing entries: the node cannot isolate that unit.
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # unit uuid -> the CPUs close to it (NVML CPU affinity or sysfs local_cpulist); empty or
    # missing: unknown
    local_cpus: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # why there are no GPUs although the agent looked for them (e.g. no NVIDIA driver); ""
    problem: str = ""


HEALTH_OK = "ok"
HEALTH_UNHEALTHY = "unhealthy"
HEALTH_DIRTY = "dirty"  # the agent's (processes left on a unit); backends report ok/unhealthy
HEALTH_DRAINED = "drained"  # the coordinator's (an admin's drain)

ProcessKind = Literal["compute", "graphics", "mps"]


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process NVML lists on a unit."""

    pid: int
    used: int  # bytes of VRAM; 0 where the driver cannot tell
    kind: ProcessKind = "compute"


@dataclass(frozen=True, slots=True)
class UnitUsage:
    """One allocatable unit right now, as NVML reports it; sizes in bytes.

    A backend never raises from usage(): a unit it cannot read comes back with health
    "unhealthy" and the reason (the NVML error, a lost GPU, an XID, ECC or row remapping).
    """

    uuid: str
    memory_used: int
    utilization: int | None  # percent; None where NVML cannot say (MIG slices): never 0
    processes: tuple[GpuProcess, ...]  # sorted by pid
    health: str = HEALTH_OK  # HEALTH_OK or HEALTH_UNHEALTHY
    reason: str = ""
    # the board's total-energy counter in millijoules (nvmlDeviceGetTotalEnergyConsumption);
    # None for MIG slices (the counter is the whole board's) and where NVML cannot say
    energy_mj: int | None = None


@dataclass(frozen=True, slots=True)
class GpuEvent:
    """An XID (or other critical event) NVML delivered for a unit.

    hardware: the unit is unhealthy from now on and the job holding it must end; otherwise
    (application XIDs: 13, 31, 43, 45, 68, 109) only the job that caused it is told.
    """

    uuid: str  # the allocatable unit (for a whole-GPU event on a MIG GPU: every slice's)
    xid: int
    hardware: bool
    text: str  # one line, e.g. "XID 79 (GPU has fallen off the bus)"


class GpuBackend(Protocol):
    """Where the agent's GPU facts come from; one instance per agent process.

    No method raises for NVML trouble: errors become a unit's health, the backend
    re-initialises NVML after library errors and re-reads the inventory on refresh().
    usage() and refresh() run on one thread; wait_events() on another (the event thread).
    """

    def inventory(self) -> GpuInventory: ...

    def usage(
        self, telemetry: Collection[str] | None = None, only: Collection[str] | None = None
    ) -> list[UnitUsage]:
        """Every unit's memory, processes and health (`only`: just those units, the ones a
        job's end left to check, in the inventory's order); the telemetry counters
        (utilisation, energy) only of the units in `telemetry` (None: all), the units jobs
        hold."""
        ...

    def refresh(self) -> bool:
        """Read the inventory again (MIG changes, a reset GPU); True when the units changed."""
        ...

    def wait_events(self, timeout: float) -> list[GpuEvent]:
        """Block up to timeout seconds for critical events; [] on timeout or when unsupported."""
        ...

    def close(self) -> None: ...


def distance_for_nvml_level(level: int) -> int:
    """The DISTANCE_* for an nvmlGpuTopologyLevel_t; an unknown level counts as the farthest."""
    return _NVML_LEVEL_DISTANCE.get(level, DISTANCE_SYSTEM)


def unit_topology(
    units: Sequence[GpuUnit], gpu_distance: Mapping[tuple[str, str], int]
) -> Topology:
    """One (a, b, distance) per pair of allocatable units, a < b, sorted.

    gpu_distance holds the distance between physical GPUs, keyed by the sorted pair of GPU UUIDs.
    A MIG slice is as far from others as its parent GPU is; two slices of one GPU are on the
    same board. A pair missing from gpu_distance counts as DISTANCE_SYSTEM: a scheduler that
    packs jobs must never believe two GPUs closer than they are.
    """
    links: list[tuple[str, str, int]] = []
    ordered = sorted(units, key=lambda unit: unit.uuid)
    for i, first in enumerate(ordered):
        for second in ordered[i + 1 :]:
            gpu_a = first.parent_uuid or first.uuid
            gpu_b = second.parent_uuid or second.uuid
            if gpu_a == gpu_b:
                distance = DISTANCE_SAME_BOARD
            else:
                pair = (gpu_a, gpu_b) if gpu_a < gpu_b else (gpu_b, gpu_a)
                distance = gpu_distance.get(pair, DISTANCE_SYSTEM)
            links.append((first.uuid, second.uuid, distance))
    return tuple(links)
