"""What a job may touch besides its own GPUs: device rules and CPUs (issue 10, items 6 and 8).

Pure functions, except `device_numbers`, which asks the file system (agent side). The
supervisor enforces what these compute (gpuq/agent/native: devices.deny on cgroup v1, a
BPF_PROG_TYPE_CGROUP_DEVICE program on v2, the cpuset controller or sched_setaffinity).

Device rules deny, they do not allow: a job loses the GPU device nodes of the units it was not
given and keeps everything else, like SLURM's ConstrainDevices. The NVIDIA control nodes
(`nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`, `nvidia-modeset`) are never in a unit's device
list, so every job keeps them: CUDA needs them to start at all. Which nodes a unit has (its
/dev/nvidiaN, a MIG slice's /dev/nvidia-caps nodes) is gpuq.agent.gpu.device_paths' business.
"""

from __future__ import annotations

import logging
import os
import select
import stat
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TextIO

from gpuq.domain.array_specs import format_runs

log = logging.getLogger(__name__)

MOUNTS = "/proc/self/mounts"
DeviceNumber = tuple[str, int, int]  # ("c" or "b", major, minor)

# the nodes every CUDA process opens, whatever GPUs it uses: never denied
CONTROL_NODES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)


def device_numbers(
    paths: Iterable[str], problems: list[str] | None = None
) -> tuple[DeviceNumber, ...]:
    """The (type, major, minor) of each path that is a device node, in order, without repeats.

    A path that is missing or not a character or block device is skipped: it is logged, and
    said in `problems` when given (the agent reports the node's isolation as partial)."""
    found: list[DeviceNumber] = []
    for path in paths:
        try:
            mode = os.stat(path)
        except OSError as error:
            _skip(problems, f"{path}: {error.strerror or error}")
            continue
        if stat.S_ISCHR(mode.st_mode):
            kind = "c"
        elif stat.S_ISBLK(mode.st_mode):
            kind = "b"
        else:
            _skip(problems, f"{path}: not a device node")
            continue
        number = (kind, os.major(mode.st_rdev), os.minor(mode.st_rdev))
        if number not in found:
            found.append(number)
    return tuple(found)


def _skip(problems: list[str] | None, problem: str) -> None:
    log.warning("device isolation: skipping %s", problem)
    if problems is not None:
        problems.append(problem)


def device_rules(
    all_devices: Mapping[str, tuple[DeviceNumber, ...]], job_units: Iterable[str]
) -> tuple[str, ...]:
    """The rules ("c 195:1") that deny a job every unit's device it was not given.

    deny = (the union of all units' devices) - (the union of the job's units' devices): a MIG
    slice shares its parent's /dev/nvidiaN with its sibling slices, so a job holding one slice
    keeps that node even while a sibling slice (not the job's) lists it too. Sorted, so the
    same allocation always gives the same rules."""
    keep = {number for unit in job_units for number in all_devices.get(unit, ())}
    deny = {number for numbers in all_devices.values() for number in numbers} - keep
    return tuple(f"{kind} {major}:{minor}" for kind, major, minor in sorted(deny))


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Parse the kernel's cpulist format: "0-3,8" -> (0, 1, 2, 3, 8), sorted, no repeats."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, dash, last = part.partition("-")
        low = int(first)
        high = int(last) if dash else low
        if low < 0 or high < low:
            raise ValueError(f"bad cpulist range {part!r}")
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """(0, 1, 2, 3, 8) -> "0-3,8"; "" for none."""
    return format_runs(cpus)


