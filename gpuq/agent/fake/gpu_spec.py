"""What fake GPUs a `--fake-gpus` spec describes: its grammar, models, MIG layouts and UUIDs.

The fake GPUs (fake.gpu_backend) are built from such a spec; the files that drive them while they
run are fake.gpu_state's. Spec grammar (`--fake-gpus`), case-insensitive, no spaces:

    spec    := group ("," group)*                     at most 64 GPUs in all
    group   := COUNT ["x" MODEL] (":" option)*        COUNT 1..64; no MODEL: A100-80GB
    MODEL   := NAME "-" MEM "GB"                      MEM in GiB, 1..1024
    option  := "mig=" GI ("+" GI)*                    every GPU of the group in MIG mode
             | "nvlink=" ("yes" | "no")               default: yes for SXM models (A100, H100...)
    GI      := G "g." M "gb"                          a GPU instance with one compute instance
             | CI ("/" CI)*                           compute instances sharing a GPU instance
    CI      := C "c." G "g." M "gb"                   C of the instance's G compute slices

    "4"  "8xA100-80GB"  "2xH100-80GB,2xL4-24GB"  "1xH200-141GB:mig=3g.71gb+2g.35gb+1g.18gb"
    "1xA100-80GB:mig=1c.3g.40gb/2c.3g.40gb+3g.40gb"   (two CIs share the first GPU instance)

Sizes are NVML's, not marketed ones: known models have their real NVML totals (H100-80GB
81,559 MiB, H200-141GB 143,771 MiB, L4-24GB 23,034 MiB, ...); other models MEM GiB. A GPU has
7 compute slices and 8 memory slices; G is 1, 2, 3, 4 or 7 and takes 1, 2, 4, 4 or 8 memory
slices; a GPU instance's total is its memory slices x (GPU total // 8), rounded down to a MiB,
and M must be that size in GiB rounded down or up (H200: 1g.18gb, 2g.35gb, 3g.71gb). Within a
GPU: sum(G) <= 7, sum(memory slices) <= 8, sum(C) <= G per instance. Every compute instance
is a unit named by NVML as "<GPU name> MIG <profile>", e.g. "NVIDIA H200 MIG 1c.3g.71gb".

Known models get NVML's product name ("A100-80GB" -> "NVIDIA A100-SXM4-80GB"); others "NVIDIA NAME".
GPU indices run over the groups in order. UUIDs are uuid5 hashes of (node, index) (and slot for
MIG slices), so an agent that restarts offers the same UUIDs, and two nodes never share one. PCI
bus ids grow with index; minor numbers equal indices.

The box (NVML levels, mapped by gpu.backend.distance_for_nvml_level; fake.nvml_library
builds it): GPUs 2k and 2k+1 sit behind one
two-level PCIe switch tree (PXB -> DISTANCE_PCIE_SWITCH); the switches are split between two
CPU sockets, the first half on socket 0 (NODE -> DISTANCE_NUMA_NODE within a socket, SYSTEM ->
DISTANCE_SYSTEM across). NVLink-capable GPUs of the same model are all connected through an
NVSwitch, as in a DGX/HGX box (DISTANCE_NVLINK). MIG slices of one GPU are DISTANCE_SAME_BOARD.
CPU affinity: this machine's online CPUs, in order, split in two halves, socket 0 the first
(a one-CPU machine gives both sockets its CPU).
"""

from __future__ import annotations

import math
import re
import uuid as uuid_module
from dataclasses import dataclass

from gpuq.errors import InvalidInput

MAX_FAKE_GPUS = 64
GIB = 1024**3
MIB = 1024**2
COMPUTE_SLICES = 7
MEMORY_SLICES = 8
# compute slices of a GPU instance -> its memory slices
MEMORY_SLICES_FOR: dict[int, int] = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}

