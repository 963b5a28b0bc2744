"""What an agent sends of an ended job's output (gpuq.agent.end_reports): its tail, stdout then
stderr when they are separate files, bounded, read only from regular files (a link the job put
in its output's place is not followed), and at most TAIL_BUDGET bytes of tails a message."""

from __future__ import annotations

import os
from pathlib import Path

from gpuq.agent.end_reports import OUTPUT_TAIL, TAIL_BUDGET, output_tail_of, within_budget
from gpuq.agent.jobs.launch_spec import LaunchSpec
from gpuq.v1 import agent_pb2 as apb


def spec(folder: Path, out: str, err: str) -> LaunchSpec:
    return LaunchSpec(
        job_id=7,
        script="",
        args=(),
        env={},
        cwd=str(folder),
        stdout_path=out,
        stderr_path=err,
        uid=os.getuid(),
    )


def test_one_file_gives_its_last_bytes(tmp_path: Path) -> None:
    (tmp_path / "job.out").write_bytes(b"x" * OUTPUT_TAIL + b"CUDA out of memory\n")
    tail = output_tail_of(spec(tmp_path, "job.out", "job.out"))
    assert len(tail) == OUTPUT_TAIL and tail.endswith(b"CUDA out of memory\n")


def test_separate_files_give_stdout_then_stderr_each_named(tmp_path: Path) -> None:
    (tmp_path / "job.out").write_bytes(b"o" * OUTPUT_TAIL + b"step 9\n")
    (tmp_path / "job.err").write_bytes(b"Traceback (most recent call last):\n")
    tail = output_tail_of(spec(tmp_path, "job.out", "job.err"))
    assert len(tail) <= OUTPUT_TAIL
    assert tail.index(b"step 9") < tail.index(b"--- job.err ---\nTraceback")


def test_a_link_in_the_outputs_place_or_no_file_gives_nothing(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"not the job's\n")
    (tmp_path / "job.out").symlink_to(secret)
    assert output_tail_of(spec(tmp_path, "job.out", "job.out")) == b""
    assert output_tail_of(spec(tmp_path, "none.out", "none.out")) == b""
    assert output_tail_of(spec(tmp_path, "/dev/null", "/dev/null")) == b""


def test_tails_past_the_budget_of_a_message_are_left_out_and_the_ends_kept() -> None:
    each = TAIL_BUDGET // 3
    reports = [apb.JobReport(job_id=i, output_tail=b"x" * each) for i in range(1, 6)]
    sent = within_budget(reports)
    assert [r.job_id for r in sent] == [1, 2, 3, 4, 5]
    assert [len(r.output_tail) for r in sent] == [each, each, each, 0, 0]
