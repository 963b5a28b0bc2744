"""SLURM's commands on gpuq, as people and job launchers call them: `gpuq slurm-shims DIR`
writes them, and they run by PATH as subprocesses against a real coordinator and an agent on
fake GPUs.

What a SLURM user relies on: `sbatch --parsable` prints the id; squeue lists the job by
user and state; sacct reports how it ended in SLURM's words (`COMPLETED|0:0`, `FAILED|3:0`,
`CANCELLED`); scancel cancels; an option gpuq does not support is refused in one line; and a
launcher written for SLURM (submit with sbatch, poll sacct, cancel with scancel, read the
output files, as submitit and Snakemake's SLURM executor do) works unchanged.
"""

from __future__ import annotations

import getpass
import os
import re
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for

FINAL = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED"}
)


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[tuple[Cluster, dict[str, str]]]:
    """A coordinator, one agent with 2 fake GPUs, and SLURM's commands first on PATH."""
    cluster = Cluster(tmp_path)
    try:
        cluster.start_coordinator()
        cluster.start_agent("a", "2xA100-80GB")
        made = cluster.gpuq("slurm-shims", str(tmp_path / "bin"))
        assert made.returncode == 0, made.stderr
        env = {**cluster.env, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
        env["GPUQ_CLI_HELPER"] = "off"
        yield cluster, env
    finally:
        cluster.close()


def call(env: dict[str, str], cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """A SLURM command found by PATH, as a launcher runs it."""
    return subprocess.run(
        list(argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def sacct_state(env: dict[str, str], cwd: Path, job_id: str) -> str:
    out = call(env, cwd, "sacct", "-j", job_id, "-P", "-n", "-X", "-o", "JobID,State,ExitCode")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_shims_are_gpuqs_and_never_replace_other_files(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    folder = tmp_path / "new" / "bin"
    made = cluster.gpuq("slurm-shims", str(folder))
    assert made.returncode == 0, made.stderr
    names = {"sbatch", "squeue", "scancel", "sinfo", "sacct", "srun", "salloc", "scontrol"}
    assert {p.name for p in folder.iterdir()} == names
    for path in folder.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o755
        assert "-m gpuq.slurm.commands" in path.read_text()
    again = cluster.gpuq("slurm-shims", str(folder))  # its own shims: refreshed
    assert again.returncode == 0, again.stderr
    (folder / "sinfo").unlink()
    (folder / "sinfo").write_text("#!/bin/sh\necho the real sinfo\n")
    refused = cluster.gpuq("slurm-shims", str(folder))
    assert refused.returncode == 2
    assert "sinfo" in refused.stderr and "not one of gpuq's shims" in refused.stderr
    assert (folder / "sinfo").read_text() == "#!/bin/sh\necho the real sinfo\n"


def test_sbatch_squeue_sacct_scancel(slurm: tuple[Cluster, dict[str, str]]) -> None:
    cluster, env = slurm
    root = cluster.root
    script = root / "job.sh"
    script.write_text(
        "#!/bin/sh\n#SBATCH --job-name=shimjob\n#SBATCH -o out-%j.txt\n"
        "while [ ! -e go ]; do sleep 0.1; done\necho hello from $SLURM_JOB_ID\n"
    )
    submitted = call(env, root, "sbatch", "--parsable", str(script))
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert job_id.isdigit()

    me = getpass.getuser()
    wait_for(
        lambda: (
            f"{job_id} RUNNING"
            in call(env, root, "squeue", "-h", "-u", me, "-o", "%i %T").stdout.splitlines()
        ),
        what="squeue to list the job running",
    )
    listed = call(env, root, "squeue", "-j", job_id, "-o", "%.10i %.9P %j %t %D")
    assert listed.stdout.splitlines() == [
        "     JOBID PARTITION NAME ST NODES",
        f"{job_id:>10}      gpuq shimjob R 1",
    ]
    wide = call(env, root, "squeue", "-h", "-j", job_id, "-O", "JobID:8,State,NodeList:4")
    assert wide.stdout == f"{job_id:<8}{'RUNNING':<20}a   \n"
    assert sacct_state(env, root, job_id) == f"{job_id}|RUNNING|0:0"
    shown = call(env, root, "scontrol", "show", "job", job_id)
    assert "JobState=RUNNING" in shown.stdout and "JobName=shimjob" in shown.stdout

    (root / "go").touch()
    wait_for(
        lambda: sacct_state(env, root, job_id) == f"{job_id}|COMPLETED|0:0",
        what="sacct to report the job completed",
    )
    assert (root / f"out-{job_id}.txt").read_text() == f"hello from {job_id}\n"
    assert call(env, root, "squeue", "-h", "-j", job_id).stdout == ""

    failing = call(env, root, "sbatch", "--wrap", "exit 3")
    assert failing.returncode == 0, failing.stderr
    assert failing.stdout.startswith("Submitted batch job ")
    failed_id = failing.stdout.split()[-1]
    wait_for(
        lambda: sacct_state(env, root, failed_id) == f"{failed_id}|FAILED|3:0",
        what="sacct to report the job failed with exit code 3",
    )

    # every filter must match: not this name, so nothing is cancelled. A held job is cancelled
    # at once when it is (no agent to wait for), so its state right after scancel says it all
    held = call(env, root, "sbatch", "--parsable", "-H", "-J", "held", "--wrap", "true")
    held_id = held.stdout.strip()
    assert call(env, root, "scancel", "-n", "other", held_id).returncode == 0
    assert cluster.job(int(held_id)).state.value == "held"
    assert call(env, root, "scancel", "-n", "held", held_id).returncode == 0
    assert cluster.job(int(held_id)).state.value == "cancelled"

    sleeper = call(env, root, "sbatch", "--parsable", "-J", "sleeper", "--wrap", "sleep 300")
    sleeper_id = sleeper.stdout.strip()
    wait_for(lambda: cluster.job(int(sleeper_id)).state.value == "running", what="running")
    assert call(env, root, "scancel", "-n", "other", sleeper_id).returncode == 0
    assert sacct_state(env, root, sleeper_id) == f"{sleeper_id}|RUNNING|0:0"
    cancelled = call(env, root, "scancel", "-n", "sleeper", sleeper_id)
    assert cancelled.returncode == 0 and cancelled.stdout == "", cancelled.stderr
    wait_for(
        lambda: sacct_state(env, root, sleeper_id).startswith(f"{sleeper_id}|CANCELLED|"),
        what="sacct to report the job cancelled",
    )

    nodes = call(env, root, "sinfo", "-N", "-h", "-o", "%N %P %T %G %c")
    assert nodes.returncode == 0, nodes.stderr
    assert nodes.stdout.split()[:4] == ["a", "gpuq*", "idle", "gpu:a100:2"]


def test_scancel_by_user_and_state_cancels_only_those(
    slurm: tuple[Cluster, dict[str, str]],
) -> None:
    cluster, env = slurm
    root, me = cluster.root, getpass.getuser()
    running = call(env, root, "sbatch", "--parsable", "--wrap", "sleep 300").stdout.strip()
    cluster.wait_state(int(running), "running")
    held = call(env, root, "sbatch", "--parsable", "-H", "--wrap", "true").stdout.strip()
    # a held job is PENDING to SLURM: -t PD takes it, and leaves the running one
    done = call(env, root, "scancel", "-u", me, "-t", "PD")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert cluster.job(int(held)).state.value == "cancelled"
    assert cluster.job(int(running)).state.value == "running"
    assert call(env, root, "scancel", "--me", "-t", "R").returncode == 0
    cluster.wait_state(int(running), "cancelled")


def test_unsupported_options_are_refused_in_one_line(
    slurm: tuple[Cluster, dict[str, str]],
) -> None:
    cluster, env = slurm
    refused = call(env, cluster.root, "sbatch", "--foo", "--wrap", "true")
    assert refused.returncode == 1
    assert refused.stderr == "sbatch: --foo is not supported by gpuq's sbatch\n"
    assert call(env, cluster.root, "squeue", "-h").stdout == ""  # nothing was submitted
    bad_field = call(env, cluster.root, "sacct", "-o", "JobID,Bogus")
    assert bad_field.returncode == 1
    assert bad_field.stderr == "sacct: error: Invalid field requested: Bogus\n"
    assert call(env, cluster.root, "scontrol", "show", "partition").returncode == 1


def test_hold_release_and_update_through_scontrol(slurm: tuple[Cluster, dict[str, str]]) -> None:
    cluster, env = slurm
    root = cluster.root
    held = call(env, root, "sbatch", "--parsable", "-H", "-t", "10", "--wrap", "true")
    job_id = held.stdout.strip()
    assert call(env, root, "squeue", "-h", "-j", job_id, "-o", "%T %r %l").stdout == (
        "PENDING JobHeldUser 10:00\n"
    )
    updated = call(env, root, "scontrol", "update", f"JobId={job_id}", "TimeLimit=5", "Name=b")
    assert updated.returncode == 0, updated.stderr
    assert call(env, root, "squeue", "-h", "-j", job_id, "-o", "%j %l").stdout == "b 5:00\n"
    assert call(env, root, "scontrol", "release", job_id).returncode == 0
    wait_for(
        lambda: sacct_state(env, root, job_id) == f"{job_id}|COMPLETED|0:0",
        what="the released job to complete",
    )


class SlurmLauncher:
    """What job launchers written for SLURM do (submitit, Snakemake's SLURM executor): write
    a batch script, submit it with `sbatch --parsable`, poll `sacct -P -n -X -o JobID,State`
    until a final state, cancel with `scancel`, read the output file. Nothing here knows gpuq."""

    def __init__(self, env: dict[str, str], folder: Path) -> None:
        self.env, self.folder = env, folder

    def _run(self, *argv: str) -> str:
        done = subprocess.run(
            list(argv), env=self.env, cwd=self.folder, capture_output=True, text=True, check=True
        )
        return done.stdout

    def submit(self, command: str, name: str) -> str:
        script = self.folder / f"{name}.sbatch"
        script.write_text(
            f"#!/bin/bash\n#SBATCH --job-name={name}\n#SBATCH --output={name}_%j.out\n"
            f"#SBATCH --time=00:05:00\n#SBATCH --cpus-per-task=1\n{command}\n"
        )
        return self._run("sbatch", "--parsable", str(script)).strip().split(";")[0]

    def state(self, job_id: str) -> str:
        lines = self._run("sacct", "-j", job_id, "-P", "-n", "-X", "-o", "JobID,State")
        states = dict(line.split("|", 1) for line in lines.splitlines() if line)
        return states.get(job_id, "UNKNOWN").split()[0]  # "CANCELLED by 0" -> CANCELLED

    def wait(self, job_id: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (state := self.state(job_id)) in FINAL:
                return state
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} did not end within {timeout} s")

    def cancel(self, job_id: str) -> None:
        self._run("scancel", job_id)

    def output(self, name: str, job_id: str) -> str:
        return (self.folder / f"{name}_{job_id}.out").read_text()


def test_a_slurm_launcher_runs_unchanged(slurm: tuple[Cluster, dict[str, str]]) -> None:
    cluster, env = slurm
    launcher = SlurmLauncher(env, cluster.root)
    good = launcher.submit("echo result=$((6 * 7))", "good")
    bad = launcher.submit("echo oops >&2; exit 2", "bad")
    slow = launcher.submit("sleep 300", "slow")
    assert launcher.wait(good) == "COMPLETED"
    assert launcher.output("good", good) == "result=42\n"
    assert launcher.wait(bad) == "FAILED"
    assert launcher.output("bad", bad) == "oops\n"
    wait_for(lambda: launcher.state(slow) == "RUNNING", what="the slow job to run")
    launcher.cancel(slow)
    assert launcher.wait(slow) == "CANCELLED"


def test_srun_is_gpuq_run_outside_a_job_and_a_step_inside(
    slurm: tuple[Cluster, dict[str, str]],
) -> None:
    cluster, env = slurm
    root = cluster.root
    outside = subprocess.run(
        ["srun", "-Q", "-J", "probe", "--pty", "sh", "-c", "echo hi from $SLURM_JOB_NAME; exit 4"],
        env=env,
        cwd=root,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (outside.returncode, outside.stdout) == (4, "hi from probe\n"), outside.stderr
    shim = root / "bin" / "srun"  # called by its path: in a job, gpuq's own shims come first
    inside = call(
        env,
        root,
        "sbatch",
        "--parsable",
        "-o",
        "step.out",
        "--wrap",
        f"{shim} sh -c 'echo step=$SLURM_STEP_ID'",
    )
    job_id = inside.stdout.strip()
    wait_for(
        lambda: sacct_state(env, root, job_id) == f"{job_id}|COMPLETED|0:0",
        what="the job with a step to complete",
    )
    # a step sets SLURM_STEP_ID; a job of its own (gpuq run) would not
    assert re.fullmatch(r"step=[0-9]+\n", (root / "step.out").read_text())
    refused = call(env, root, "salloc", "hostname")
    assert refused.returncode == 1 and "not supported by gpuq's salloc" in refused.stderr


def test_an_array_is_listed_task_by_task(slurm: tuple[Cluster, dict[str, str]]) -> None:
    cluster, env = slurm
    root = cluster.root
    submitted = call(
        env, root, "sbatch", "--parsable", "-a", "0-2", "-o", "arr_%A_%a.out", "--wrap", "true"
    )
    array = submitted.stdout.strip()
    done = {f"{array}_{t}|COMPLETED" for t in range(3)}
    wait_for(
        lambda: (
            set(
                call(env, root, "sacct", "-j", array, "-P", "-n", "-X", "-o", "JobID,State")
                .stdout.strip()
                .splitlines()
            )
            == done
        ),
        what="sacct to list each task of the array completed",
    )
    one = call(env, root, "sacct", "-j", f"{array}_1", "-P", "-n", "-o", "JobID,State")
    assert one.stdout == f"{array}_1|COMPLETED\n"
