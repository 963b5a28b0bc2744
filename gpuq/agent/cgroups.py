"""One job's memory cgroup, on cgroup v2 or v1, or None when no usable one exists.

A cgroup limit is enforced by the kernel at allocation time and its counters see every page the
job touches, so it beats polling RSS; polling is only the fallback. The caller treats None as
"poll instead" and says nothing: a non-root agent or a machine without a memory controller is a
normal setup, not an error.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

from gpuq.agent.proctree import read_proc

_MOUNTS = "/proc/self/mounts"


@functools.cache
def memory_hierarchy() -> tuple[Path, int] | None:
    """(mount point, version) of the hierarchy with the memory controller, v2 preferred.

    Cached: the fork server calls it once before forking, so supervisors pay nothing.
    """
    v1: Path | None = None
    try:
        with open(_MOUNTS, encoding="utf-8") as fh:
            mounts = [line.split() for line in fh]
    except OSError:
        return None
    for fields in mounts:
        if len(fields) < 4:
            continue
        mount_point, fstype, options = Path(fields[1]), fields[2], fields[3].split(",")
        if fstype == "cgroup2" and _has_v2_memory(mount_point):
            return mount_point, 2
        if fstype == "cgroup" and "memory" in options:
            v1 = mount_point
    return (v1, 1) if v1 is not None else None


def _has_v2_memory(mount_point: Path) -> bool:
    try:
        return "memory" in (mount_point / "cgroup.controllers").read_text().split()
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class MemoryCgroup:
    path: Path
    version: int

    @classmethod
    def create(cls, job_id: int, parent: str | None, limit: int) -> MemoryCgroup | None:
        """Make `<hierarchy>/<parent or gpuq>/job_<id>` limited to `limit` bytes, or None."""
        if os.geteuid() != 0:
            return None
        found = memory_hierarchy()
        if found is None:
            return None
        root, version = found
        group_parent = root / (parent or "gpuq").strip("/")
        try:
            group_parent.mkdir(parents=True, exist_ok=True)
            if version == 2:
                _enable_memory_below(root, group_parent)
            path = group_parent / f"job_{job_id}"
            with contextlib.suppress(OSError):
                path.rmdir()  # an empty leftover of an earlier run of this job
            path.mkdir(exist_ok=True)
            group = cls(path, version)
            group._set_limit(limit)
        except OSError:
            return None
        return group

    def _set_limit(self, limit: int) -> None:
        if self.version == 2:
            (self.path / "memory.max").write_text(str(limit))
            # no swap: the limit means RAM, as SLURM's --mem does, and an OOM is not a slow crawl
            _write_optional(self.path / "memory.swap.max", "0")
        else:
            (self.path / "memory.limit_in_bytes").write_text(str(limit))
            _write_optional(self.path / "memory.memsw.limit_in_bytes", str(limit))

    def open_procs(self) -> int:
        """A CLOEXEC fd of cgroup.procs: the job's child writes its own pid there before exec."""
        return os.open(self.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)

    def pids(self) -> list[int]:
        """The processes in the group now; [] once it is gone."""
        return [int(word) for word in read_proc(f"{self.path}/cgroup.procs").split()]

    def oom_kills(self) -> int:
        """How many processes of the group the kernel's OOM killer has killed."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            text = (self.path / name).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def peak(self) -> int:
        """The group's highest memory use in bytes (0 where the kernel does not keep it)."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    def remove(self, timeout: float = 2.0) -> bool:
        """rmdir the group; retried briefly because the kernel frees it just after the last exit."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.path.rmdir()
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.01)


def _enable_memory_below(root: Path, group_parent: Path) -> None:
    """Turn the memory controller on for children of every level from `root` to `group_parent`."""
    level = root
    for part in group_parent.relative_to(root).parts:
        _write_optional(level / "cgroup.subtree_control", "+memory")
        level = level / part
    _write_optional(level / "cgroup.subtree_control", "+memory")


def _write_optional(path: Path, value: str) -> None:
    with contextlib.suppress(OSError):
        path.write_text(value)