# Never change: fake UUIDs are stored in job records and must survive an upgrade.
_FAKE_NAMESPACE = uuid_module.uuid5(uuid_module.NAMESPACE_URL, "gpuq:fake-gpu")
_DEFAULT_MODEL = "A100-80GB"
# spec model -> (NVML name, NVLink by default, NVML total in MiB, MIG-capable, ECC)
_KNOWN_MODELS: dict[str, tuple[str, bool, int, bool, bool]] = {
    "A100-80GB": ("NVIDIA A100-SXM4-80GB", True, 81_920, True, True),
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", True, 40_960, True, True),
    "H100-80GB": ("NVIDIA H100 80GB HBM3", True, 81_559, True, True),
    "H200-141GB": ("NVIDIA H200", True, 143_771, True, True),
    "L4-24GB": ("NVIDIA L4", False, 23_034, False, True),
    "L40S-48GB": ("NVIDIA L40S", False, 46_068, False, True),
    "A10-24GB": ("NVIDIA A10", False, 23_028, False, True),
    "RTX4090-24GB": ("NVIDIA GeForce RTX 4090", False, 24_564, False, False),
}
_GROUP_RE = re.compile(r"^(\d+)(?:x(.+))?$", re.IGNORECASE)
_MODEL_RE = re.compile(r"^([A-Z0-9][A-Z0-9.]*(?:-[A-Z0-9.]+)*)-(\d+)GB$", re.IGNORECASE)
_PROFILE_RE = re.compile(r"^(?:(\d)c\.)?(\d)g\.(\d+)gb$", re.IGNORECASE)
_HELP = "expected e.g. 4, 8xA100-80GB, 2xH100-80GB,2xL4-24GB or 1xA100-80GB:mig=3g.40gb+3g.40gb"


class _BadSpec(Exception):
    """A problem with one part of a spec; parse_fake_spec turns it into InvalidInput."""


@dataclass(frozen=True, slots=True)
class FakeGpuInstance:
    """A MIG GPU instance: G compute slices, its memory, and its compute instances' slices."""

    slices: int
    gib: int  # M of the profile name
    memory: int  # bytes, NVML's total for the instance
    cis: tuple[int, ...]  # compute slices per compute instance; (G,) for a plain slice

    @property
    def profile(self) -> str:
        return f"{self.slices}g.{self.gib}gb"

    def unit_profiles(self) -> list[str]:
        """NVML's profile per compute instance: "3g.40gb", or "1c.3g.40gb" when it is partial."""
        if self.cis == (self.slices,):
            return [self.profile]
        return [f"{c}c.{self.profile}" for c in self.cis]


@dataclass(frozen=True, slots=True)
class FakeGpuModel:
    """One fake GPU as the spec describes it."""

    name: str
    memory: int  # bytes, NVML's total
    nvlink: bool
    mig: tuple[FakeGpuInstance, ...]  # empty: not in MIG mode
    mig_capable: bool
    ecc: bool
    mig_text: str = ""  # the mig= value as given (lowercase), for UUIDs of other layouts


def parse_fake_models(text: str) -> list[FakeGpuModel]:
    """The GPUs a spec describes (grammar above); InvalidInput naming --fake-gpus if malformed."""
    try:
        gpus = [gpu for group in text.strip().split(",") for gpu in _parse_group(group)]
    except _BadSpec as problem:
        raise InvalidInput("--fake-gpus", text, f"{problem}; {_HELP}") from None
    if len(gpus) > MAX_FAKE_GPUS:
        raise InvalidInput("--fake-gpus", text, f"more than {MAX_FAKE_GPUS} GPUs")
    return gpus


def _parse_group(group: str) -> list[FakeGpuModel]:
    head, *options = group.split(":")
    match = _GROUP_RE.match(head)
    if match is None:
        raise _BadSpec(f"{group!r} is not COUNT or COUNTxMODEL")
    count = int(match.group(1))
    if not 1 <= count <= MAX_FAKE_GPUS:
        raise _BadSpec(f"{group!r}: the count must be 1 to {MAX_FAKE_GPUS}")
    model = _parse_model(match.group(2) or _DEFAULT_MODEL)
    seen: set[str] = set()
    for option in options:
        key, _, value = option.partition("=")
        key = key.lower()
        if key in seen:
            raise _BadSpec(f"{group!r} repeats {key}")
        seen.add(key)
        if key == "mig":
            mig = parse_mig_layout(value, model.memory)
            model = _replace(model, mig=mig, mig_text=value.lower())
        elif key == "nvlink" and value.lower() in ("yes", "no"):
            model = _replace(model, nvlink=value.lower() == "yes")
        else:
            raise _BadSpec(f"{group!r}: unknown option {option!r} (mig=... or nvlink=yes|no)")
    return [model] * count


