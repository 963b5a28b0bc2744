"""Running jobs' output files, checked at each heartbeat: their size against the job's
max_output (its QOS's, else the node's `[agent] max_output`), and whether they are still there.

A job whose output files (stdout and stderr of its launch spec, together) hold more than its
limit is ended failed, "output limit: ..." (the agent stops it through its supervisor, once).
An output file that was there and vanished while the job ran (removed, its folder removed, or
another file made at its path) is told to the coordinator in every heartbeat while the job
runs, and the coordinator notes it once in the job's events. Files are looked at with lstat (a
symlink is not followed); only regular files count, so /dev/null and a multi-node job's other
nodes (whose output goes to srun) are never watched. The rules are pure functions
(`over_limit`, `vanished`); OutputWatch keeps what each job's first look found.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpuq.agent.jobs.launch_spec import LaunchSpec
from gpuq.domain.units import format_size
from gpuq.v1 import agent_pb2 as apb

FileId = tuple[int, int]  # (st_dev, st_ino)


@dataclass(frozen=True, slots=True)
class Gone:
    """An output file that vanished: its folder too, or another file is at its path now."""

    path: str
    folder: bool = False
    replaced: bool = False


def over_limit(
    sizes: dict[str, int], limit: int | None, source: str = "[agent] max_output"
) -> str | None:
    """The end reason when the files (shown name -> bytes) hold more than `limit` together;
    None when they do not, or there is no limit."""
    total = sum(sizes.values())
    if not limit or total <= limit:
        return None
    names = sorted(sizes, key=lambda name: (-sizes[name], name))
    if len(names) == 1:
        held = f"{names[0]} is {format_size(total)}"
    else:
        held = f"{' and '.join(names)} hold {format_size(total)}"
    return f"output limit: {held}, over {source} {format_size(limit)}"


def vanished(
    path: str, first: FileId | None, now: os.stat_result | None, folder_there: bool
) -> Gone | None:
    """Whether the output file of a started job (first seen as `first`; None: not looked at
    before) vanished: `now` is lstat of its path now (None: nothing there), `folder_there`
    whether its folder still exists. A started job's files were made before it ran."""
    if now is None:
        return Gone(path, folder=not folder_there)
    if first is not None and (now.st_dev, now.st_ino) != first:
        return Gone(path, replaced=True)
    return None


@dataclass(slots=True)
class _Watched:
    attempt: int
    files: dict[str, str]  # absolute path -> the path as the spec names it
    limit: int | None
    first: dict[str, FileId] = field(default_factory=dict)  # regular files as first seen
    stopped: bool = False  # ended for its output once: not again


@dataclass(frozen=True, slots=True)
class Findings:
    over: list[tuple[int, str, float]]  # (job, end reason, its kill grace) to stop
    gone: list[apb.OutputGone]


class OutputWatch:
    def __init__(
        self, spec_of: Callable[[int], LaunchSpec | None], node_limit: int | None = None
    ) -> None:
        self.spec_of = spec_of  # a running job's launch spec (None: unknown)
        self.node_limit = node_limit  # [agent] max_output
        self._jobs: dict[int, _Watched] = {}
        self._grace: dict[int, float] = {}

    def check(self, running: Iterable[int]) -> Findings:
        """Look at the output files of the running jobs that started (their supervisors made
        the files before the jobs ran), blocking: call on a thread."""
        running = set(running)
        for job_id in [j for j in self._jobs if j not in running]:
            del self._jobs[job_id]
            self._grace.pop(job_id, None)
        over: list[tuple[int, str, float]] = []
        gone: list[apb.OutputGone] = []
        for job_id in sorted(running):
            watched = self._jobs.get(job_id) or self._watch(job_id)
            if watched is None:
                continue
            sizes: dict[str, int] = {}
            for path, shown in watched.files.items():
                info = _lstat(path)
                first = watched.first.get(path)
                if first is None and info is not None:
                    if stat.S_ISREG(info.st_mode):
                        watched.first[path] = (info.st_dev, info.st_ino)
                        sizes[os.path.basename(shown)] = info.st_size
                    continue  # anything else (a device) is not watched
                lost = vanished(shown, first, info, os.path.isdir(os.path.dirname(path)))
                if lost is not None:
                    gone.append(
                        apb.OutputGone(
                            job_id=job_id,
                            attempt=watched.attempt,
                            path=lost.path,
                            folder=lost.folder,
                            replaced=lost.replaced,
                        )
                    )
                if lost is None and info is not None:
                    sizes[os.path.basename(shown)] = info.st_size
            if watched.stopped:
                continue
            source = (
                "[agent] max_output"
                if watched.limit == self.node_limit
                else "the max_output of its QOS"
            )
            reason = over_limit(sizes, watched.limit, source)
            if reason is not None:
                watched.stopped = True
                over.append((job_id, reason, self._grace.get(job_id, 30.0)))
        return Findings(over, gone)

    def _watch(self, job_id: int) -> _Watched | None:
        spec = self.spec_of(job_id)
        if spec is None:
            return None
        named = {spec.stdout_path, spec.stderr_path} - {"", "/dev/null"}
        files = {os.path.join(spec.cwd, path): path for path in sorted(named)}
        watched = _Watched(spec.attempt, files, spec.max_output)
        self._jobs[job_id] = watched
        self._grace[job_id] = spec.kill_grace
        return watched


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None
