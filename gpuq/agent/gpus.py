"""GPU discovery for the agent: what a node offers, and how busy it is right now.

An agent registers a GpuInventory (the allocatable units and how far apart they are) and sends
UnitUsage in its heartbeats. Two backends produce them behind one Protocol:

- gpus_nvml.NvmlGpuBackend talks to the NVIDIA driver through nvidia-ml-py (`pynvml`);
- gpus_fake.FakeGpuBackend pretends, from a spec such as `2xH100-80GB,2xL4-24GB`, so that tests and
  machines without a driver run the whole system. The fake is the only fake in gpuq (DESIGN.md).

An allocatable unit is a whole GPU, or, when a GPU is in MIG mode, each of its MIG slices instead
of the GPU: CUDA cannot run work on a MIG-mode GPU except inside a slice, so offering both would
let two jobs believe they own the same silicon.

This module holds what both backends share and `select_backend`, which picks one. The backends
import this module, so it imports them lazily (inside select_backend and `__getattr__`) to keep
the import graph free of cycles; `from gpuq.agent.gpus import FakeGpuBackend` still works.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gpuq.domain.model import (
    DISTANCE_HOST_BRIDGE,
    DISTANCE_NUMA_NODE,
    DISTANCE_PCIE_SWITCH,
    DISTANCE_SAME_BOARD,
    DISTANCE_SYSTEM,
    GpuUnit,
)
from gpuq.errors import GpuqError

if TYPE_CHECKING:
    from gpuq.agent.gpus_fake import FakeGpuBackend as FakeGpuBackend
    from gpuq.agent.gpus_fake import claim_fake_vram as claim_fake_vram
    from gpuq.agent.gpus_fake import fake_state_dir as fake_state_dir
    from gpuq.agent.gpus_fake import parse_fake_spec as parse_fake_spec
    from gpuq.agent.gpus_nvml import NvmlGpuBackend as NvmlGpuBackend

__all__ = [
    "DEFAULT_FAKE_SPEC",
    "FakeGpuBackend",
    "GpuBackend",
    "GpuInventory",
    "NoNvidiaDriver",
    "NvmlGpuBackend",
    "Topology",
    "UnitUsage",
    "claim_fake_vram",
    "distance_for_nvml_level",
    "fake_state_dir",
    "parse_fake_spec",
    "select_backend",
    "unit_topology",
]

Topology = tuple[tuple[str, str, int], ...]  # (uuid a, uuid b, distance), a < b, one per pair

DEFAULT_FAKE_SPEC = "4"  # what an agent without a driver offers when nobody asked for fakes

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

_EXPORTS = {
    "FakeGpuBackend": "gpuq.agent.gpus_fake",
    "claim_fake_vram": "gpuq.agent.gpus_fake",
    "fake_state_dir": "gpuq.agent.gpus_fake",
    "parse_fake_spec": "gpuq.agent.gpus_fake",
    "NvmlGpuBackend": "gpuq.agent.gpus_nvml",
}


@dataclass(frozen=True, slots=True)
class GpuInventory:
    """What an agent registers: its allocatable units and their pairwise distances."""

    units: tuple[GpuUnit, ...]
    topology: Topology
    fake: bool
    driver: str  # the NVIDIA driver version, or "fake (SPEC)"


@dataclass(frozen=True, slots=True)
class UnitUsage:
    """One allocatable unit right now, as NVML reports it; sizes in bytes."""

    uuid: str
    memory_used: int
    utilization: int | None  # percent; None where NVML cannot say (MIG slices)
    processes: tuple[tuple[int, int], ...]  # (pid, used bytes), sorted by pid


class GpuBackend(Protocol):
    """Where the agent's GPU facts come from; one instance per agent process."""

    def inventory(self) -> GpuInventory: ...

    def usage(self) -> list[UnitUsage]: ...

    def close(self) -> None: ...


class NoNvidiaDriver(GpuqError):
    """NVML cannot be used because no NVIDIA driver (or no libnvidia-ml) is installed.

    Distinct from a broken driver: that one raises pynvml's own error, which must reach the admin.
    """


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


def select_backend(
    fake_spec: str | None, node_name: str, *, state_dir: Path | None = None
) -> tuple[GpuBackend, str | None]:
    """The backend an agent should use, and a warning to show the admin (or None).

    With fake_spec the admin asked for fakes: no warning. Otherwise NVML; when the machine has no
    NVIDIA driver at all the agent still starts, with DEFAULT_FAKE_SPEC fakes, and says loudly
    that its GPUs are FAKE, so a laptop or CI box runs gpuq while a real server cannot silently
    schedule onto imaginary GPUs. Any other NVML failure (a broken or mismatched driver)
    propagates: an admin must see it, not get fakes.
    """
    from gpuq.agent.gpus_fake import FakeGpuBackend
    from gpuq.agent.gpus_nvml import NvmlGpuBackend

    if fake_spec is not None:
        return FakeGpuBackend(fake_spec, node_name, state_dir=state_dir), None
    try:
        return NvmlGpuBackend(), None
    except NoNvidiaDriver as missing:
        fake = FakeGpuBackend(DEFAULT_FAKE_SPEC, node_name, state_dir=state_dir)
        return fake, _no_driver_warning(fake, missing)


def _no_driver_warning(fake: FakeGpuBackend, missing: NoNvidiaDriver) -> str:
    units = fake.inventory().units
    models = ", ".join(sorted({unit.name for unit in units}))
    return (
        f"no NVIDIA driver found ({missing}); this agent offers {len(units)} FAKE GPUs "
        f"({models}) and jobs will not run on real GPUs. To ask for fake GPUs explicitly and "
        f"silence this warning, start the agent with --fake-gpus N."
    )


def __getattr__(name: str) -> object:
    """Re-export the backends lazily (PEP 562): they import this module, not it them."""
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