def _replace(model: FakeGpuModel, **changes: object) -> FakeGpuModel:
    from dataclasses import replace

    return replace(model, **changes)  # type: ignore[arg-type]


def _parse_model(model: str) -> FakeGpuModel:
    match = _MODEL_RE.match(model)
    if match is None:
        raise _BadSpec(f"{model!r} is not a model like A100-80GB (name, then memory in GB)")
    gib = int(match.group(2))
    if not 1 <= gib <= 1024:
        raise _BadSpec(f"{model!r}: memory must be 1 to 1024 GB")
    known = _KNOWN_MODELS.get(model.upper())
    if known is not None:
        name, nvlink, mib, mig_capable, ecc = known
        return FakeGpuModel(name, mib * MIB, nvlink, (), mig_capable, ecc)
    sxm = "SXM" in model.upper()
    return FakeGpuModel(f"NVIDIA {match.group(1)}", gib * GIB, sxm, (), sxm, True)


def instance_memory(gpu_memory: int, slices: int) -> int:
    """NVML's total for a GPU instance of `slices` compute slices, in bytes (whole MiB)."""
    return MEMORY_SLICES_FOR[slices] * (gpu_memory // MEMORY_SLICES) // MIB * MIB


def parse_mig_layout(value: str, gpu_memory: int) -> tuple[FakeGpuInstance, ...]:
    """GPU instances for a mig= value, checked against 7 compute and 8 memory slices."""
    instances: list[FakeGpuInstance] = []
    for part in value.lower().split("+") if value else [""]:
        instances.append(_parse_instance(part, value, gpu_memory))
    slices = sum(gi.slices for gi in instances)
    if slices > COMPUTE_SLICES:
        raise _BadSpec(f"mig={value!r}: a GPU has 7 compute slices, this asks for {slices}")
    memory = sum(MEMORY_SLICES_FOR[gi.slices] for gi in instances)
    if memory > MEMORY_SLICES:
        raise _BadSpec(f"mig={value!r}: a GPU has 8 memory slices, this asks for {memory}")
    return tuple(instances)


def _parse_instance(part: str, value: str, gpu_memory: int) -> FakeGpuInstance:
    matches = [_PROFILE_RE.match(ci) for ci in part.split("/")]
    if not part or any(m is None for m in matches):
        raise _BadSpec(f"mig={value!r}: expected profiles like 3g.40gb joined by +")
    shapes = {(int(m.group(2)), int(m.group(3))) for m in matches if m is not None}
    if len(shapes) != 1:
        raise _BadSpec(f"mig={value!r}: compute instances joined by / share one GPU instance")
    ((slices, gib),) = shapes
    if slices not in MEMORY_SLICES_FOR:
        raise _BadSpec(f"mig={value!r}: a GPU instance has 1, 2, 3, 4 or 7 compute slices")
    cis = tuple(int(m.group(1) or slices) for m in matches if m is not None)
    if any(c == 0 for c in cis) or sum(cis) > slices or (len(cis) > 1 and slices in cis):
        raise _BadSpec(f"mig={value!r}: compute instances must fit in {slices}g")
    memory = instance_memory(gpu_memory, slices)
    low, high = memory // GIB, math.ceil(memory / GIB)
    if not low <= gib <= high or gib == 0:
        size = f"{low}" if low == high else f"{low} or {high}"
        raise _BadSpec(f"mig={value!r}: {slices}g on this GPU has {memory // MIB} MiB: {size} GB")
    return FakeGpuInstance(slices, gib, memory, cis)


def fake_uuid(prefix: str, node_name: str, path: str) -> str:
    """An NVML-looking UUID (GPU-xxxxxxxx-xxxx-...), fixed for a node and a place in it."""
    return f"{prefix}-{uuid_module.uuid5(_FAKE_NAMESPACE, f'{node_name}/{path}')}"
