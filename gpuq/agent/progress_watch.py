"""Running jobs' progress, read from the tail of their own output (README "Progress and
throughput"): each heartbeat carries every running job's newest progress line
(gpuq.domain.progress.latest_progress) and when its output was last read; the coordinator
derives the throughput, the ETA and a collapse from them.

Cheap: a job's files are looked at no more often than [agent] sample_interval (a heartbeat in
between repeats the last reading); a file whose size did not change since it was last read is
not read again (two syscalls: gpuq.output_tail's `known_size`); at most TAIL bytes of it are
read. Safe: the agent is root and the paths are the user's, so every read goes through
gpuq.output_tail.read_output_tail with the job's uid: a symlink, a FIFO, a device or a file of
another user is skipped silently, never opened for reading. Only the node that runs a job's
script reads it (the others' output is /dev/null); an interactive job's output goes to its
terminal and has no file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpuq.agent.jobs.launch_spec import LaunchSpec
from gpuq.domain.progress import Progress, latest_progress
from gpuq.errors import GpuqError
from gpuq.output_tail import read_output_tail
from gpuq.v1 import agent_pb2 as apb

TAIL = 16 * 1024  # bytes of the end of each output file looked at
# a job's files are read again once this share of sample_interval has passed: a heartbeat due
# at the interval comes a moment early and must not skip a read
READ_SHARE = 0.8


@dataclass(slots=True)
class _File:
    path: str  # absolute
    size: int = -1  # at its last read (-1: never read)
    progress: Progress | None = None  # its newest progress line so far
    changed: float = 0.0  # when that line last changed (this agent's clock)


@dataclass(slots=True)
class _Job:
    attempt: int
    uid: int
    files: list[_File] = field(default_factory=list)  # stderr first: tqdm writes there
    read_at: float = 0.0  # when its files were last looked at (0: never)


class ProgressWatch:
    """What each running job's output says of its progress. `spec_of`: a running job's launch
    spec (None: unknown); `interval`: [agent] sample_interval; `attempt_of`: which start of a
    job runs now (a job started again is watched anew)."""

    def __init__(
        self,
        spec_of: Callable[[int], LaunchSpec | None],
        interval: float,
        clock: Callable[[], float] = time.time,
        attempt_of: Callable[[int], int] = lambda job_id: 0,
    ) -> None:
        self.spec_of = spec_of
        self.interval = interval
        self.clock = clock
        self.attempt_of = attempt_of
        # by job: its start and what is watched of it (None: no file to read)
        self._jobs: dict[int, tuple[int, _Job | None]] = {}

    def check(self, running: Iterable[int]) -> list[apb.JobProgress]:
        """The progress of each running (started) job whose output shows one, reading the
        files that are due (blocking: call on a thread)."""
        running = set(running)
        for job_id in [j for j in self._jobs if j not in running]:
            del self._jobs[job_id]
        now = self.clock()
        found: list[apb.JobProgress] = []
        for job_id in sorted(running):
            attempt = self.attempt_of(job_id)
            known = self._jobs.get(job_id)
            if known is None or known[0] != attempt:
                spec = self.spec_of(job_id)
                if spec is None:
                    continue  # unreadable now: looked for again at the next heartbeat
                known = self._jobs[job_id] = (attempt, _watch(spec))
            job = known[1]
            if job is None:
                continue
            if not 0 <= now - job.read_at < self.interval * READ_SHARE:
                job.read_at = now
                for watched in job.files:
                    _read(watched, job.uid, now)
            newest = _newest(job.files)
            if newest is not None:
                found.append(_message(job_id, job, newest))
        return found


def _watch(spec: LaunchSpec) -> _Job | None:
    """What to read of a started job: its output files, as its user (None: none)."""
    paths = [p for p in dict.fromkeys((spec.stderr_path, spec.stdout_path)) if _a_file(p)]
    if not paths:
        return None  # an interactive job's terminal, another node of a multi-node job
    uid = spec.uid if spec.uid is not None else os.getuid()
    files = [_File(os.path.join(spec.cwd, path)) for path in paths]
    return _Job(spec.attempt, uid, files)


def _a_file(path: str) -> bool:
    return path not in ("", "/dev/null")


def _read(watched: _File, uid: int, now: float) -> None:
    """The file's newest progress line, when it grew (or shrank) since it was last read."""
    try:
        data, size, _ = read_output_tail(watched.path, uid, TAIL, watched.size)
    except (GpuqError, OSError):
        return  # gone, not a regular file of the job's user: nothing to read
    if size == watched.size:
        return
    watched.size = size
    progress = latest_progress(data.decode("utf-8", errors="replace")) if data else None
    if progress is not None and progress != watched.progress:
        watched.progress = progress
        watched.changed = now


def _newest(files: list[_File]) -> Progress | None:
    """The progress line of the file whose line changed last (stderr first on a tie)."""
    shown = [(f.changed, f.progress) for f in files if f.progress is not None]
    return max(shown, key=lambda pair: pair[0], default=(0.0, None))[1]


def _message(job_id: int, job: _Job, progress: Progress) -> apb.JobProgress:
    message = apb.JobProgress(
        job_id=job_id,
        attempt=job.attempt,
        at=job.read_at,
        done=progress.done,
        unit=progress.unit,
        source=progress.source,
        label=progress.label,
    )
    if progress.total is not None:
        message.total = progress.total
    if progress.rate is not None:
        message.rate = progress.rate
    return message
