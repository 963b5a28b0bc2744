"""The delegated cgroup v2 subtree that holds a node's job cgroups (issue 24).

On a systemd host a process may only manage the cgroups below a unit that systemd delegated to
it (Delegate=); every level above belongs to systemd, which rewrites them at will. `gpuq admin
install` writes gpuq-jobs.service (`sleep infinity`, `Delegate=cpuset memory pids`) and
`[agent] cgroup_parent = "system.slice/gpuq-jobs.service"`: that unit's cgroup R holds every
job's group, R/<installation key>/job_<id>. (Not the agent's own unit: before systemd 254 a
delegated unit whose cgroup has controllers enabled cannot start a new main process while
processes remain below it, and the agent's KillMode=process keeps jobs there by design; SLURM
keeps its steps in slurmstepd.scope apart from slurmd.service for the same reason.)

The agent prepares R once at start and again whenever R was made anew (the jobs unit
restarted), checked before each launch with two reads of tiny files:

1. delegation: systemd >= 251 marks a delegated cgroup with the xattr trusted.delegate = "1";
   yes, no, or unknown (an older systemd, a file system without trusted xattrs);
2. the no-internal-process rule: a cgroup with processes of its own cannot enable domain
   controllers (memory, pids) for its children, so the unit's `sleep` moves to the leaf
   R/holder;
3. +memory, +pids, +cpuset in R's cgroup.subtree_control, each written on its own so that a
   controller the host lacks fails alone; which took is remembered.

The supervisor then enables controllers only at R and below (the launch spec's
cgroup_delegated), never above. Hosts without systemd keep a cgroup_parent made from the
mount down; on cgroup v1 (or a hybrid host, whose memory controller is v1's) nothing here
applies: systemd mirrors the unit into the v1 hierarchies and no holder is needed.

Pure decisions (`plan`) are apart from the file system work (`prepare`, `JobSubtree`), and
every path is under a root given by the caller, so tests use a fake tree.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

UNIT_SUFFIXES = (".service", ".scope")
DELEGATE_XATTR = "trusted.delegate"
HOLDER = "holder"  # the leaf that takes the unit's own processes
CONTROLLERS = ("memory", "pids", "cpuset")  # what a job's group uses, in this order
NOT_DELEGATED = (
    "job cgroups outside a delegated subtree: run gpuq admin install, or set cgroup_parent "
    "to a unit with Delegate="
)


def names_unit(cgroup_parent: str) -> bool:
    """Whether cgroup_parent is a systemd unit's cgroup (its last part ends in .service or
    .scope), e.g. system.slice/gpuq-jobs.service."""
    last = cgroup_parent.strip("/").rsplit("/", 1)[-1]
    return last.endswith(UNIT_SUFFIXES)


def v2_mount(mounts: str) -> Path | None:
    """The first cgroup2 mount in /proc/self/mounts' text (the supervisor takes the same)."""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def read_words(path: Path) -> tuple[str, ...]:
    """The words of a cgroup file (cgroup.controllers, cgroup.subtree_control); () if none."""
    try:
        return tuple(path.read_text().split())
    except OSError:
        return ()


def delegation(folder: Path) -> bool | None:
    """Whether systemd delegated `folder` (trusted.delegate = "1"); None where that cannot be
    told: an xattr the file system does not support (systemd before 251 sets none either)."""
    try:
        return os.getxattr(folder, DELEGATE_XATTR) == b"1"
    except OSError as error:
        if error.errno == errno.ENODATA:
            return False
        return None


def move_to_holder(folder: Path) -> int:
    """Move every process of `folder`'s own cgroup.procs into folder/holder (made if needed):
    a cgroup with processes of its own cannot give its children domain controllers. How many
    moved; a process that exits meanwhile is skipped."""
    pids = read_words(folder / "cgroup.procs")
    if not pids:
        return 0
    holder = folder / HOLDER
    holder.mkdir(exist_ok=True)
    moved = 0
    for pid in pids:
        try:
            (holder / "cgroup.procs").write_text(pid)
            moved += 1
        except ProcessLookupError:
            continue
    return moved


def enable(folder: Path, controllers: tuple[str, ...]) -> tuple[str, ...]:
    """Write +<controller> to folder's cgroup.subtree_control, one at a time (one the host
    lacks, or that the unit's delegation leaves out, fails alone); those that took (the kernel
    refuses a write that does not: ENOENT, EBUSY, EPERM)."""
    control = folder / "cgroup.subtree_control"
    took = []
    for name in controllers:
        try:
            control.write_text(f"+{name}")
        except OSError as error:
            log.debug("cannot enable %s in %s: %s", name, folder, error)
            continue
        took.append(name)
    return tuple(took)


