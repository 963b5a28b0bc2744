"""The fake NVML library's machine: its GPUs, their MIG layouts now, and the files that drive
them (fake.gpu_state describes the state folder).

FakeGpuBox answers what FakeNvmlLibrary (fake.nvml_library) asks before every call: is NVML
initialised, is the handle valid and current (a MIG layout changed under it), is the GPU lost,
is an error injected for this call; and it reads what the GPUs hold: UUIDs, MIG slices, VRAM
claims, and (as root) the device nodes it makes for them.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

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
    Mismatch,
    cap_minor,
    error_class,
    make_char_device,
    read_claim,
    read_text,
)
from gpuq.agent.gpu.device_paths import NVIDIA_MAJOR, DevicePaths

NVIDIA_CAPS_MAJOR = 237  # a typical dynamic major of nvidia-caps; any value works for tests
NO_ID = 0xFFFFFFFF  # NVML's "not a MIG instance"


@dataclass(frozen=True, slots=True)
class Handle:
    """Opaque, like c_nvmlDevice_t: index of the GPU, and for a MIG slice its place."""

    index: int
    layout: str | None = None  # the MIG layout the slice belongs to; None: the whole GPU
    slot: int = -1  # flattened compute-instance number within the layout
    gi: int = -1  # GPU instance id (1..)
    ci: int = -1  # compute instance id (0..)


@dataclass(frozen=True, slots=True)
class Slice:
    profile: str
    gi: int
    ci: int
    instance: FakeGpuInstance


class FakeGpuBox:
    """The GPUs of one fake node; `running`: NVML is initialised (nvmlInit, nvmlShutdown)."""

    def __init__(self, gpus: list[FakeGpuModel], node_name: str, state_dir: Path | None) -> None:
        self.gpus = gpus
        self.node = node_name
        self.state_dir = state_dir
        self.running = False
        self.uuids = [fake_uuid("GPU", node_name, f"gpu/{i}") for i in range(len(gpus))]
        base = state_dir if state_dir is not None else Path("/nonexistent-gpuq-fake")
        self.device_paths = DevicePaths(
            base / "dev",
            base / "mig-minors",
            base / "pci",
            base / "proc-devices",
            base / "capabilities",
        )

    def check(
        self, call: str, handle: Handle | None, *, whole: bool = False, mig: bool = False
    ) -> None:
        """Raise what NVML would: Uninitialized, GpuIsLost, an injected error, a stale handle."""
        if not self.running:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if handle is not None:
            if not isinstance(handle, Handle) or not 0 <= handle.index < len(self.gpus):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            uuids = {self.uuids[handle.index]}
            if handle.layout is not None:
                uuids.add(self.uuid(handle))
            if self.state_dir is not None and any(
                (self.state_dir / uuid / "lost").exists() for uuid in uuids
            ):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            self.fault(call, uuids)
            if handle.layout is not None:
                if self.layout(handle.index)[0] != handle.layout:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # stale
                if whole:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            elif mig:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        else:
            self.fault(call, None)

    def fault(self, call: str, uuids: set[str] | None) -> None:
        text = read_text(self.file("errors"), keep_case=True)
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

    def file(self, name: str) -> Path:
        return (self.state_dir or Path("/nonexistent-gpuq-fake")) / name

    def unit_file(self, handle: Handle, name: str) -> Path:
        return self.file(self.uuid(handle)) / name

    def uuid(self, handle: Handle) -> str:
        if handle.layout is None:
            return self.uuids[handle.index]
        text = handle.layout
        suffix = "" if text == self.gpus[handle.index].mig_text else f"/{text}"
        return fake_uuid("MIG", self.node, f"gpu/{handle.index}/mig/{handle.slot}{suffix}")

    def layout(self, index: int) -> tuple[str, tuple[FakeGpuInstance, ...]]:
        """The GPU's MIG layout now: its mig file if valid, else the spec's."""
        gpu = self.gpus[index]
        override = read_text(self.file(self.uuids[index]) / "mig")
        if override:
            if override == "off":
                return "", ()
            with contextlib.suppress(_BadSpec):
                return override, parse_mig_layout(override, gpu.memory)
        return gpu.mig_text, gpu.mig

    def slices(self, index: int) -> list[Slice]:
        """The compute instances of the current layout, GI ids from 1, CI ids from 0."""
        return slices_of(self.layout(index)[1])

    def slice(self, handle: Handle) -> Slice:
        return self.slices(handle.index)[handle.slot]

    def total(self, handle: Handle) -> int:
        if handle.layout is None:
            return self.gpus[handle.index].memory
        return self.slice(handle).instance.memory  # every CI reports its whole instance

    def claims(self, handle: Handle, kind: str | None = None) -> list[tuple[int, int, int]]:
        """(pid, bytes, compute instance id) of the claims on a GPU or a slice's GPU instance."""
        if self.state_dir is None:
            return []
        targets: list[tuple[str, int]] = [(self.uuid(handle), NO_ID)]
        if handle.layout is not None:
            targets = [
                (self.uuid(Handle(handle.index, handle.layout, slot, s.gi, s.ci)), s.ci)
                for slot, s in enumerate(self.slices(handle.index))
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

    def socket(self, index: int) -> int:
        switches = math.ceil(len(self.gpus) / 2)
        per_socket = math.ceil(switches / 2)
        return (index // 2) // per_socket

    def write_mig_minors(self) -> None:
        """A mig-minors file in the driver's format, for every GPU, GI id and CI id."""
        if self.state_dir is None or not any(g.mig_capable or g.mig for g in self.gpus):
            return
        lines = []
        for gpu in range(len(self.gpus)):
            for gi in range(1, GI_IDS + 1):
                lines.append(f"gpu{gpu}/gi{gi}/access {cap_minor(gpu, gi, None)}")
                for ci in range(CI_IDS):
                    lines.append(f"gpu{gpu}/gi{gi}/ci{ci}/access {cap_minor(gpu, gi, ci)}")
        with contextlib.suppress(OSError):
            self.state_dir.mkdir(parents=True, exist_ok=True)
            path = self.device_paths.mig_minors
            partial = path.with_name(f".mig-minors.{os.getpid()}")
            partial.write_text("\n".join(lines) + "\n")
            os.replace(partial, path)

    def make_nodes(self, index: int) -> None:
        """What the driver shows of GPU index: its /proc side (proc-devices, each slice's
        capabilities/gpuN/mig/giG[/ciC]/access), and as root its device nodes: dev/nvidiaN
        and, unless `caps-late` exists, the slices' dev/nvidia-caps nodes (which on a real
        machine nvidia-modprobe makes at a slice's first use)."""
        if self.state_dir is None:
            return
        self._write_capabilities(index)
        if os.geteuid() != 0:
            return
        dev = self.device_paths.dev_root
        nodes = [(dev / f"nvidia{index}", NVIDIA_MAJOR, index)]
        if not self.file("caps-late").exists():
            for found in self.slices(index):
                for minor in (
                    cap_minor(index, found.gi, None),
                    cap_minor(index, found.gi, found.ci),
                ):
                    caps = dev / "nvidia-caps" / f"nvidia-cap{minor}"
                    nodes.append((caps, NVIDIA_CAPS_MAJOR, minor))
        for path, major, minor in nodes:
            make_char_device(path, major, minor)

    def _write_capabilities(self, index: int) -> None:
        """The driver's /proc view of GPU index's MIG capabilities (read-only mode 0444)."""
        with contextlib.suppress(OSError):
            devices = self.device_paths.proc_devices
            if not devices.exists():
                devices.write_text(
                    f"{NVIDIA_MAJOR} nvidia-frontend\n{NVIDIA_CAPS_MAJOR} nvidia-caps\n"
                )
            for found in self.slices(index):
                for ci in (None, found.ci):
                    folder = (
                        self.device_paths.capabilities / f"gpu{index}" / "mig" / f"gi{found.gi}"
                    )
                    folder = folder / f"ci{ci}" if ci is not None else folder
                    folder.mkdir(parents=True, exist_ok=True)
                    minor = cap_minor(index, found.gi, ci)
                    text = f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
                    (folder / "access").write_text(text)


def slices_of(layout: tuple[FakeGpuInstance, ...]) -> list[Slice]:
    """The compute instances of a MIG layout, GI ids from 1, CI ids from 0."""
    slices: list[Slice] = []
    for gi, instance in enumerate(layout, start=1):
        for ci, profile in enumerate(instance.unit_profiles()):
            slices.append(Slice(profile, gi, ci, instance))
    return slices
