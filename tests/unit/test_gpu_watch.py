"""The hand-over rules: a unit goes back only when NVML lists nobody on it (plain data, a fake
clock), and processes are attributed to jobs by cgroup."""

from __future__ import annotations

import os

from gpuq.agent.gpu.backend import GpuProcess, UnitUsage
from gpuq.agent.gpu.handover_watch import ProcessFacts, UnitWatch
from gpuq.agent.jobs.attribution import JobOfProcess, job_of_cgroup_text

GIB = 1024**3


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def usage(uuid: str, *pids: int, health: str = "ok", reason: str = "") -> UnitUsage:
    processes = tuple(GpuProcess(pid, 2 * GIB) for pid in pids)
    return UnitUsage(uuid, 2 * GIB * len(pids), 50, processes, health, reason)


def facts(
    owner: dict[int, int | None], alive: set[int] | None = None, name: str = "python"
) -> ProcessFacts:
    living = set(owner) if alive is None else alive
    return ProcessFacts(owner, {pid: pid in living for pid in owner}, dict.fromkeys(owner, name))


def test_a_held_unit_with_only_its_jobs_processes_is_ok() -> None:
    watch = UnitWatch(10.0, clock=Clock())
    result = watch.assess([usage("G0", 11)], {"G0": 7}, facts({11: 7}))
    assert result.verdicts["G0"].health == "ok"
    assert result.verdicts["G0"].notes == ()
    assert result.kill == ()


def test_a_free_unit_with_the_ended_jobs_process_is_dirty_then_the_straggler_is_killed() -> None:
    clock = Clock()
    watch = UnitWatch(10.0, clock=clock)
    watch.job_ended(7, ["G0"])
    first = watch.assess([usage("G0", 11)], {}, facts({11: 7}))
    assert first.verdicts["G0"].health == "dirty"
    assert "pid 11 (python, 2G) of job 7 is still running" in first.verdicts["G0"].reason
    assert first.kill == ()  # it gets handover_timeout to go on its own
    clock.now += 10.0
    later = watch.assess([usage("G0", 11)], {}, facts({11: 7}))
    assert later.kill == (11,)
    assert later.verdicts["G0"].health == "dirty"
    clean = watch.assess([usage("G0")], {}, facts({}))
    assert clean.verdicts["G0"].health == "ok"
    assert watch.handing_over("G0") is None


def test_a_context_nvml_keeps_listing_after_its_process_died_keeps_the_unit_dirty() -> None:
    watch = UnitWatch(10.0, clock=Clock())
    watch.job_ended(7, ["G0"])
    result = watch.assess([usage("G0", 11)], {}, facts({11: None}, alive=set()))
    assert result.verdicts["G0"].health == "dirty"
    assert result.verdicts["G0"].reason == "pid 11 has exited but NVML still lists it"
    assert result.kill == ()


def test_a_foreign_process_on_a_free_unit_makes_it_dirty_and_is_reported_once() -> None:
    watch = UnitWatch(10.0, clock=Clock())
    first = watch.assess([usage("G1", 99)], {}, facts({99: None}, name="miner"))
    verdict = first.verdicts["G1"]
    assert verdict.health == "dirty"
    assert verdict.reason == "foreign process pid 99 (miner, 2G) holds it"
    assert verdict.notes == ("foreign process pid 99 (miner, 2G) on a free unit",)
    assert first.flagged == ("G1: foreign process pid 99 (miner, 2G) on a free unit",)
    assert first.kill == ()  # report only, by default
    again = watch.assess([usage("G1", 99)], {}, facts({99: None}, name="miner"))
    assert again.flagged == ()  # logged once, shown every time
    assert again.verdicts["G1"].health == "dirty"


def test_a_foreign_process_on_a_held_unit_is_flagged_and_killed_under_the_kill_policy() -> None:
    watch = UnitWatch(10.0, kill_foreign=True, clock=Clock())
    result = watch.assess([usage("G0", 11, 99)], {"G0": 7}, facts({11: 7, 99: None}))
    verdict = result.verdicts["G0"]
    assert verdict.health == "ok"  # the job keeps its unit
    assert verdict.notes == ("foreign process pid 99 (python, 2G) on job 7's unit",)
    assert result.kill == (99,)  # never the job's own process


