"""`gpuq submit` as sbatch users expect it, with the real CLI against a running cluster:
--parsable, #SBATCH lines (and a warning for what gpuq does not use), CRLF scripts refused,
options after the script, and bounded input refused with one line (exit 2, no traceback)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
from e2e_cluster import Cluster


@pytest.fixture(scope="module")
def queue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the module (each test here submits a few quick jobs): node a, 4 GPUs."""
    running = Cluster(tmp_path_factory.mktemp("submit"))
    try:
        running.start_coordinator()
        running.start_agent("a", "4xA100-80GB")
        yield running
    finally:
        running.close()


def job_count(cluster: Cluster) -> int:
    return len(cluster.client().list()) + len(cluster.client().list(finished=True))


def refused_with_one_line(cluster: Cluster, *args: str) -> str:
    """Run `gpuq submit ARGS`: exit 2, one line on stderr, nothing on stdout, no job made."""
    before = job_count(cluster)
    result = cluster.gpuq("submit", *args)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout == ""
    assert job_count(cluster) == before, "a refused submission must not create a job"
    return lines[0]


def submitted(result: subprocess.CompletedProcess[str]) -> int:
    assert result.returncode == 0, (result.stdout, result.stderr)
    match = re.fullmatch(r"Submitted job (\d+)\n", result.stdout)
    assert match, result.stdout
    return int(match[1])


def test_parsable_prints_only_the_id(queue: Cluster) -> None:
    result = queue.gpuq("submit", "--parsable", "--wrap", "true")
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"\d+\n", result.stdout), result.stdout
    assert result.stderr == ""
    queue.wait_state(int(result.stdout), "completed")

    array = queue.gpuq("submit", "--parsable", "--array", "0-3", "--hold", "--wrap", "true")
    assert array.returncode == 0, array.stderr
    assert re.fullmatch(r"\d+\n", array.stdout), array.stdout
    plain = queue.gpuq("submit", "--array", "0-3", "--hold", "--wrap", "true")
    assert re.fullmatch(r"Submitted array job \d+ \(4 tasks\)\n", plain.stdout), plain.stdout


def test_sbatch_lines_are_read_and_unused_ones_warned(queue: Cluster) -> None:
    script = queue.root / "sbatch.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --gpus=2 --job-name=from-sbatch\n"
        "#SBATCH --account=x\n"
        "#SBATCH -t 5 --output=sb-%j.txt\n"
        "#GPUQ --gpus 1\n"  # #GPUQ wins over #SBATCH
        'echo "gpus=$GPUQ_GPUS name=$GPUQ_JOB_NAME"\n'
    )
    result = queue.gpuq("submit", str(script))
    job_id = submitted(result)
    assert result.stderr.splitlines() == [
        "gpuq submit: warning: #SBATCH --account=x (line 3) is not used by gpuq"
    ]
    job = queue.wait_state(job_id, "completed")
    assert (job.spec.resources.gpus, job.spec.resources.time_limit) == (1, 300)
    assert (queue.root / f"sb-{job_id}.txt").read_text() == "gpus=1 name=from-sbatch\n"


def test_a_bad_value_in_an_sbatch_line_names_the_line(queue: Cluster) -> None:
    script = queue.root / "bad-sbatch.sh"
    script.write_text("#!/bin/bash\n#SBATCH --dependency=after:12\ntrue\n")
    line = refused_with_one_line(queue, str(script))
    assert "invalid --dependency (#SBATCH line 2) 'after:12'" in line  # as the line wrote it
    assert "afterok" in line


def test_crlf_scripts_are_refused(queue: Cluster) -> None:
    script = queue.root / "dos.sh"
    script.write_bytes(b"#!/bin/bash\r\necho hi\r\n")
    line = refused_with_one_line(queue, str(script))
    assert "has DOS line ends (CRLF); run dos2unix" in line and "dos.sh" in line


def test_options_after_the_script_go_to_the_script_with_a_warning(queue: Cluster) -> None:
    script = queue.root / "args.sh"
    script.write_text('#!/bin/bash\necho "args: $*"\n')
    result = queue.gpuq("submit", str(script), "--gpus", "2", "--lr=0.1", "--time=5")
    job_id = submitted(result)
    assert result.stderr.splitlines() == [
        "gpuq submit: warning: --gpus after the script is passed to the script; put gpuq "
        "options before the script",
        "gpuq submit: warning: --time after the script is passed to the script; put gpuq "
        "options before the script",
    ]
    job = queue.wait_state(job_id, "completed")
    assert job.spec.resources.gpus == 0 and job.spec.resources.time_limit != 300
    assert (queue.root / f"gpuq-{job_id}.out").read_text() == "args: --gpus 2 --lr=0.1 --time=5\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--begin", "now+3000000d"], "invalid --begin 'now+3000000d': is more than a year"),
        (["--begin", "now+99999999999999999999d"], "invalid --begin"),
        (["--signal", "USR1@99999999999999999"], "the warning time must be from 0 to"),
        (["--signal", "KILL"], "SIGKILL cannot be caught"),
        (["--array", "0-99999999999:1"], "task indices go from 0 to 10000000"),
        (["--array", "0-9%0"], "the %N limit must be from 1"),
        (["--mem", "99999999999999T"], "invalid --mem '99999999999999T': is more than 1024P"),
        (["--mem", "nan"], "invalid --mem 'nan'"),
        (["--time", "99999999999"], "must be from 1 second to 366 days"),
        (["--gpus", "99999999999999999999999"], "invalid --gpus"),
        (["--name", "two\nlines"], "contains the control character '\\n'"),
        (["--name", "a\u202eb"], "contains the control character '\\u202e'"),
        (["--gpu", "2"], "--gpu is ambiguous: --gpu-mem, --gpu-share, --gpus, --gpus-per-node"),
        (["-G", "2x"], "invalid -G '2x'"),  # named as written
        (["--output", "a\nb"], "invalid --output"),
        (["--env", "1X=2"], "invalid --env '1X=2'"),
        (["--after", "after:12"], "after: (start once JOB has started) is not supported"),
        (["--after", "12?13"], "'?'"),
        (["--after", "5_0x"], "invalid --after"),
        (["--qos", "hi gh"], "invalid --qos"),
    ],
)
def test_out_of_bounds_input_is_one_line_and_exit_2(
    queue: Cluster, args: list[str], message: str
) -> None:
    assert message in refused_with_one_line(queue, *args, "--wrap", "true")


def test_the_queue_still_schedules_after_refusals(queue: Cluster) -> None:
    refused_with_one_line(queue, "--begin", "now+3000000d", "--wrap", "true")
    later = queue.gpuq("submit", "--parsable", "--begin", "now+300d", "--wrap", "true")
    assert later.returncode == 0, later.stderr
    assert queue.wait_state(int(later.stdout), "pending").state.value == "pending"
    listing = queue.gpuq("queue")
    assert listing.returncode == 0 and "begin time" in listing.stdout, listing.stdout
    done = submitted(
        queue.gpuq("submit", "--after", f"afterany:{int(later.stdout)}", "--wrap", "true")
    )
    queue.gpuq("cancel", later.stdout.strip())
    queue.wait_state(done, "completed")


def test_the_environment_is_carried_but_bounded(queue: Cluster) -> None:
    env = {**queue.env, **{f"BIG{i}": "x" * 110_000 for i in range(10)}}  # 1.1 MB
    result = subprocess.run(
        [sys.executable, "-m", "gpuq.cli.main", "submit", "--wrap", "true"],
        cwd=queue.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    assert "larger than 1 MiB" in result.stderr and len(result.stderr.splitlines()) == 1
