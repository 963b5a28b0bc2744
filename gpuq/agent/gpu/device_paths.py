"""Where a unit lives on the host: its device nodes (for cgroup rules) and its nearby CPUs.

Pure functions plus the DevicePaths a backend reads them from. The NVIDIA driver makes one
character device per GPU, /dev/nvidiaN, with N the GPU's minor number (nvmlDeviceGetMinorNumber),
major 195. A MIG slice is reached through its parent's node plus two capability nodes under
/dev/nvidia-caps: the GPU instance's and the compute instance's "access" capability. Their minor
numbers are listed in /proc/driver/nvidia-caps/mig-minors, one per line:

    gpu0/gi1/access 12
    gpu0/gi1/ci0/access 13

where gpuN is the parent's minor number and the GI/CI ids are those NVML reports for the MIG
handle (nvmlDeviceGetGpuInstanceId / nvmlDeviceGetComputeInstanceId).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuq.agent.jobs import isolation

NVIDIA_MAJOR = 195  # the driver's fixed character major for /dev/nvidiaN and nvidiactl

_MIG_MINOR_RE = re.compile(r"^gpu(\d+)/gi(\d+)(?:/ci(\d+))?/access\s+(\d+)\s*$")


@dataclass(frozen=True, slots=True)
class DevicePaths:
    """Where the backend looks for device nodes, MIG capability minors and PCI sysfs.

    The real library uses the defaults; the fake NVML library points them into its state_dir.
    """

    dev_root: Path = Path("/dev")
    mig_minors: Path = Path("/proc/driver/nvidia-caps/mig-minors")
    pci_devices: Path = Path("/sys/bus/pci/devices")


# (gpu minor, gpu instance id, compute instance id or None for the GI's own node) -> cap minor
MigMinors = Mapping[tuple[int, int, int | None], int]


def parse_mig_minors(text: str) -> dict[tuple[int, int, int | None], int]:
    """The access-capability minors in a mig-minors file; other lines (config, monitor) skipped."""
    minors: dict[tuple[int, int, int | None], int] = {}
    for line in text.splitlines():
        match = _MIG_MINOR_RE.match(line.strip())
        if match is None:
            continue
        gpu, gi, ci, minor = match.groups()
        minors[(int(gpu), int(gi), int(ci) if ci is not None else None)] = int(minor)
    return minors


def gpu_device_node(dev_root: Path, minor: int) -> str:
    """/dev/nvidiaN for a GPU whose minor number is N."""
    return str(dev_root / f"nvidia{minor}")


def mig_device_nodes(
    dev_root: Path, minors: MigMinors, gpu_minor: int, gi: int, ci: int
) -> tuple[str, ...]:
    """The parent's node and the slice's GI and CI capability nodes; () if a minor is unknown.

    Without both capability minors the slice cannot be isolated, and a partial rule would let
    the job see nothing at all, so nothing is returned and the node reports isolation advisory.
    """
    gi_minor = minors.get((gpu_minor, gi, None))
    ci_minor = minors.get((gpu_minor, gi, ci))
    if gi_minor is None or ci_minor is None:
        return ()
    caps = dev_root / "nvidia-caps"
    return (
        gpu_device_node(dev_root, gpu_minor),
        str(caps / f"nvidia-cap{gi_minor}"),
        str(caps / f"nvidia-cap{ci_minor}"),
    )


def cpus_from_affinity(words: Iterable[int], word_bits: int = 64) -> tuple[int, ...]:
    """CPU numbers set in nvmlDeviceGetCpuAffinity's bitmask (word 0 holds CPUs 0-63)."""
    cpus: list[int] = []
    for index, word in enumerate(words):
        value = int(word)
        bit = 0
        while value:
            if value & 1:
                cpus.append(index * word_bits + bit)
            value >>= 1
            bit += 1
    return tuple(cpus)


def affinity_words(cpus: Iterable[int], words: int, word_bits: int = 64) -> list[int]:
    """The inverse of cpus_from_affinity: a bitmask of `words` words (the fake library's)."""
    mask = [0] * words
    for cpu in cpus:
        if 0 <= cpu < words * word_bits:
            mask[cpu // word_bits] |= 1 << (cpu % word_bits)
    return mask


def parse_cpulist(text: str) -> tuple[int, ...]:
    """CPUs in a kernel cpulist ("0-3,8-11"); () for anything malformed (unknown, not none)."""
    try:
        return isolation.parse_cpulist(text)
    except ValueError:
        return ()


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's 00000000:1B:00.0 as sysfs spells it: 0000:1b:00.0 (4-digit domain, lowercase)."""
    domain, _, rest = bus_id.partition(":")
    if not rest:
        return bus_id.lower()
    return f"{domain[-4:].rjust(4, '0')}:{rest}".lower()


def sysfs_local_cpus(pci_devices: Path, bus_id: str) -> tuple[int, ...]:
    """The CPUs sysfs names as local to a PCI device; () when unknown."""
    try:
        text = (pci_devices / sysfs_bus_id(bus_id) / "local_cpulist").read_text()
    except OSError:
        return ()
    return parse_cpulist(text)


def online_cpus() -> tuple[int, ...]:
    """This machine's online CPUs (sysfs), else the ones this process may run on."""
    try:
        found = parse_cpulist(Path("/sys/devices/system/cpu/online").read_text())
    except OSError:
        found = ()
    if found:
        return found
    import os

    return tuple(sorted(os.sched_getaffinity(0)))
