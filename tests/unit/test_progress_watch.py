"""The agent's reading of running jobs' progress from their output files (gpuq.agent.
progress_watch): the newest line of stdout or stderr, read only when a file grew and no more
often than the sample interval, at most its last 16 KiB; and nothing read (nothing blocks)
where the path is a symlink, a FIFO or another user's file: the agent is root."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import pytest

from gpuq.agent.jobs.launch_spec import LaunchSpec
from gpuq.agent.progress_watch import TAIL, ProgressWatch

T = TypeVar("T")
BAR = "\r{pct}%|####      | {done}/200 [00:05<00:20,  {rate}it/s]"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def spec(folder: Path, out: str = "job.out", err: str | None = None, **more: object) -> LaunchSpec:
    return LaunchSpec(
        job_id=7,
        script="#!/bin/sh\n",
        args=(),
        env={},
        cwd=str(folder),
        stdout_path=out,
        stderr_path=out if err is None else err,
        attempt=2,
        **more,  # type: ignore[arg-type]
    )


def watch(job: LaunchSpec | None, clock: Clock, interval: float = 5.0) -> ProgressWatch:
    return ProgressWatch(lambda job_id: job, interval, clock)


def rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def bytes_read_by(action: Callable[[], T]) -> tuple[T, int]:
    """What `action` returns, and how many bytes this process read with read(2) and pread(2)
    meanwhile (/proc/self/io rchar, less what reading that file costs)."""
    first = rchar()
    second = rchar()
    result = action()
    return result, rchar() - second - (second - first)


def test_a_tqdm_bar_is_read_with_its_rate_and_when_it_was_read(tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    out.write_text(
        "loading\n"
        + BAR.format(pct=10, done=20, rate="3.21")
        + BAR.format(pct=20, done=40, rate="3.40")
    )
    clock = Clock()
    [reading] = watch(spec(tmp_path), clock).check([7])
    assert (reading.job_id, reading.attempt, reading.at) == (7, 2, clock.now)
    assert (reading.done, reading.total, reading.rate, reading.unit) == (40, 200, 3.4, "it")
    assert reading.source == "tqdm"


def test_a_file_is_read_only_when_it_grew_and_not_more_often_than_the_interval(
    tmp_path: Path,
) -> None:
    out = tmp_path / "job.out"
    out.write_text("GPUQ_PROGRESS 10/100\n")
    clock = Clock()
    progress = watch(spec(tmp_path), clock, interval=5.0)
    assert progress.check([7])[0].done == 10
    # it grew, but the interval is not over: the last reading again, as of its read
    with out.open("a") as file:
        file.write("GPUQ_PROGRESS 20/100\n")
    clock.now += 1.0
    [again] = progress.check([7])
    assert (again.done, again.at) == (10, 1_000.0)
    clock.now += 5.0
    [grown] = progress.check([7])
    assert (grown.done, grown.at) == (20, clock.now)
    # unchanged since: not read (nothing), but the reading says it was looked at now
    clock.now += 5.0
    [quiet], read = bytes_read_by(lambda: progress.check([7]))
    assert read == 0
    assert (quiet.done, quiet.at) == (20, clock.now)


def test_the_file_whose_line_changed_last_wins_stderr_first(tmp_path: Path) -> None:
    (tmp_path / "job.out").write_text("GPUQ_PROGRESS 0.5\n")
    (tmp_path / "job.err").write_text(BAR.format(pct=10, done=20, rate="2.0"))
    clock = Clock()
    progress = watch(spec(tmp_path, "job.out", "job.err"), clock, interval=1.0)
    [first] = progress.check([7])
    assert first.source == "tqdm"  # both new at once: stderr, where tqdm writes
    clock.now += 2
    with (tmp_path / "job.out").open("a") as file:
        file.write("GPUQ_PROGRESS 0.75\n")
    [second] = progress.check([7])
    assert (second.source, second.done, second.total) == ("gpuq", 0.75, 1.0)


def test_output_without_progress_a_terminal_or_dev_null_gives_nothing(tmp_path: Path) -> None:
    (tmp_path / "job.out").write_text("epoch done\nloss 0.3\n")
    clock = Clock()
    assert watch(spec(tmp_path), clock).check([7]) == []
    assert watch(spec(tmp_path, out=""), clock).check([7]) == []  # an interactive job
    assert watch(spec(tmp_path, out="/dev/null"), clock).check([7]) == []  # another node
    assert watch(None, clock).check([7]) == []  # no launch spec


def test_a_job_no_longer_running_is_forgotten(tmp_path: Path) -> None:
    (tmp_path / "job.out").write_text("GPUQ_PROGRESS 1/2\n")
    progress = watch(spec(tmp_path), Clock())
    assert len(progress.check([7])) == 1
    assert progress.check([]) == []
    assert progress._jobs == {}


def test_a_huge_file_costs_its_tail_only(tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    with out.open("wb") as file:
        file.write(b"GPUQ_PROGRESS 1/100\n")  # far from the end: not read
        file.truncate(20 << 30)  # 20 GiB (sparse)
        file.seek(0, os.SEEK_END)
        file.write(b"\nGPUQ_PROGRESS 99/100\n")
    [reading], read = bytes_read_by(lambda: watch(spec(tmp_path), Clock()).check([7]))
    assert reading.done == 99
    assert TAIL <= read <= TAIL + 1024


def test_a_symlink_to_a_root_only_file_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("GPUQ_PROGRESS 42/43\n")
    secret.chmod(0o600)
    (tmp_path / "job.out").symlink_to(secret)
    found, read = bytes_read_by(lambda: watch(spec(tmp_path), Clock()).check([7]))
    assert found == [] and read == 0


def test_a_file_of_another_user_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "job.out").write_text("GPUQ_PROGRESS 42/43\n")  # this process's user's
    other = spec(tmp_path, uid=os.getuid() + 1, user="someone")
    assert watch(other, Clock()).check([7]) == []
    mine = spec(tmp_path, uid=os.getuid())
    assert len(watch(mine, Clock()).check([7])) == 1


@pytest.mark.timeout(10)
def test_a_fifo_is_neither_opened_for_reading_nor_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "job.out")
    found: list[object] = []
    reader = threading.Thread(
        target=lambda: found.append(watch(spec(tmp_path), Clock()).check([7]))
    )
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "reading a FIFO's progress blocked"
    assert found == [[]]


def test_a_job_started_again_or_whose_spec_was_unreadable_is_watched_anew(tmp_path: Path) -> None:
    (tmp_path / "job.out").write_text("GPUQ_PROGRESS 1/2\n")
    (tmp_path / "again.out").write_text("GPUQ_PROGRESS 5/9\n")
    specs: dict[int, LaunchSpec | None] = {1: None}
    attempt = 1
    progress = ProgressWatch(lambda job_id: specs[attempt], 5.0, Clock(), lambda job_id: attempt)
    assert progress.check([7]) == []  # its spec could not be read (yet)
    specs[1] = replace(spec(tmp_path), attempt=1)
    [first] = progress.check([7])
    assert (first.attempt, first.done) == (1, 1)
    attempt, specs[2] = 2, replace(spec(tmp_path, "again.out"), attempt=2)
    [second] = progress.check([7])
    assert (second.attempt, second.done) == (2, 5)
