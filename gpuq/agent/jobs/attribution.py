"""Which job a process belongs to: by its cgroup, never by what is in its environment.

A job can set GPUQ_JOB_ID (or anything else) in its environment, so the environment proves
nothing. Every job's processes live in the job's own cgroup (`<parent>/job_<id>`, or
`job_<id>.<n>` for a second start whose first has not left yet), which a job cannot leave
without root. Where the agent cannot make cgroups (not root), a process belongs to the job
whose supervisor it descends from; one that daemonised away from it belongs to nobody.

A container a job starts through a system daemon (docker, containerd, CRI-O) runs in the
daemon's cgroup, not the job's, and so belongs to no job (rootless podman keeps its containers
in the job's cgroup: those are the job's). container_of_cgroup_text names such a process's
container, so that the agent flags it but never kills it as foreign: it may be a job's own, and
killing it would kill the job's work (gpu.handover_watch).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from gpuq.agent.jobs.process_tree import read_proc

_JOB_GROUP_RE = re.compile(r"/job_(\d+)(?:\.\d+)?/?$")
# a container runtime's cgroups, systemd's and cgroupfs's layouts: (regex, the runtime's name)
_CONTAINER_GROUPS = (
    (re.compile(r"(?:/docker-|/docker/)([0-9a-f]{12,64})(?:\.scope)?(?:/|$)"), "docker"),
    (re.compile(r"/libpod-(?:conmon-)?([0-9a-f]{12,64})(?:\.scope)?(?:/|$)"), "podman"),
    (re.compile(r"/cri-containerd-([0-9a-f]{12,64})\.scope(?:/|$)"), "containerd"),
    (re.compile(r"/crio-(?:conmon-)?([0-9a-f]{12,64})\.scope(?:/|$)"), "cri-o"),
    (re.compile(r"/kubepods\b.*/([0-9a-f]{12,64})$"), "kubernetes"),
    (re.compile(r"/containerd/([^/]+)$"), "containerd"),
    (re.compile(r"/lxc(?:\.payload\.|/)([^/]+)"), "lxc"),
)
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


def container_of_cgroup_text(text: str) -> str:
    """ "docker container 3f2a1b4c5d6e" when a /proc/PID/cgroup text (any hierarchy) puts the
    process in a container runtime's group; "" otherwise."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1].rstrip("/")
        for pattern, runtime in _CONTAINER_GROUPS:
            match = pattern.search(path)
            if match is not None:
                return f"{runtime} container {match.group(1)[:12]}"
    return ""


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
    """Finds the job of a process: by cgroup, else by ancestry to a job's supervisor.

    proc: where /proc is (tests point it at a fake tree of PID/cgroup files)."""

    def __init__(self, cgroup_parent: str, proc: str = "/proc") -> None:
        self.cgroup_parent = cgroup_parent or "gpuq"
        self.proc = proc
        self._own_container = ""
        # an agent that itself runs in a container sees its own container's group everywhere
        self._own_container = self.container(os.getpid()) if proc == "/proc" else ""

    def __call__(self, pid: int, supervisors: Mapping[int, int]) -> int | None:
        """supervisors: supervisor pid -> its job id (for machines without job cgroups)."""
        text = read_proc(f"{self.proc}/{pid}/cgroup").decode("utf-8", "replace")
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

    def container(self, pid: int) -> str:
        """The container runtime's container pid runs in ("docker container 3f2a..."), "" for
        none (or the agent's own container)."""
        text = read_proc(f"{self.proc}/{pid}/cgroup").decode("utf-8", "replace")
        found = container_of_cgroup_text(text)
        return "" if found == self._own_container else found


def pid_alive(pid: int) -> bool:
    """Whether pid exists (a zombie counts as gone: its GPU context is released)."""
    stat = read_proc(f"/proc/{pid}/stat")
    if not stat:
        return False
    state = stat.rpartition(b")")[2].split()[:1]
    return state not in ([b"Z"], [b"X"]) and os.path.exists(f"/proc/{pid}")
