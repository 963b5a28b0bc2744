"""Fake GPUs that behave like NVML, for tests and for machines without an NVIDIA driver.

Spec grammar (`--fake-gpus`), case-insensitive, no spaces:

    spec    := group ("," group)*                     at most 64 GPUs in all
    group   := COUNT ["x" MODEL] (":" option)*        COUNT 1..64; no MODEL: A100-80GB
    MODEL   := NAME "-" MEM "GB"                      MEM in GiB, 1..1024
    option  := "mig=" PROFILE ("+" PROFILE)*          every GPU of the group in MIG mode
             | "nvlink=" ("yes" | "no")               default: yes for SXM models (A100, H100...)
    PROFILE := G "g." M "gb"                          at most 7 slices, sum(G) <= 7, sum(M) <= MEM

    "4"  "8xA100-80GB"  "2xH100-80GB,2xL4-24GB"  "1xA100-80GB:mig=3g.40gb+3g.40gb"

Known models get NVML's product name ("A100-80GB" -> "NVIDIA A100-SXM4-80GB"); others "NVIDIA NAME".
GPU indices run over the groups in order. UUIDs are uuid5 hashes of (node, index), so an agent
that restarts offers the same UUIDs, and two nodes never share one. PCI bus ids grow with index.

The box (NVML levels, mapped by gpus.distance_for_nvml_level): GPUs 2k and 2k+1 sit behind one
two-level PCIe switch tree (PXB -> DISTANCE_PCIE_SWITCH); the switches are split between two
CPU sockets, the first half on socket 0 (NODE -> DISTANCE_NUMA_NODE within a socket, SYSTEM ->
DISTANCE_SYSTEM across). NVLink-capable GPUs of the same model are all connected through an
NVSwitch, as in a DGX/HGX box (DISTANCE_NVLINK). MIG slices of one GPU are DISTANCE_SAME_BOARD.

VRAM use: a file `<state_dir>/<uuid>/<pid>` holding a byte count says that process pid uses that
much on that unit, as a CUDA process would show in NVML; claim_fake_vram writes it. usage()
counts live pids only and deletes the files of dead ones (NVML forgets a process that exited).
`<state_dir>/<uuid>/utilization` (a percent) sets the unit's utilisation.
"""

from __future__ import annotations

import math
import os
import re
import uuid as uuid_module
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

from gpuq.agent.gpus import (
    GpuInventory,
    UnitUsage,
    distance_for_nvml_level,
    unit_topology,
)
from gpuq.domain.model import DISTANCE_NVLINK, GpuUnit
from gpuq.errors import InvalidInput

FAKE_GPU_DIR_ENV = "GPUQ_FAKE_GPU_DIR"
MAX_FAKE_GPUS = 64
GIB = 1024**3

# Never change: fake UUIDs are stored in job records and must survive an upgrade.
_FAKE_NAMESPACE = uuid_module.uuid5(uuid_module.NAMESPACE_URL, "gpuq:fake-gpu")
_DEFAULT_MODEL = "A100-80GB"
_KNOWN_MODELS: dict[str, tuple[str, bool]] = {  # spec model -> (NVML name, NVLink by default)
    "A100-80GB": ("NVIDIA A100-SXM4-80GB", True),
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", True),
    "H100-80GB": ("NVIDIA H100 80GB HBM3", True),
    "H200-141GB": ("NVIDIA H200", True),
    "L4-24GB": ("NVIDIA L4", False),
    "L40S-48GB": ("NVIDIA L40S", False),
    "A10-24GB": ("NVIDIA A10", False),
    "RTX4090-24GB": ("NVIDIA GeForce RTX 4090", False),
}
_GROUP_RE = re.compile(r"^(\d+)(?:x(.+))?$", re.IGNORECASE)
_MODEL_RE = re.compile(r"^([A-Z0-9][A-Z0-9.]*(?:-[A-Z0-9.]+)*)-(\d+)GB$", re.IGNORECASE)
_PROFILE_RE = re.compile(r"^(\d)g\.(\d+)gb$", re.IGNORECASE)
_SAFE_UUID_RE = re.compile(r"^[A-Za-z0-9-]+$")
_HELP = "expected e.g. 4, 8xA100-80GB, 2xH100-80GB,2xL4-24GB or 1xA100-80GB:mig=3g.40gb+3g.40gb"


class _BadSpec(Exception):
    """A problem with one part of a spec; parse_fake_spec turns it into InvalidInput."""


@dataclass(frozen=True, slots=True)
class _FakeGpu:
    name: str
    memory: int  # bytes
    nvlink: bool
    mig: tuple[str, ...]  # MIG profiles; empty: not in MIG mode


