"""A script read exactly as sbatch reads it, through the real CLI, coordinator and agent on
fake GPUs (issue 25): a job name with spaces and a `/` runs and shows intact, sbatch's
file-name patterns, `--time=0:05` as one minute, `#SBATCH --err` (a prefix) sending stderr
apart, `--gpus-per-node=a100` as one A100, `#SBATCH -W` waiting, and what sbatch refuses."""

from __future__ import annotations

import getpass
import json
import re
from collections.abc import Iterator

import pytest
from e2e_cluster import Cluster, wait_for


@pytest.fixture(scope="module")
def queue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the module: node a, two A100s."""
    running = Cluster(tmp_path_factory.mktemp("sbatch"))
    try:
        running.start_coordinator()
        running.start_agent("a", "2xA100-80GB")
        yield running
    finally:
        running.close()


def write(cluster: Cluster, name: str, *lines: str) -> str:
    path = cluster.root / name
    path.write_text("#!/bin/bash\n" + "".join(f"{line}\n" for line in lines))
    return str(path)


def submitted(cluster: Cluster, *args: str) -> int:
    result = cluster.gpuq("submit", "--parsable", *args)
    assert result.returncode == 0, (result.stdout, result.stderr)
    return int(result.stdout)


def test_a_name_with_spaces_and_a_slash_runs_and_shows_intact(queue: Cluster) -> None:
    script = write(
        queue,
        "hw.sh",
        "#SBATCH --job-name='CS 601.471/671 hw5' --hold -o %x.%j.out",
        'echo "name=$SLURM_JOB_NAME"',
    )
    job_id = submitted(queue, script)
    listing = queue.gpuq("queue")
    assert listing.returncode == 0 and "CS 601.471/671 hw5" in listing.stdout, listing.stdout
    shown = queue.gpuq("show", str(job_id))
    assert "CS 601.471/671 hw5" in shown.stdout, shown.stdout
    data = json.loads(queue.gpuq("show", "--json", str(job_id)).stdout)
    assert data["spec"]["name"] == "CS 601.471/671 hw5"
    assert queue.gpuq("release", str(job_id)).returncode == 0
    queue.wait_state(job_id, "completed")
    # %x in a file name: the / is written _, so the name never makes (or needs) a folder
    out = queue.root / f"CS 601.471_671 hw5.{job_id}.out"
    assert out.read_text() == "name=CS 601.471/671 hw5\n"


def test_file_name_patterns_are_sbatchs(queue: Cluster) -> None:
    job_id = submitted(queue, "-o", "out.%J.%u.%5j.%s.%N.%q", "--wrap", "echo hi")
    queue.wait_state(job_id, "completed")
    name = f"out.{job_id}.{getpass.getuser()}.{job_id:05d}.batch.a.%q"
    out = queue.root / name
    wait_for(out.exists, what=f"the output file {name}")
    assert out.read_text() == "hi\n"


def test_time_in_minutes_and_seconds_is_a_whole_minute(queue: Cluster) -> None:
    job_id = submitted(queue, "--time=0:05", "--hold", "--wrap", "true")
    assert queue.job(job_id).spec.resources.time_limit == 60
    script = write(queue, "t.sh", "#SBATCH --time=1:30", "true")
    assert queue.job(submitted(queue, "--hold", script)).spec.resources.time_limit == 120


def test_sbatch_err_prefix_sends_stderr_to_its_own_file(queue: Cluster) -> None:
    script = write(queue, "err.sh", "#SBATCH --err=e.%j.txt", "echo out; echo err >&2")
    job_id = submitted(queue, script)
    queue.wait_state(job_id, "completed")
    assert (queue.root / f"gpuq-{job_id}.out").read_text() == "out\n"
    assert (queue.root / f"e.{job_id}.txt").read_text() == "err\n"


def test_gpus_per_node_with_a_type_alone_is_one_gpu_of_it(queue: Cluster) -> None:
    script = write(
        queue, "a100.sh", "#SBATCH --gpus-per-node=a100", 'echo "gpus=$CUDA_VISIBLE_DEVICES"'
    )
    job_id = submitted(queue, script)
    job = queue.wait_state(job_id, "completed")
    assert (job.spec.resources.gpus, job.spec.resources.gpu_type) == (1, "a100")
    text = (queue.root / f"gpuq-{job_id}.out").read_text()
    assert re.fullmatch(r"gpus=[^,\s]+\n", text), text  # exactly one GPU


def test_sbatch_wait_makes_submit_wait_for_the_exit_code(queue: Cluster) -> None:
    script = write(queue, "w.sh", "#SBATCH -W", "exit 3")
    result = queue.gpuq("submit", script, timeout=60)
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert re.match(r"Submitted job \d+\n", result.stdout)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("#SBATCH --workdir=/tmp", "sbatch has no option --workdir: sbatch renamed it --chdir"),
        ("#SBATCH --ti=5", "--ti is ambiguous: --time, --time-min"),
        (
            "#SBATCH --gres=gpu:1\n#SBATCH --gpus-per-node=1",
            "invalid --gpus-per-node (#SBATCH line 3) 'with --gres (#SBATCH line 2)'",
        ),
    ],
)
def test_what_sbatch_refuses_is_one_line_and_exit_2(
    queue: Cluster, line: str, message: str
) -> None:
    before = len(queue.client().list()) + len(queue.client().list(finished=True))
    result = queue.gpuq("submit", write(queue, "bad.sh", line, "true"))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert len(queue.client().list()) + len(queue.client().list(finished=True)) == before
