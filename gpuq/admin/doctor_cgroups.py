"""The doctor's cgroup checks: the version, the job subtree's delegation and controllers, and
device control (issue 24).

Every file is read through the DoctorContext's roots (a mount point under /sys is read under
ctx.sys), so tests point the checks at a fake tree. The one check that needs the kernel itself,
loading a cgroup device program, runs only when ctx.proc is the real /proc, as root; a fake
tree's tests give its answer in ctx.extra["device_probe"]."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpuq.admin.checks import Check, DoctorContext
from gpuq.agent.jobs.job_cgroups import CONTROLLERS, delegation, names_unit, read_words

INSTALL = (
    "run `gpuq admin install` (it writes gpuq-jobs.service with Delegate= and sets [agent] "
    "cgroup_parent)"
)
DELEGATE = "give the jobs unit Delegate=cpuset memory pids (gpuq admin install)"
# the v1 controllers a mount's options may name (the rest are mount options: rw, name=systemd)
V1_CONTROLLERS = frozenset(
    [
        "blkio",
        "cpu",
        "cpuacct",
        "cpuset",
        "devices",
        "freezer",
        "hugetlb",
        "memory",
        "misc",
        "net_cls",
        "net_prio",
        "perf_event",
        "pids",
        "rdma",
    ]
)


@dataclass(frozen=True, slots=True)
class Layout:
    """The host's cgroup hierarchies, as /proc/self/mounts lists them."""

    v2: Path | None  # the cgroup2 mount, read under ctx.sys
    v1: dict[str, Path]  # v1 controller -> its hierarchy's mount

    @property
    def version(self) -> str:
        if self.v2 is not None and self.v1:
            return "hybrid"
        if self.v2 is not None:
            return "pure v2"
        return "v1" if self.v1 else "none"


def cgroup_checks(ctx: DoctorContext) -> list[Check]:
    """The cgroup version, the job subtree's delegation and controllers, device control."""
    layout = read_layout(ctx)
    return [
        version_check(layout),
        delegation_check(ctx, layout),
        controllers_check(ctx, layout),
        device_check(ctx, layout),
    ]


def read_layout(ctx: DoctorContext) -> Layout:
    v2: Path | None = None
    v1: dict[str, Path] = {}
    try:
        mounts = (ctx.proc / "self" / "mounts").read_text(errors="replace")
    except OSError:
        mounts = ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point = _under(ctx, fields[1])
        if fields[2] == "cgroup2" and v2 is None:
            v2 = point
        elif fields[2] == "cgroup":
            for option in fields[3].split(","):
                if option in V1_CONTROLLERS:
                    v1.setdefault(option, point)
    return Layout(v2, v1)


def _under(ctx: DoctorContext, point: str) -> Path:
    """A mount point under /sys read under ctx.sys (a fake tree's), any other as it is."""
    if point == "/sys" or point.startswith("/sys/"):
        return ctx.sys / point[len("/sys/") :]
    return Path(point)


def version_check(layout: Layout) -> Check:
    if layout.version == "none":
        return Check(
            "cgroup version",
            "fail",
            "no cgroup hierarchy is mounted: jobs run without memory limits or device rules",
            "mount cgroup2 at /sys/fs/cgroup (every current distribution does at boot)",
        )
    details = {
        "pure v2": f"pure cgroup v2 ({layout.v2})",
        "hybrid": f"hybrid: v1 controllers ({' '.join(sorted(layout.v1))}), cgroup2 at {layout.v2}",
        "v1": f"cgroup v1 ({' '.join(sorted(layout.v1))})",
    }
    return Check("cgroup version", "ok", details[layout.version])


def _subtree(ctx: DoctorContext, layout: Layout) -> Path | None:
    parent = (ctx.settings.agent.cgroup_parent or "gpuq").strip("/")
    return layout.v2 / parent if layout.v2 is not None and names_unit(parent) else None