def parse_fake_spec(text: str, node_name: str) -> GpuInventory:
    """The inventory a FakeGpuBackend on node_name offers for spec text (grammar above)."""
    try:
        gpus = [gpu for group in text.strip().split(",") for gpu in _parse_group(group)]
    except _BadSpec as problem:
        raise InvalidInput("--fake-gpus", text, f"{problem}; {_HELP}") from None
    if len(gpus) > MAX_FAKE_GPUS:
        raise InvalidInput("--fake-gpus", text, f"more than {MAX_FAKE_GPUS} GPUs")
    return _build_inventory(gpus, node_name, f"fake ({text.strip()})")


def _parse_group(group: str) -> list[_FakeGpu]:
    head, *options = group.split(":")
    match = _GROUP_RE.match(head)
    if match is None:
        raise _BadSpec(f"{group!r} is not COUNT or COUNTxMODEL")
    count = int(match.group(1))
    if not 1 <= count <= MAX_FAKE_GPUS:
        raise _BadSpec(f"{group!r}: the count must be 1 to {MAX_FAKE_GPUS}")
    name, memory, nvlink = _parse_model(match.group(2) or _DEFAULT_MODEL)
    mig: tuple[str, ...] = ()
    seen: set[str] = set()
    for option in options:
        key, _, value = option.partition("=")
        key = key.lower()
        if key in seen:
            raise _BadSpec(f"{group!r} repeats {key}")
        seen.add(key)
        if key == "mig":
            mig = _parse_mig(value, memory)
        elif key == "nvlink" and value.lower() in ("yes", "no"):
            nvlink = value.lower() == "yes"
        else:
            raise _BadSpec(f"{group!r}: unknown option {option!r} (mig=... or nvlink=yes|no)")
    return [_FakeGpu(name, memory, nvlink, mig) for _ in range(count)]


def _parse_model(model: str) -> tuple[str, int, bool]:
    """(NVML product name, memory in bytes, NVLink by default) for a spec model."""
    match = _MODEL_RE.match(model)
    if match is None:
        raise _BadSpec(f"{model!r} is not a model like A100-80GB (name, then memory in GB)")
    gib = int(match.group(2))
    if not 1 <= gib <= 1024:
        raise _BadSpec(f"{model!r}: memory must be 1 to 1024 GB")
    known = _KNOWN_MODELS.get(model.upper())
    if known is not None:
        return known[0], gib * GIB, known[1]
    return f"NVIDIA {match.group(1)}", gib * GIB, "SXM" in model.upper()


def _parse_mig(value: str, gpu_memory: int) -> tuple[str, ...]:
    """MIG profiles, checked against what one GPU has: 7 compute slices and its memory."""
    profiles = [p.lower() for p in value.split("+")]
    matches = [_PROFILE_RE.match(p) for p in profiles]
    if not value or any(m is None or int(m.group(1)) == 0 for m in matches):
        raise _BadSpec(f"mig={value!r}: expected profiles like 3g.40gb joined by +")
    slices = sum(int(m.group(1)) for m in matches if m is not None)
    memory = sum(int(m.group(2)) * GIB for m in matches if m is not None)
    if len(profiles) > 7 or slices > 7:
        raise _BadSpec(f"mig={value!r}: a GPU has 7 compute slices, this asks for {slices}")
    if memory > gpu_memory or any(m is not None and int(m.group(2)) == 0 for m in matches):
        raise _BadSpec(f"mig={value!r}: slice memory must fit in {gpu_memory // GIB} GB")
    return tuple(profiles)


def _fake_uuid(prefix: str, node_name: str, path: str) -> str:
    """An NVML-looking UUID (GPU-xxxxxxxx-xxxx-...), fixed for a node and a place in it."""
    return f"{prefix}-{uuid_module.uuid5(_FAKE_NAMESPACE, f'{node_name}/{path}')}"


def _pci_bus_id(index: int) -> str:
    """00000000:1B:00.0 for GPU 0, then 3 buses apart: distinct and growing up to GPU 63."""
    return f"00000000:{0x1B + 3 * index:02X}:00.0"


def _build_inventory(gpus: list[_FakeGpu], node_name: str, driver: str) -> GpuInventory:
    units: list[GpuUnit] = []
    gpu_uuids = [_fake_uuid("GPU", node_name, f"gpu/{index}") for index in range(len(gpus))]
    for index, (gpu, gpu_uuid) in enumerate(zip(gpus, gpu_uuids, strict=True)):
        bus = _pci_bus_id(index)
        if not gpu.mig:
            units.append(GpuUnit(gpu_uuid, index, gpu.name, gpu.memory, bus))
        for slot, profile in enumerate(gpu.mig):
            mig_uuid = _fake_uuid("MIG", node_name, f"gpu/{index}/mig/{slot}")
            memory = int(profile.split(".")[1].removesuffix("gb")) * GIB
            name = f"{gpu.name} MIG {profile}"
            units.append(GpuUnit(mig_uuid, index, name, memory, bus, gpu_uuid, profile))
    distances: dict[tuple[str, str], int] = {}
    for i, j in combinations(range(len(gpus)), 2):
        pair = sorted((gpu_uuids[i], gpu_uuids[j]))
        distances[(pair[0], pair[1])] = _gpu_distance(gpus, i, j)
    return GpuInventory(tuple(units), unit_topology(units, distances), True, driver)


