"""The delegated cgroup v2 subtree for job cgroups (gpuq.agent.jobs.job_cgroups) against a
fake cgroupfs tree, and the node's isolation claim after real loads (DeviceLoads).

A fake tree is plain files: a write replaces a file's text where the kernel would update a
list, so these tests check what was written, and the real hierarchy's behaviour (the
no-internal-process rule) is tested in tests/e2e/test_job_cgroups_v2_e2e.py."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from gpuq.agent.jobs import job_cgroups
from gpuq.agent.jobs.isolation import DeviceLoads
from gpuq.agent.jobs.job_cgroups import JobSubtree, needs_prepare, plan, prepare

V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n"
HYBRID_MOUNTS = (
    "cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n"
    "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
)
R = "system.slice/gpuq-jobs.service"


def fake_unit(root: Path, procs: str = "4242\n") -> Path:
    """root/system.slice/gpuq-jobs.service with the unit's main process in it."""
    folder = root / R
    folder.mkdir(parents=True)
    (folder / "cgroup.procs").write_text(procs)
    (folder / "cgroup.subtree_control").write_text("")
    return folder


def can_set_trusted_xattr(folder: Path) -> bool:
    try:
        os.setxattr(folder, job_cgroups.DELEGATE_XATTR, b"1")
    except OSError as error:
        if error.errno in (errno.ENOTSUP, errno.EPERM):
            return False
        raise
    return True


def test_a_unit_parent_on_pure_v2_is_the_delegated_subtree() -> None:
    chosen = plan(R, V2_MOUNTS, root=True, systemd=True, memory_on_v2=True)
    assert chosen.subtree == Path("/sys/fs/cgroup") / R
    assert chosen.relative == R
    assert chosen.warning == ""
    assert (
        plan(
            "/machine.slice/x.scope/", V2_MOUNTS, root=True, systemd=True, memory_on_v2=True
        ).relative
        == "machine.slice/x.scope"
    )


def test_a_plain_parent_under_systemd_is_outside_delegation() -> None:
    chosen = plan("gpuq", V2_MOUNTS, root=True, systemd=True, memory_on_v2=True)
    assert (chosen.subtree, chosen.relative) == (None, None)
    assert "outside a delegated subtree" in chosen.warning
    assert "gpuq admin install" in chosen.warning


def test_no_systemd_v1_hybrid_or_not_root_prepare_nothing() -> None:
    # a container without systemd keeps a parent made from the root, silently
    assert plan("gpuq", V2_MOUNTS, root=True, systemd=False, memory_on_v2=True).warning == ""
    # hybrid: memory is v1's, systemd mirrors the unit there; nothing to prepare, no warning
    for chosen in (
        plan(R, HYBRID_MOUNTS, root=True, systemd=True, memory_on_v2=False),
        plan(R, V2_MOUNTS, root=False, systemd=True, memory_on_v2=True),
        plan(R, "", root=True, systemd=True, memory_on_v2=False),
    ):
        assert (chosen.subtree, chosen.relative, chosen.warning) == (None, None, "")


def test_prepare_moves_the_units_processes_to_a_holder_and_enables_controllers(
    tmp_path: Path,
) -> None:
    folder = fake_unit(tmp_path, "4242\n4243\n")
    done = prepare(folder)
    assert (folder / "holder" / "cgroup.procs").exists()
    assert done.moved == 2
    # each controller written on its own; only R's subtree_control, nothing above it
    assert not (tmp_path / "system.slice" / "cgroup.subtree_control").exists()
    assert not (tmp_path / "cgroup.subtree_control").exists()
    assert (folder / "cgroup.subtree_control").read_text() == "+cpuset"  # the last write


def test_delegation_is_read_from_the_xattr(tmp_path: Path) -> None:
    folder = fake_unit(tmp_path)
    if not can_set_trusted_xattr(folder):
        assert job_cgroups.delegation(folder) in (None, False)
        pytest.skip("this file system takes no trusted.* xattr here")
    assert job_cgroups.delegation(folder) is True
    os.removexattr(folder, job_cgroups.DELEGATE_XATTR)
    assert job_cgroups.delegation(folder) is False
    done = prepare(folder)
    assert done.delegated is False
    assert "outside a delegated subtree" in done.problem


def test_a_missing_unit_cgroup_is_a_problem(tmp_path: Path) -> None:
    done = prepare(tmp_path / R)
    assert "does not exist" in done.problem
    assert done.enabled == ()


def test_prepared_again_when_the_unit_restarted(tmp_path: Path) -> None:
    folder = fake_unit(tmp_path)
    done = prepare(folder)
    # as the kernel shows it afterwards: the process gone from R, the controllers on
    (folder / "cgroup.procs").write_text("")
    (folder / "cgroup.subtree_control").write_text(" ".join(done.enabled) + "\n")
    assert done.enabled == ("memory", "pids", "cpuset")
    assert not needs_prepare(done)
    # the unit restarted: its sleep is back in R's root, subtree_control empty
    (folder / "cgroup.procs").write_text("5151\n")
    (folder / "cgroup.subtree_control").write_text("")
    assert needs_prepare(done)


def test_job_subtree_reads_the_host_through_its_roots(tmp_path: Path) -> None:
    proc, run, cgroup = tmp_path / "proc", tmp_path / "run", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mounts").write_text(f"cgroup2 {cgroup} cgroup2 rw 0 0\n")
    (run / "systemd" / "system").mkdir(parents=True)
    cgroup.mkdir()
    (cgroup / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    folder = fake_unit(cgroup)
    subtree = JobSubtree(R, proc=proc, run=run, root=True)
    assert subtree.relative() == R
    assert (folder / "holder" / "cgroup.procs").read_text() == "4242"
    elsewhere = JobSubtree("gpuq", proc=proc, run=run, root=True)
    assert elsewhere.relative() is None
    assert "outside a delegated subtree" in elsewhere.problem


def test_a_failed_load_makes_the_node_advisory_until_a_load_works() -> None:
    loads = DeviceLoads()
    kind = "cgroup v2 device program"
    assert loads.claim(kind) == kind
    assert not loads.seen(1, "none: no device to deny")
    assert loads.seen(
        2, "advisory: cannot load a cgroup v2 device program: Operation not permitted"
    )
    claim = loads.claim(kind)
    assert claim.startswith("advisory: device rules failed for job 2: cannot load")
    assert not loads.seen(3, "none: no device to deny")  # says nothing: still advisory
    assert loads.claim(kind) == claim
    assert loads.seen(4, kind)
    assert loads.claim(kind) == kind
