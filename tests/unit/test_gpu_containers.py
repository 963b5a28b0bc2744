"""A job's containers on its GPUs: processes a job starts through a container runtime's daemon
run in the runtime's cgroup, outside the job's; they are flagged, never killed as foreign
(fake /proc trees of PID/cgroup files, plain data for the unit watch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuq.agent.gpu.backend import GpuProcess, UnitUsage
from gpuq.agent.gpu.handover_watch import ProcessFacts, UnitWatch
from gpuq.agent.jobs.attribution import JobOfProcess, container_of_cgroup_text

GIB = 1 << 30
ID = "3f2a1b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70"


@pytest.mark.parametrize(
    ("text", "found"),
    [
        (f"0::/system.slice/docker-{ID}.scope\n", "docker container 3f2a1b4c5d6e"),
        (f"12:pids:/docker/{ID}\n1:name=systemd:/docker/{ID}\n", "docker container 3f2a1b4c5d6e"),
        (f"0::/machine.slice/libpod-{ID}.scope/container\n", "podman container 3f2a1b4c5d6e"),
        (f"0::/system.slice/cri-containerd-{ID}.scope\n", "containerd container 3f2a1b4c5d6e"),
        (f"0::/kubepods/besteffort/pod1234-ab/{ID}\n", "kubernetes container 3f2a1b4c5d6e"),
        (
            f"0::/kubepods.slice/kubepods-pod1.slice/crio-{ID}.scope\n",
            "cri-o container 3f2a1b4c5d6e",
        ),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", ""),
        ("0::/system.slice/dockerd.service\n", ""),  # the daemon itself is no container
        ("4:memory:/gpuq/job_7\n", ""),
    ],
)
def test_container_runtimes_groups_are_recognised(text: str, found: str) -> None:
    assert container_of_cgroup_text(text) == found


def fake_proc(root: Path, cgroups: dict[int, str]) -> Path:
    for pid, text in cgroups.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(text)
    return root


def test_a_container_in_the_jobs_cgroup_is_the_jobs_one_in_a_daemons_is_a_container(
    tmp_path: Path,
) -> None:
    proc = fake_proc(
        tmp_path,
        {
            11: "0::/gpuq/job_7\n",  # rootless podman (cgroupfs): the container stays here
            12: f"0::/system.slice/docker-{ID}.scope\n",  # docker run: dockerd's group
            13: f"0::/gpuq/job_7/libpod-{ID}.scope\n",  # a group below the job's: not the job's
        },
    )
    job_of = JobOfProcess("gpuq", proc=str(proc))
    assert job_of(11, {}) == 7 and job_of.container(11) == ""
    assert job_of(12, {}) is None and job_of.container(12) == "docker container 3f2a1b4c5d6e"
    assert job_of(13, {}) is None and job_of.container(13) == "podman container 3f2a1b4c5d6e"


def unit(uuid: str, *pids: int) -> UnitUsage:
    return UnitUsage(uuid, GIB, 50, tuple(GpuProcess(pid, GIB) for pid in pids), "ok", "")


def container_facts() -> ProcessFacts:
    owner: dict[int, int | None] = {11: 7, 21: None, 22: None}
    return ProcessFacts(
        owner,
        dict.fromkeys(owner, True),
        {11: "python", 21: "python", 22: "miner"},
        {21: "docker container 3f2a1b4c5d6e"},
    )


def test_kill_mode_kills_a_foreign_process_but_never_a_container_process() -> None:
    watch = UnitWatch(10.0, kill_foreign=True)
    held = watch.assess([unit("G0", 11, 21, 22)], {"G0": 7}, container_facts())
    assert held.kill == (22,)
    notes = held.verdicts["G0"].notes
    assert any(
        "container process pid 21 (python, 1G, docker container 3f2a1b4c5d6e) (never killed)" in n
        for n in notes
    ), notes
    assert any(n.startswith("foreign process pid 22") for n in notes), notes
    free = watch.assess([unit("G1", 21)], {}, container_facts())
    assert free.kill == ()
    assert free.verdicts["G1"].health == "dirty"  # a free unit with it is not given out
    assert free.verdicts["G1"].reason.startswith("container process pid 21"), free.verdicts