@dataclass(frozen=True, slots=True)
class Subtree:
    """What preparing the delegated subtree found and did."""

    path: Path
    delegated: bool | None  # None: cannot tell (no trusted.delegate support)
    enabled: tuple[str, ...]  # the controllers on for its children
    moved: int = 0  # processes moved into its holder
    problem: str = ""  # why jobs are not isolated as they should be there ("": they are)


def prepare(folder: Path, controllers: tuple[str, ...] = CONTROLLERS) -> Subtree:
    """Delegation, the holder move and the controllers of `folder` (a unit's cgroup)."""
    if not folder.is_dir():
        return Subtree(folder, None, (), problem=f"{folder} does not exist (is its unit running?)")
    delegated = delegation(folder)
    try:
        moved = move_to_holder(folder)
    except OSError as error:
        moved = 0
        log.warning("cannot move the processes of %s into %s: %s", folder, HOLDER, error)
    enabled = enable(folder, controllers)
    problem = ""
    if delegated is False:
        problem = NOT_DELEGATED
    elif "memory" in controllers and "memory" not in enabled:
        problem = f"the memory controller cannot be enabled in {folder}"
    return Subtree(folder, delegated, enabled, moved, problem)


def needs_prepare(subtree: Subtree) -> bool:
    """Whether the subtree was made anew since it was prepared (its unit restarted: its main
    process is back in its own cgroup.procs, its subtree_control is empty). Two small reads."""
    if read_words(subtree.path / "cgroup.procs"):
        return True
    on = set(read_words(subtree.path / "cgroup.subtree_control"))
    return not set(subtree.enabled) <= on


@dataclass(frozen=True, slots=True)
class Plan:
    """What the agent does with its cgroup_parent on this host."""

    subtree: Path | None  # the delegated subtree to prepare; None: nothing to prepare
    relative: str | None  # the launch spec's cgroup_delegated
    warning: str = ""  # logged once at start; also the node's isolation problem


def plan(cgroup_parent: str, mounts: str, *, root: bool, systemd: bool, memory_on_v2: bool) -> Plan:
    """Pure: where job cgroups go on this host. Only a root agent on a pure cgroup v2 host
    (memory is v2's) prepares anything; there, a cgroup_parent that names a unit is the
    delegated subtree, and on a systemd host any other parent is outside delegation."""
    mount = v2_mount(mounts)
    if not root or mount is None or not memory_on_v2:
        return Plan(None, None)
    parent = (cgroup_parent or "gpuq").strip("/")
    if names_unit(parent):
        return Plan(mount / parent, parent)
    return Plan(None, None, NOT_DELEGATED if systemd else "")


class JobSubtree:
    """The agent's delegated subtree for job cgroups: prepared at start, again when made anew.

    `relative()` is what a launch spec's cgroup_delegated gets (None: nothing delegated here);
    `problem` is "" unless jobs' cgroups are outside delegation or cannot be limited there,
    which the node's isolation claim then says."""

    def __init__(
        self,
        cgroup_parent: str,
        *,
        proc: Path = Path("/proc"),
        run: Path = Path("/run"),
        root: bool | None = None,
        controllers: tuple[str, ...] = CONTROLLERS,
    ) -> None:
        mounts = _read(proc / "self" / "mounts")
        mount = v2_mount(mounts)
        memory = mount is not None and "memory" in read_words(mount / "cgroup.controllers")
        self.plan = plan(
            cgroup_parent,
            mounts,
            root=os.geteuid() == 0 if root is None else root,
            systemd=(run / "systemd" / "system").is_dir(),
            memory_on_v2=memory,
        )
        self.controllers = controllers
        self.subtree: Subtree | None = None
        if self.plan.warning:
            log.warning("%s", self.plan.warning)

    @property
    def problem(self) -> str:
        if self.subtree is not None and self.subtree.problem:
            return self.subtree.problem
        return self.plan.warning

    def relative(self) -> str | None:
        """Prepare the subtree when it is new (first call, or its unit restarted); the launch
        spec's cgroup_delegated. Called before each launch: two reads when nothing changed,
        and a job started right after the unit restarted still gets its limits."""
        if self.plan.subtree is None:
            return None
        if self.subtree is None or needs_prepare(self.subtree):
            self.subtree = prepare(self.plan.subtree, self.controllers)
            self._log(self.subtree)
        return self.plan.relative

    @staticmethod
    def _log(subtree: Subtree) -> None:
        delegated = {True: "yes", False: "no", None: "unknown"}[subtree.delegated]
        log.info(
            "job cgroups in %s: delegated %s, controllers %s, %d process(es) moved to %s",
            subtree.path,
            delegated,
            " ".join(subtree.enabled) or "none",
            subtree.moved,
            HOLDER,
        )
        if subtree.problem:
            log.warning("%s", subtree.problem)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
