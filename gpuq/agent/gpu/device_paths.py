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

The driver does not make the capability nodes: nvidia-modprobe does, when a CUDA program (or
nvidia-smi) first uses a slice, so after a fresh MIG layout they are missing and the slices
could not be isolated. A root agent makes a missing one the way nvidia-modprobe does
(make_caps_node): the minor from /proc/driver/nvidia/capabilities/gpuN/mig/giG[/ciC]/access
("DeviceFileMinor"), its mode from there ("DeviceFileMode"), the major of "nvidia-caps" in
/proc/devices. Every path is under DevicePaths, so the fakes model nodes that appear late.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuq.agent.jobs import isolation

log = logging.getLogger(__name__)

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
    proc_devices: Path = Path("/proc/devices")  # "237 nvidia-caps": the caps nodes' major
    capabilities: Path = Path("/proc/driver/nvidia/capabilities")  # gpuN/mig/giG/ciC/access
    make_caps: bool = True  # make missing caps nodes as root (False: only look, the doctor)


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


def caps_major(proc_devices: Path) -> int | None:
    """The character major the kernel gave "nvidia-caps" (/proc/devices), None if unlisted."""
    try:
        text = proc_devices.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[1] == "nvidia-caps" and words[0].isdigit():
            return int(words[0])
    return None


def caps_access(capabilities: Path, gpu_minor: int, gi: int, ci: int | None) -> tuple[int, int]:
    """(DeviceFileMinor, DeviceFileMode) of a slice's access capability; ValueError if unread."""
    path = capabilities / f"gpu{gpu_minor}" / "mig" / f"gi{gi}"
    path = (path / f"ci{ci}" if ci is not None else path) / "access"
    try:
        fields = dict(line.split(":", 1) for line in path.read_text().splitlines() if ":" in line)
        return int(fields["DeviceFileMinor"]), int(fields.get("DeviceFileMode", "292"))
    except (OSError, KeyError, ValueError) as error:
        raise ValueError(f"{path}: {error}") from error


def make_caps_nodes(paths: DevicePaths, gpu_minor: int, gi: int, ci: int) -> None:
    """As root, make the slice's missing /dev/nvidia-caps access nodes as nvidia-modprobe would
    (root-owned, the capability's mode); logs what it cannot make and leaves that missing."""
    major = caps_major(paths.proc_devices)
    if major is None or os.geteuid() != 0:
        return
    for level in (None, ci):
        try:
            minor, mode = caps_access(paths.capabilities, gpu_minor, gi, level)
        except ValueError as unread:
            log.warning("MIG capability of gpu%d gi%d: %s", gpu_minor, gi, unread)
            continue
        node = paths.dev_root / "nvidia-caps" / f"nvidia-cap{minor}"
        if node.exists():
            continue
        try:
            node.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            os.mknod(node, stat.S_IFCHR | (mode & 0o777), os.makedev(major, minor))
            os.chmod(node, mode & 0o777)  # mknod's mode is masked by the umask
        except FileExistsError:
            continue
        except OSError as error:
            log.warning("cannot make %s (MIG slice isolation): %s", node, error)
            continue
        log.info("made %s (%d:%d) for MIG gpu%d gi%d", node, major, minor, gpu_minor, gi)


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