def delegation_check(ctx: DoctorContext, layout: Layout) -> Check:
    name = "cgroup delegation"
    if layout.version != "pure v2":
        return Check(
            name, "skip", f"{layout.version}: delegation is cgroup v2's (memory is v1's here)"
        )
    parent = (ctx.settings.agent.cgroup_parent or "gpuq").strip("/")
    systemd = (ctx.run / "systemd" / "system").is_dir()
    subtree = _subtree(ctx, layout)
    if subtree is None:
        if not systemd:
            return Check(name, "ok", f"no systemd: the agent makes {parent} below the cgroup2 root")
        return Check(
            name,
            "fail",
            f"[agent] cgroup_parent {parent!r} is outside a delegated subtree: systemd may take "
            "the controllers of job cgroups away (their memory limits with them)",
            INSTALL,
        )
    if not subtree.is_dir():
        return Check(
            name,
            "fail",
            f"{subtree} does not exist: jobs' cgroups have no delegated home",
            f"systemctl start {subtree.name} (or {INSTALL})",
        )
    delegated = delegation(subtree)
    if delegated is None:
        return Check(
            name,
            "warn",
            f"{subtree}: cannot tell whether it is delegated (no trusted.delegate xattr support; "
            "systemd before 251 sets none)",
            f"check that {subtree.name} has Delegate=cpuset memory pids "
            f"(systemctl cat {subtree.name})",
        )
    if not delegated:
        return Check(
            name,
            "fail",
            f"{subtree} is not delegated (no trusted.delegate): systemd owns its controllers",
            f"add Delegate=cpuset memory pids to {subtree.name}, or {INSTALL}",
        )
    return Check(name, "ok", f"{subtree} is delegated")


def controllers_check(ctx: DoctorContext, layout: Layout) -> Check:
    """Which of memory, pids and cpuset jobs' groups get: a missing memory controller means
    --mem is only measured (fail); pids or cpuset missing is worse, not broken (warn)."""
    name = "cgroup controllers"
    if layout.version == "none":
        return Check(name, "skip", "no cgroup hierarchy")
    if layout.version == "pure v2" and layout.v2 is not None:
        where = _subtree(ctx, layout) or layout.v2
        offered = set(read_words(where / "cgroup.controllers"))
    else:  # v1's memory and cpuset hierarchies; pids.max is cgroup v2's only
        where = Path("v1 hierarchies")
        offered = {c for c in ("memory", "cpuset") if c in layout.v1}
    works = [c for c in CONTROLLERS if c in offered]
    missing = [
        c for c in CONTROLLERS if c not in offered and (c != "pids" or layout.version == "pure v2")
    ]
    detail = f"{where}: {' '.join(works) or 'none'} available to job groups"
    if "memory" in missing:
        return Check(
            name,
            "fail",
            detail + "; without memory no --mem is enforced (only measured)",
            f"{DELEGATE}; on cgroup v1, mount the memory controller",
        )
    if missing:
        return Check(
            name,
            "warn",
            f"{detail}; missing {' '.join(missing)} (pids: no fork-bomb limit; cpuset: CPUs "
            "bound by affinity only)",
            DELEGATE,
        )
    return Check(name, "ok", detail)


def device_check(ctx: DoctorContext, layout: Layout) -> Check:
    name = "device control"
    if "devices" in layout.v1:
        return Check(name, "ok", f"devices cgroup v1 ({layout.v1['devices']})")
    if layout.v2 is None:
        return Check(
            name,
            "fail",
            "neither the v1 devices controller nor cgroup2: jobs can open every GPU "
            "(advisory isolation)",
            "mount cgroup2 at /sys/fs/cgroup",
        )
    probe = _probe(ctx)
    if probe is None:
        return Check(
            name,
            "warn",
            "cannot check: run as root (loading a cgroup device program needs root)",
            "run gpuq admin doctor as root",
        )
    if probe:
        return Check(
            name,
            "fail",
            f"a cgroup v2 device program does not load: {probe}; jobs would run with "
            "advisory isolation",
            "use a kernel with CONFIG_CGROUP_BPF and BPF syscall access for root (no seccomp or "
            "LSM policy refusing bpf(2)); before 5.11 RLIMIT_MEMLOCK must be raisable",
        )
    return Check(name, "ok", "cgroup v2 device program (a test program loaded)")


def _probe(ctx: DoctorContext) -> str | None:
    """ "" when a trivial device program loads, why not, or None: cannot be tried (not root).
    Only on this machine's own /proc; a fake tree's answer is ctx.extra["device_probe"]."""
    if "device_probe" in ctx.extra:
        return ctx.extra["device_probe"]
    if ctx.proc != Path("/proc"):
        return "not tried: the doctor is not looking at this machine's /proc"
    if os.geteuid() != 0:
        return None
    from gpuq.agent import _supervise  # the compiled part: imported only when it is needed

    return _supervise.probe_device_program()