def _gpu_distance(gpus: list[_FakeGpu], i: int, j: int) -> int:
    """Distance between fake GPUs i and j in the box described in the module docstring."""
    if gpus[i].nvlink and gpus[j].nvlink and gpus[i].name == gpus[j].name:
        return DISTANCE_NVLINK
    switches = math.ceil(len(gpus) / 2)
    per_socket = math.ceil(switches / 2)
    switch_i, switch_j = i // 2, j // 2
    if switch_i == switch_j:
        return distance_for_nvml_level(20)  # NVML_TOPOLOGY_MULTIPLE (PXB)
    if switch_i // per_socket == switch_j // per_socket:
        return distance_for_nvml_level(40)  # NVML_TOPOLOGY_NODE
    return distance_for_nvml_level(50)  # NVML_TOPOLOGY_SYSTEM


class FakeGpuBackend:
    """A GpuBackend over fake GPUs; per-process VRAM comes from files in state_dir."""

    def __init__(self, spec: str, node_name: str, state_dir: Path | None = None) -> None:
        """state_dir None: the folder GPUQ_FAKE_GPU_DIR names; neither: no process uses VRAM.

        The agent should hand state_dir to fake jobs (as GPUQ_FAKE_GPU_DIR) so they can claim.
        """
        self._inventory = parse_fake_spec(spec, node_name)
        self.state_dir = state_dir if state_dir is not None else fake_state_dir()

    def inventory(self) -> GpuInventory:
        return self._inventory

    def usage(self) -> list[UnitUsage]:
        return [self._unit_usage(unit.uuid) for unit in self._inventory.units]

    def close(self) -> None:
        """Nothing to release; present because NVML needs it."""

    def _unit_usage(self, unit_uuid: str) -> UnitUsage:
        if self.state_dir is None or not (self.state_dir / unit_uuid).is_dir():
            return UnitUsage(unit_uuid, 0, 0, ())
        folder = self.state_dir / unit_uuid
        processes: list[tuple[int, int]] = []
        for entry in folder.iterdir():
            if not entry.name.isdigit():
                continue  # the utilization file, or a claim being written
            pid = int(entry.name)
            if not _pid_alive(pid):
                entry.unlink(missing_ok=True)
                continue
            used = _read_int(entry)
            if used is not None and used >= 0:
                processes.append((pid, used))
        processes.sort()
        utilization = min(max(_read_int(folder / "utilization") or 0, 0), 100)
        memory_used = sum(used for _, used in processes)
        return UnitUsage(unit_uuid, memory_used, utilization, tuple(processes))


def fake_state_dir() -> Path | None:
    """The fake GPUs' state folder named by GPUQ_FAKE_GPU_DIR, or None when it is unset."""
    value = os.environ.get(FAKE_GPU_DIR_ENV, "")
    return Path(value) if value else None


def claim_fake_vram(
    uuid: str, nbytes: int, pid: int | None = None, state_dir: Path | None = None
) -> Path:
    """Say that pid (default: this process) uses nbytes of VRAM on fake unit uuid; 0 releases.

    What a fake job calls where a real one would allocate CUDA memory. The file appears whole
    (written aside, then renamed), so usage() never reads half a number. Returns the file.
    """
    folder = _unit_dir(uuid, state_dir)
    owner = os.getpid() if pid is None else pid
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise InvalidInput("nbytes", nbytes, "must be a whole number of bytes, 0 or more")
    path = folder / str(owner)
    if nbytes == 0:
        path.unlink(missing_ok=True)
        return path
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{owner}.{os.getpid()}.partial"
    partial.write_text(f"{nbytes}\n")
    os.replace(partial, path)
    return path


def set_fake_utilization(uuid: str, percent: int, state_dir: Path | None = None) -> None:
    """Set what usage() reports as fake unit uuid's utilisation (0 to 100)."""
    folder = _unit_dir(uuid, state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".utilization.{os.getpid()}.partial"
    partial.write_text(f"{percent}\n")
    os.replace(partial, folder / "utilization")


def _unit_dir(uuid: str, state_dir: Path | None) -> Path:
    base = state_dir if state_dir is not None else fake_state_dir()
    if base is None:
        raise InvalidInput(FAKE_GPU_DIR_ENV, "", "is not set and no state_dir was given")
    if not _SAFE_UUID_RE.match(uuid):
        raise InvalidInput("uuid", uuid, "expected a fake GPU or MIG UUID")
    return base / uuid


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    """Whether pid runs; a zombie does not (its CUDA context, and NVML entry, are gone)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    return not _gone_or_zombie(pid)


def _gone_or_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return Path("/proc/self/stat").exists()  # exited just now, unless there is no /proc
    except OSError:
        return False
    state = stat.rpartition(")")[2].split()[:1]
    return state in (["Z"], ["X"])