def choose_cpus(
    count: int,
    online: Sequence[int],
    busy: Collection[int],
    near: Sequence[int],
    load: Mapping[int, int] | None = None,
) -> tuple[int, ...]:
    """`count` CPUs for a job, sorted. The rule, in order:

    1. free CPUs (online, not in `busy`) near the job's GPUs (`near`: the GPUs' NUMA node CPUs,
       from NVML's CPU affinity or sysfs local_cpulist), lowest numbers first;
    2. then other free CPUs, lowest first;
    3. if that is still not enough (the node is over-committed), busy CPUs so that the job
       still starts: the least loaded first (`load`: how many jobs hold each CPU; without it
       every busy CPU counts as 1), near ones before far ones at equal load, then by number.

    Never more than the online CPUs: a job asking for more gets them all. `count` <= 0: none."""
    if count <= 0:
        return ()
    online_set = set(online)
    near_set = set(near) & online_set
    free = [cpu for cpu in sorted(online_set) if cpu not in busy]
    chosen = [cpu for cpu in free if cpu in near_set][:count]
    chosen += [cpu for cpu in free if cpu not in near_set][: count - len(chosen)]
    if len(chosen) < count:
        loads = load or {}
        rest = sorted(
            (cpu for cpu in online_set if cpu not in chosen),
            key=lambda cpu: (loads.get(cpu, 1), cpu not in near_set, cpu),
        )
        chosen += rest[: count - len(chosen)]
    return tuple(sorted(chosen))


def device_cgroup_kind(mounts: str, prefer: str | None = None) -> str:
    """How the supervisor will enforce device rules on this machine, chosen as it chooses
    (gpuq/agent/native/cgroups.c): the v1 devices controller, else a v2 device program; on a
    machine with both, GPUQ_DEVICE_CGROUP=v2 picks the program."""
    prefer = os.environ.get("GPUQ_DEVICE_CGROUP") if prefer is None else prefer
    v1 = v2 = False
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        if fields[2] == "cgroup2":
            v2 = True
        elif fields[2] == "cgroup" and "devices" in fields[3].split(","):
            v1 = True
    if v1 and not (v2 and prefer == "v2"):
        return "devices cgroup v1"
    if v2:
        return "cgroup v2 device program"
    return "advisory: no devices cgroup on this machine (neither v1 devices nor cgroup2)"


ENFORCED = ("devices cgroup v1", "cgroup v2 device program")


class DeviceLoads:
    """What jobs' device rules really did, for the node's claim (gpuq nodes).

    The claim from the mounts alone (device_cgroup_kind) says what the supervisor will try; a
    load or attach that fails (a kernel without BPF cgroup support, a memlock limit, a seccomp
    or LSM refusal) would leave it claiming isolation no job got. So a job whose rules failed
    makes the node's isolation advisory, with the reason, from the next heartbeat on, until a
    later job's rules apply. The job itself still runs (its own isolation says "advisory: ..."):
    failing every GPU job of a node whose kernel refuses the program would turn it into a
    black hole for the queue, while an honest advisory node is shown as such and the admin
    sees why."""

    def __init__(self) -> None:
        self.failure = ""  # the last failure's reason ("": the last rules applied, or none yet)
        self.job_id = 0  # whose rules failed

    def seen(self, job_id: int, isolation: str) -> bool:
        """A job's isolation as its supervisor reported it; True when the claim changed."""
        if isolation.startswith("advisory"):
            failure = isolation.partition(":")[2].strip() or isolation
        elif isolation in ENFORCED:
            failure = ""
        else:
            return False  # "none: no device to deny": says nothing about loads
        changed = failure != self.failure
        self.failure, self.job_id = failure, job_id
        if changed and failure:
            log.warning("device rules of job %d failed: %s", job_id, failure)
        elif changed:
            log.info("device rules apply again (job %d)", job_id)
        return changed

    def claim(self, kind: str) -> str:
        """The node's isolation: `kind` (from the mounts) unless the last job's rules failed."""
        if self.failure and not kind.startswith("advisory"):
            return f"advisory: device rules failed for job {self.job_id}: {self.failure}"
        return kind


class MountTable:
    """The text of /proc/self/mounts, read again only when a mount or unmount changed it (the
    kernel signals that to poll() on the open file). The node's isolation claim goes with every
    heartbeat, and so with every message that carries ends: a read costs ~36 us, a poll ~2."""

    def __init__(self, path: str = MOUNTS) -> None:
        self.path = path
        self._file: TextIO | None = None  # kept open: the poll is on it
        self._poll = select.poll()
        self._text: str | None = None

    def text(self) -> str:
        if self._file is None:
            self._file = open(self.path, errors="replace")  # noqa: SIM115 (kept open)
            self._poll.register(self._file, select.POLLPRI | select.POLLERR)
        if self._text is None or self._poll.poll(0):
            self._file.seek(0)
            self._text = self._file.read()
        return self._text
