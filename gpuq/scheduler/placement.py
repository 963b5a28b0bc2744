"""Where a job fits on one node, and why not when it does not.

A fit check never answers just "no": it returns the named reasons, which the plan keeps so that
`gpuq show` can say exactly what blocks a job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuq.domain.model import DISTANCE_SYSTEM, GpuUnit, Resources
from gpuq.domain.units import format_size


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as the scheduler sees it at one instant."""

    name: str
    up: bool
    units: tuple[GpuUnit, ...]
    free_units: frozenset[str]
    cpus: int
    cpus_free: int
    mem: int
    mem_free: int
    distances: Mapping[tuple[str, str], int]  # (a, b) with a < b
    down_reason: str = "is down"  # why it takes no work when not up

    def distance(self, a: str, b: str) -> int:
        return self.distances.get((a, b) if a < b else (b, a), DISTANCE_SYSTEM)

    def usable_units(self, gpu_mem: int | None) -> list[GpuUnit]:
        """Free units with enough memory, in PCI order."""
        return [
            u
            for u in self.units
            if u.uuid in self.free_units and (gpu_mem is None or u.memory >= gpu_mem)
        ]


def misfit(node: NodeView, need: Resources) -> str | None:
    """Why `need` does not fit on `node` now (None: it fits)."""
    if not node.up:
        return f"node {node.name} {node.down_reason}"
    if need.gpus and len(node.usable_units(need.gpu_mem)) < need.gpus:
        return (
            f"node {node.name} has {len(node.usable_units(need.gpu_mem))} of {need.gpus} GPUs free"
        )
    if need.cpus > node.cpus_free:
        return f"node {node.name} has {node.cpus_free} of {need.cpus} CPUs free"
    if need.mem is not None and need.mem > node.mem_free:
        return f"node {node.name} has {format_size(node.mem_free)} of {format_size(need.mem)} free"
    return None


def never_fits(node: NodeView, need: Resources) -> bool:
    """True when the node could not run the job even empty."""
    units = [u for u in node.units if need.gpu_mem is None or u.memory >= need.gpu_mem]
    return (
        len(units) < need.gpus
        or need.cpus > node.cpus
        or (need.mem is not None and need.mem > node.mem)
    )


def choose_units(node: NodeView, need: Resources) -> tuple[str, ...]:
    """The `need.gpus` usable units closest to each other (least total pairwise distance).

    Greedy from every seed: exact for the common shapes (pairs, NVLink islands) and O(n^3) on
    an 8-GPU node, which is nothing.
    """
    usable = node.usable_units(need.gpu_mem)
    if need.gpus == 0:
        return ()
    if need.gpus == len(usable):
        return tuple(u.uuid for u in usable)
    best: tuple[int, list[str]] | None = None
    for seed in usable:
        chosen = [seed.uuid]
        cost = 0
        while len(chosen) < need.gpus:
            step, pick = min(
                (sum(node.distance(c, u.uuid) for c in chosen), u.uuid)
                for u in usable
                if u.uuid not in chosen
            )
            chosen.append(pick)
            cost += step
        if best is None or cost < best[0]:
            best = (cost, chosen)
    assert best is not None
    order = {u.uuid: i for i, u in enumerate(node.units)}
    return tuple(sorted(best[1], key=order.__getitem__))


def shortage(nodes: list[NodeView], need: Resources) -> str:
    """One line on the whole cluster: what the job needs and the best that is free."""
    up = [n for n in nodes if n.up]
    if not up:
        return "no node is up"
    if need.gpus:
        largest = max(up, key=lambda n: (len(n.usable_units(need.gpu_mem)), n.name))
        free = len(largest.usable_units(need.gpu_mem))
        if free < need.gpus:
            kind = "GPU" if need.gpus == 1 else "GPUs"
            if need.gpu_mem:
                kind += f" with {format_size(need.gpu_mem)}"
            return (
                f"needs {need.gpus} {kind} on one node; largest free block is {free} "
                f"(node {largest.name})"
            )
    reasons = [r for n in up if (r := misfit(n, need)) is not None]
    return "resources: " + "; ".join(reasons[:3]) + ("; ..." if len(reasons) > 3 else "")
