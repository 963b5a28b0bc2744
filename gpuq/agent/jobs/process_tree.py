"""Reading processes from /proc: what the agent needs to tell a live supervisor from a dead one.

The supervisor (gpuq/agent/native) does its own process work in C; these are the few reads the
Python side makes: whether a supervisor recorded in a job folder still runs, and (for tests and
benchmarks) what runs below a process. Plain os calls, no file objects: cheap when called often.
"""

from __future__ import annotations

import os

_PF_EXITING = 0x4  # task flag (stat field 9): the process is in exit


def read_proc(path: str) -> bytes:
    """A /proc or /sys file's content, b"" when it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return b""
    finally:
        os.close(fd)


def children_of(pid: int) -> list[int]:
    """Direct children of `pid` (all its threads' children); [] when it is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tids:
        found.extend(int(word) for word in read_proc(f"/proc/{pid}/task/{tid}/children").split())
    return found


def descendants(root: int) -> list[int]:
    """Every process below `root`, depth first."""
    found: list[int] = []
    stack = children_of(root)
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children_of(pid))
    return found


def has_exited(pid: int) -> bool:
    """True when `pid` is gone, a zombie, or already in exit (PF_EXITING)."""
    stat = read_proc(f"/proc/{pid}/stat")
    if not stat:
        return True
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0] in (b"Z", b"X", b"x") or bool(int(fields[6]) & _PF_EXITING)


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot: with the pid, a unique identity."""
    stat = read_proc(f"/proc/{pid}/stat")
    if not stat:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19])  # field 22 of stat; fields[0] here is field 3


def processes_of_job(
    pgid: int | None, cgroup: str | None, marker: tuple[str, str] | None
) -> set[int]:
    """The live processes of a job whose supervisor is gone: members of its process group
    `pgid`, of its `cgroup` folder, and (`marker`: job id and node) those whose environment
    has GPUQ_JOB_ID and GPUQ_NODE set to them. Never this process."""
    found: set[int] = set()
    if cgroup:
        found.update(int(word) for word in read_proc(f"{cgroup}/cgroup.procs").split())
    wanted = (
        {b"GPUQ_JOB_ID=" + marker[0].encode(), b"GPUQ_NODE=" + marker[1].encode()}
        if marker is not None
        else None
    )
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in found:
            continue
        stat = read_proc(f"/proc/{pid}/stat")
        if not stat:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        in_group = pgid is not None and int(fields[2]) == pgid
        if in_group or (wanted is not None and wanted <= _environment(pid)):
            found.add(pid)
    found.discard(os.getpid())
    return {pid for pid in found if not has_exited(pid)}


def _environment(pid: int) -> set[bytes]:
    return set(read_proc(f"/proc/{pid}/environ").split(b"\0"))
