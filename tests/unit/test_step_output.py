"""How srun passes its tasks' output on (gpuq/steps/step_output.py): whole lines by default,
so the lines of tasks writing at once never interleave mid-line (srun's default; -u passes
bytes as they come), `--label` prefixes, and a last line without a newline at a task's end."""

from __future__ import annotations

import os
import tempfile

from gpuq.steps.step_output import MAX_PARTIAL_LINE, OutputRouter
from gpuq.steps.task_layout import JobShape, StepRequest, plan


def captured(writes: list[tuple[int, bytes]], **options: bool) -> bytes:
    """What srun writes to its stdout (a file here) for these task writes, in order."""
    job = JobShape("812", ("a", "b"), ("10.0.0.2", "10.0.0.3"), 1, 4, 0, None)
    label = options.pop("label", False)
    with tempfile.TemporaryFile() as out:
        saved = os.dup(1)
        os.dup2(out.fileno(), 1)
        try:
            route = OutputRouter(
                plan(job, StepRequest()), label, None, None, "812", 0, {}, "/", **options
            )
            for rank, data in writes:
                route.write(rank, 1, data)
            route.close()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        out.seek(0)
        return out.read()


def test_two_tasks_lines_never_interleave_mid_line() -> None:
    out = captured([(0, b"rank=0 a"), (1, b"rank=1 b\n"), (0, b"bc\n")])
    assert out == b"rank=1 b\nrank=0 abc\n"


def test_unbuffered_passes_bytes_as_they_come() -> None:
    out = captured([(0, b"rank=0 a"), (1, b"rank=1 b\n"), (0, b"bc\n")], unbuffered=True)
    assert out == b"rank=0 arank=1 b\nbc\n"


def test_label_and_a_last_line_without_newline() -> None:
    out = captured([(1, b"x\ny"), (0, b"z\n")], label=True)
    assert out == b"1: x\n0: z\n1: y"


def test_a_line_longer_than_the_limit_is_passed_on_unfinished() -> None:
    long = b"x" * (MAX_PARTIAL_LINE + 1)
    out = captured([(0, long), (1, b"y\n"), (0, b"\n")])
    assert out == long + b"y\n\n"
