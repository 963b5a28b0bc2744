"""srun, scontrol and `gpuq run` inside a job, on one node (no step worker needed): output
where the user asked, the exit code, the job's end when a task fails (and the fallback when the
coordinator cannot end it), the shims as installed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuq.steps import inside_job, shim_dir
from gpuq.steps.scontrol_main import UNSUPPORTED
from gpuq.steps.scontrol_main import main as scontrol
from gpuq.steps.srun_main import end_job, next_step_id
from gpuq.steps.srun_main import main as srun

ROOT = Path(__file__).resolve().parents[2]


def job_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "TMPDIR": str(tmp_path),
        "GPUQ_JOB_ID": "41",
        "GPUQ_JOB_NODES": "gpu01",
        "GPUQ_NODE_ADDRS": "127.0.0.1",
        "GPUQ_STEP_KEY": "ab" * 32,
        "SLURM_JOB_NODELIST": "gpu01",
        "SLURM_CPUS_ON_NODE": "4",
        "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
    }
    env.update(extra)
    return env


def test_srun_writes_per_task_files_and_exits_with_the_worst_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ended: list[tuple[int, str]] = []
    code = srun(
        ["-n", "2", "-K0", "-o", "out-%j-%2t.txt", "sh", "-c", 'echo "$RANK"; exit $RANK'],
        environ=job_env(tmp_path),
        fail_job=lambda job, reason: ended.append((job, reason)),
    )
    assert code == 1
    assert (tmp_path / "out-41-00.txt").read_text() == "0\n"
    assert (tmp_path / "out-41-01.txt").read_text() == "1\n"
    assert ended == []  # -K0: the script decides


def test_a_failing_task_ends_the_job_with_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ended: list[tuple[int, str]] = []
    started = time.monotonic()
    code = srun(
        ["-n", "3", "sh", "-c", 'if [ "$RANK" = 2 ]; then exit 4; fi; exec sleep 300'],
        environ=job_env(tmp_path),
        fail_job=lambda job, reason: ended.append((job, reason)),
        fallback_pgid=None,
    )
    assert code == 4
    assert time.monotonic() - started < 10
    [(job, reason)] = ended
    assert job == 41
    assert reason.startswith("task 2 on gpu01 exited 4 at ")
    assert reason.endswith("; tasks 0-1 were stopped")


def test_the_job_ends_even_when_the_coordinator_cannot_end_it(tmp_path: Path) -> None:
    script = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:

        def broken(job: int, reason: str) -> None:
            raise ConnectionError("no coordinator")

        end_job("41", "task 1 on gpu02 exited 1", broken, script.pid, "srun")
        assert script.wait(timeout=10) == -signal.SIGTERM
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()


def test_bad_options_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert srun(["--bogus", "true"], environ=job_env(tmp_path)) == 2
    assert srun(["-n", "99", "true"], environ=job_env(tmp_path)) == 2
    assert srun(["true"], environ={"PATH": "/bin"}) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3
    assert "not an option srun knows" in lines[0]
    assert "hold 4 tasks" in lines[1]
    assert "not inside a gpuq job" in lines[2]


def test_step_ids_count_up_within_a_job(tmp_path: Path) -> None:
    env = job_env(tmp_path)
    assert [next_step_id(env) for _ in range(3)] == [0, 1, 2]
    assert next_step_id(job_env(tmp_path, GPUQ_JOB_ID="42")) == 0


def test_scontrol_show_hostnames(capsys: pytest.CaptureFixture[str]) -> None:
    assert scontrol(["show", "hostnames", "gpu[01-03],cpu7"]) == 0
    assert capsys.readouterr().out == "gpu01\ngpu02\ngpu03\ncpu7\n"
    assert scontrol(["show", "hostnames"], environ={"SLURM_JOB_NODELIST": "n[1-2]"}) == 0
    assert capsys.readouterr().out == "n1\nn2\n"
    assert scontrol(["requeue", "41"]) == 1
    assert capsys.readouterr().err.strip() == UNSUPPORTED


def test_the_shims_run_as_installed(tmp_path: Path) -> None:
    folder = Path(shim_dir())
    for name in ("srun", "scontrol"):
        assert os.access(folder / name, os.X_OK), name
    env = job_env(tmp_path, GPUQ_PYTHON=sys.executable, PATH=f"{folder}:/usr/bin:/bin")
    result = subprocess.run(
        "scontrol show hostnames $SLURM_JOB_NODELIST | head -n1; srun -n 2 -l echo hi",
        shell=True,
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "gpu01"
    assert sorted(lines[1:]) == ["0: hi", "1: hi"]


def test_gpuq_run_inside_a_job_is_a_step(tmp_path: Path) -> None:
    env = job_env(tmp_path, GPUQ_CLI_HELPER="off")
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gpuq"),
            "run",
            "--ntasks",
            "2",
            "--label",
            "--kill-on-bad-exit",
            "0",
            "--",
            "sh",
            "-c",
            "echo $SLURM_PROCID $WORLD_SIZE",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["0: 0 2", "1: 1 2"]


def test_outside_a_job_gpuq_run_is_an_interactive_job() -> None:
    assert inside_job({"GPUQ_JOB_ID": "4", "GPUQ_STEP_KEY": "ab" * 32})
    assert not inside_job({"GPUQ_STEP_KEY": "ab" * 32})
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    env.update(GPUQ_CLI_HELPER="off", PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpuq"), "run", "--label", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2  # submit's options: --label is not one of them
    assert "--label" in result.stderr
