"""An MPS daemon gpuq did not start: a node-wide one would capture every CUDA job on the node.

The agent looks for one now and then (NodeWideMpsScan, at most every MPS_SCAN_EVERY seconds,
with its heartbeat); while one runs the node reports itself misconfigured and takes no work.
A look reads the comm of each process it has not seen twice before (a process is known by its
pid and its /proc folder's inode, so a reused pid is new), and every process's comm once every
MPS_RESCAN_EVERY seconds: reading every comm every heartbeat cost 8 ms a beat with 1,000
processes. A daemon is a new process (`nvidia-cuda-mps-control -d` forks it; a unit execs it in
a new one), found at the next look; a process seen twice that then execs the daemon itself is
found at the next full reading.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)
MPS_SCAN_EVERY = 1.0  # seconds between two looks for a node-wide MPS daemon, at least
# seconds between two looks that read every process's comm (the others read new processes')
MPS_RESCAN_EVERY = 60.0
# /proc/<pid>/comm is cut at 15 characters: nvidia-cuda-mps-control and nvidia-cuda-mps-server
# both read "nvidia-cuda-mps"
MPS_COMM = "nvidia-cuda-mps"
DEFAULT_PIPE_DIR = Path("/tmp/nvidia-mps")


class NodeWideMpsScan:
    """`is_ours`: whether a process is one of the agent's own MPS daemons (or their servers).
    `problem`: what the last look found (None: nothing)."""

    def __init__(
        self,
        is_ours: Callable[[int], bool],
        *,
        clock: Callable[[], float] = time.monotonic,
        proc: Path = Path("/proc"),
        default_pipe: Path = DEFAULT_PIPE_DIR,
    ) -> None:
        self.is_ours = is_ours
        self.clock = clock
        self.proc = proc
        self.default_pipe = default_pipe
        self.problem: str | None = None  # a node-wide MPS daemon runs (misconfigured)
        self._scanned = -float("inf")  # clock() of the last look
        self._rescanned = -float("inf")  # clock() of the last look that read every comm
        self._known = KnownProcesses()

    def scan(self) -> None:
        """Look for an MPS daemon gpuq did not start (at most every MPS_SCAN_EVERY); one makes
        the node take no work (misconfigured) until it is gone. Blocking (/proc)."""
        now = self.clock()
        if now - self._scanned < MPS_SCAN_EVERY:
            return
        self._scanned = now
        if now - self._rescanned >= MPS_RESCAN_EVERY:
            self._rescanned, self._known = now, KnownProcesses()
        try:
            found = node_wide_mps(
                self.is_ours, proc=self.proc, default_pipe=self.default_pipe, known=self._known
            )
        except Exception:
            log.exception("looking for a node-wide MPS daemon failed")
            return
        if found != self.problem:
            if found is not None:
                log.error("%s", found)
            else:
                log.warning("the node-wide MPS daemon is gone")
            self.problem = found


class KnownProcesses:
    """The processes whose comm need not be read again: (pid, /proc folder inode) of those
    read as something else than MPS in two looks running (`plain`), and of those read so in one
    (`once`): a process caught between its fork and its exec reads as its parent, and is read
    again at the next look."""

    def __init__(self) -> None:
        self.plain: set[tuple[str, int]] = set()
        self.once: set[tuple[str, int]] = set()

    def update(self, plain: set[tuple[str, int]], once: set[tuple[str, int]]) -> None:
        """What this look found: processes gone are forgotten."""
        self.plain, self.once = plain, once


def node_wide_mps(
    is_ours: Callable[[int], bool],
    *,
    proc: Path = Path("/proc"),
    default_pipe: Path = DEFAULT_PIPE_DIR,
    known: KnownProcesses | None = None,
) -> str | None:
    """Why the node is misconfigured by an MPS daemon gpuq did not start (None: none runs):
    a process whose comm is nvidia-cuda-mps(-control/-server) that is not ours, or the
    node-wide default pipe's control socket. `known`: processes whose comm is not read (and
    what this look learnt, kept there); None: every comm is read."""
    try:
        entries = list(os.scandir(proc))
    except OSError:
        entries = []
    wanted = MPS_COMM.encode()
    plain: set[tuple[str, int]] = set()
    once: set[tuple[str, int]] = set()
    for entry in entries:
        if not entry.name.isdigit():
            continue
        key = (entry.name, entry.inode())
        if known is not None and key in known.plain:
            plain.add(key)
            continue
        raw = _comm(entry.path)
        if not raw.startswith(wanted):
            if raw:  # b"": gone, or unreadable; read again
                (plain if known is not None and key in known.once else once).add(key)
            continue
        comm = raw.decode(errors="replace").strip()
        pid = int(entry.name)
        if is_ours(pid):
            continue
        name = _program(pid, proc) or comm
        return (
            f"misconfigured: a node-wide MPS daemon runs ({name}, pid {pid}): it would capture "
            "every CUDA job; stop it (echo quit | nvidia-cuda-mps-control)"
        )
    if known is not None:
        known.update(plain, once)
    control = default_pipe / "control"
    if control.exists():
        return (
            f"misconfigured: a node-wide MPS daemon's {control} exists: it would capture every "
            "CUDA job; stop the daemon (echo quit | nvidia-cuda-mps-control) or remove it"
        )
    return None


def _comm(process_dir: str) -> bytes:
    """A process's comm (b"" once it is gone): the scan reads one per process every heartbeat,
    so with plain os calls (a third of what pathlib costs)."""
    try:
        fd = os.open(os.path.join(process_dir, "comm"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, 64)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _program(pid: int, proc: Path = Path("/proc")) -> str:
    try:
        argv0 = (proc / str(pid) / "cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return ""
    return os.path.basename(argv0.decode(errors="replace"))