def test_another_jobs_process_is_flagged_but_never_killed() -> None:
    watch = UnitWatch(10.0, kill_foreign=True, clock=Clock())
    result = watch.assess([usage("G0", 11, 12)], {"G0": 7}, facts({11: 7, 12: 8}))
    assert result.verdicts["G0"].notes == ("job 8's process pid 12 (python, 2G) on job 7's unit",)
    assert result.kill == ()


def test_the_backends_unhealthy_wins_over_clean() -> None:
    watch = UnitWatch(10.0, clock=Clock())
    result = watch.assess([usage("G0", health="unhealthy", reason="GPU is lost")], {}, facts({}))
    assert result.verdicts["G0"].health == "unhealthy"
    assert result.verdicts["G0"].reason == "GPU is lost"


def test_cgroup_lines_name_the_job_only_under_the_agents_parent() -> None:
    v1 = "12:devices:/gpuq/job_42\n4:memory:/gpuq/job_42\n0::/\n"
    assert job_of_cgroup_text(v1, "gpuq") == 42
    assert job_of_cgroup_text("4:memory:/gpuq/job_42.1234\n", "gpuq") == 42
    assert job_of_cgroup_text("0::/system.slice/gpuq-agent.service/gpuq/job_5\n", "gpuq") == 5
    assert job_of_cgroup_text("4:memory:/user.slice/job_42\n", "gpuq") is None
    assert job_of_cgroup_text("4:memory:/gpuq/job_42/inner\n", "gpuq") is None
    assert job_of_cgroup_text("4:memory:/other/job_42\n", "lab/gpuq") is None
    assert job_of_cgroup_text("4:memory:/lab/gpuq/job_3\n", "lab/gpuq") == 3


def test_without_a_cgroup_a_process_belongs_to_the_job_whose_supervisor_it_descends_from() -> None:
    job_of = JobOfProcess("gpuq-test-nonexistent-parent")
    assert job_of(os.getpid(), {os.getppid(): 9}) == 9
    assert job_of(os.getpid(), {}) is None
    assert job_of(os.getpid(), {1234567: 9}) is None


def test_an_environment_variable_does_not_make_a_process_a_jobs() -> None:
    os.environ["GPUQ_JOB_ID"] = "5"
    try:
        assert JobOfProcess("gpuq-test-nonexistent-parent")(os.getpid(), {}) is None
    finally:
        del os.environ["GPUQ_JOB_ID"]


def test_the_node_claims_the_device_cgroup_its_supervisors_will_use() -> None:
    from gpuq.agent.jobs.isolation import device_cgroup_kind

    hybrid = (
        "cgroup /sys/fs/cgroup/devices cgroup rw,relatime,devices 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
    )
    assert device_cgroup_kind(hybrid, prefer="") == "devices cgroup v1"
    assert device_cgroup_kind(hybrid, prefer="v2") == "cgroup v2 device program"
    assert device_cgroup_kind("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n", prefer="") == (
        "cgroup v2 device program"
    )
    assert device_cgroup_kind("proc /proc proc rw 0 0\n", prefer="").startswith("advisory")


def test_a_display_servers_graphics_context_is_shown_but_keeps_no_job_off_the_gpu() -> None:
    watch = UnitWatch(10.0, kill_foreign=True, clock=Clock())
    xorg = UnitUsage("G0", 64 << 20, 3, (GpuProcess(500, 64 << 20, "graphics"),))
    result = watch.assess([xorg], {}, facts({500: None}, name="Xorg"))
    assert result.verdicts["G0"].health == "ok"
    assert result.verdicts["G0"].notes == (
        "foreign process pid 500 (Xorg, 64M, graphics) on a free unit",
    )
    assert result.kill == ()  # never killed, even under the kill policy
    held = watch.assess([xorg], {"G0": 7}, facts({500: None}, name="Xorg"))
    assert held.kill == ()
