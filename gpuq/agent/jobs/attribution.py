"""Which job a process belongs to: by its cgroup, never by what is in its environment.

A job can set GPUQ_JOB_ID (or anything else) in its environment, so the environment proves
nothing. Every job's processes live in the job's own cgroup (`<parent>/job_<id>`, or
`job_<id>.<n>` for a second start whose first has not left yet), which a job cannot leave
without root. Where the agent cannot make cgroups (not root), a process belongs to the job
whose supervisor it descends from; one that daemonised away from it belongs to nobody.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from gpuq.agent.jobs.process_tree import read_proc

_JOB_GROUP_RE = re.compile(r"/job_(\d+)(?:\.\d+)?/?$")
_MAX_ANCESTRY = 64  # a parent chain longer than this is not a job's


def job_of_cgroup_text(text: str, parent: str) -> int | None:
    """The job whose group a /proc/PID/cgroup text names (any hierarchy), or None.

    Only groups directly under the agent's parent count: `/gpuq/job_7` for parent "gpuq", so
    another installation's (or a user's own) `job_7` group elsewhere is not mistaken for one.
    """
    prefix = "/" + parent.strip("/") + "/"
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if not path.startswith(prefix):
            at = path.find(prefix)  # v2 under a delegated subtree: .../gpuq-agent/gpuq/job_7
            if at < 0:
                continue
            path = path[at:]
        rest = path[len(prefix) - 1 :]
        match = _JOB_GROUP_RE.fullmatch(rest)
        if match is not None:
            return int(match.group(1))
    return None


def parent_pid(pid: int) -> int | None:
    """The parent of pid from /proc, None when it is gone."""
    stat = read_proc(f"/proc/{pid}/stat")
    if not stat:
        return None
    fields = stat.rpartition(b")")[2].split()
    return int(fields[1]) if len(fields) > 1 else None


def process_name(pid: int) -> str:
    """The command name of pid (comm), "exited" when it is gone."""
    name = read_proc(f"/proc/{pid}/comm").decode("utf-8", "replace").strip()
    return name or "exited"


class JobOfProcess:
    """Finds the job of a process: by cgroup, else by ancestry to a job's supervisor."""

    def __init__(self, cgroup_parent: str) -> None:
        self.cgroup_parent = cgroup_parent or "gpuq"

    def __call__(self, pid: int, supervisors: Mapping[int, int]) -> int | None:
        """supervisors: supervisor pid -> its job id (for machines without job cgroups)."""
        text = read_proc(f"/proc/{pid}/cgroup").decode("utf-8", "replace")
        found = job_of_cgroup_text(text, self.cgroup_parent)
        if found is not None or not supervisors:
            return found
        current: int | None = pid
        for _ in range(_MAX_ANCESTRY):
            if current is None or current <= 1:
                return None
            if current in supervisors:
                return supervisors[current]
            current = parent_pid(current)
        return None


def pid_alive(pid: int) -> bool:
    """Whether pid exists (a zombie counts as gone: its GPU context is released)."""
    stat = read_proc(f"/proc/{pid}/stat")
    if not stat:
        return False
    state = stat.rpartition(b")")[2].split()[:1]
    return state not in ([b"Z"], [b"X"]) and os.path.exists(f"/proc/{pid}")
