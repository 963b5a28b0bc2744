"""Where a step's output goes: srun's own stdout and stderr (the job's output file), each line
prefixed with "N: " under --label, or files named by --output / --error patterns (%t task,
%n node index, %N node name, %j job, %J job.step, %s step, %u user, %x job name, %% a percent
sign; a width such as %3t pads with zeros). A pattern without a per-task or per-node field
sends every task to the one file, as SLURM does.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
from collections.abc import Mapping

from gpuq.steps.task_layout import Layout

PATTERN_RE = re.compile(r"%(\d*)([%AaJjsNntuxX])")


def expand_pattern(
    pattern: str, layout: Layout, rank: int, job_id: str, step_id: int, environ: Mapping[str, str]
) -> str:
    task = layout.tasks[rank]

    def one(match: re.Match[str]) -> str:
        width, key = match.group(1), match.group(2)
        value: str
        if key == "%":
            return "%"
        if key == "t":
            value = str(rank)
        elif key == "n":
            value = str(task.node_id)
        elif key == "N":
            value = layout.nodes[task.node_id]
        elif key in "jA":
            value = job_id
        elif key == "J":
            value = f"{job_id}.{step_id}"
        elif key == "s":
            value = str(step_id)
        elif key == "u":
            value = environ.get("USER") or getpass.getuser()
        elif key == "x":
            value = environ.get("SLURM_JOB_NAME", "")
        else:
            value = "0"  # %a / %X: array fields, 0 outside arrays
        return value.zfill(int(width)) if width and value.isdigit() else value

    return PATTERN_RE.sub(one, pattern)


MAX_PARTIAL_LINE = 64 * 1024  # bytes of a line kept back waiting for its newline


class OutputRouter:
    """Writes each task's bytes where they belong; called from srun's main loop only."""

    def __init__(
        self,
        layout: Layout,
        label: bool,
        output: str | None,
        error: str | None,
        job_id: str,
        step_id: int,
        environ: Mapping[str, str],
        cwd: str,
        unbuffered: bool = False,
    ) -> None:
        self.layout = layout
        self.label = label
        # srun's default: whole lines, so two tasks' lines never interleave mid-line
        self.by_lines = label or not unbuffered
        self.patterns = {1: output, 2: error if error is not None else output}
        self.job_id = job_id
        self.step_id = step_id
        self.environ = environ
        self.cwd = cwd
        self.files: dict[str, int] = {}  # path -> fd, shared by the tasks that write there
        self.partial: dict[tuple[int, int], bytes] = {}

    def write(self, rank: int, fd: int, data: bytes) -> None:
        if not self.by_lines:
            self._put(rank, fd, data)
            return
        pending = self.partial.pop((rank, fd), b"") + data
        lines = pending.split(b"\n")
        rest = lines.pop()
        if len(rest) > MAX_PARTIAL_LINE:  # no newline for that long: passed on as it is
            lines.append(rest)
            rest = b""
            ends = [b"\n"] * (len(lines) - 1) + [b""]
        else:
            ends = [b"\n"] * len(lines)
        if lines:
            prefix = self._prefix(rank)
            self._put(
                rank, fd, b"".join(prefix + ln + end for ln, end in zip(lines, ends, strict=True))
            )
        if rest:
            self.partial[(rank, fd)] = rest

    def flush(self, rank: int) -> None:
        """A task ended: its last line without a newline goes out as it is."""
        for fd in (1, 2):
            rest = self.partial.pop((rank, fd), b"")
            if rest:
                self._put(rank, fd, self._prefix(rank) + rest)

    def _prefix(self, rank: int) -> bytes:
        return f"{rank}: ".encode() if self.label else b""

    def _put(self, rank: int, fd: int, data: bytes) -> None:
        pattern = self.patterns[fd]
        target = fd
        if pattern is not None:
            path = expand_pattern(
                pattern, self.layout, rank, self.job_id, self.step_id, self.environ
            )
            path = os.path.join(self.cwd, path)
            if path not in self.files:
                self.files[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            target = self.files[path]
        _write_all(target, data)

    def close(self) -> None:
        for rank in range(self.layout.ntasks):
            self.flush(rank)
        for fd in self.files.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.files.clear()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    with contextlib.suppress(BrokenPipeError):
        while view:
            written = os.write(fd, view)
            view = view[written:]
