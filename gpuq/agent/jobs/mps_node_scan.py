"""An MPS daemon gpuq did not start: a node-wide one would capture every CUDA job on the node.

The agent looks for one now and then (NodeWideMpsScan, at most every MPS_SCAN_EVERY seconds,
with its heartbeat); while one runs the node reports itself misconfigured and takes no work.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)
MPS_SCAN_EVERY = 1.0  # seconds between two looks for a node-wide MPS daemon, at least
# /proc/<pid>/comm is cut at 15 characters: nvidia-cuda-mps-control and nvidia-cuda-mps-server
# both read "nvidia-cuda-mps"
MPS_COMM = "nvidia-cuda-mps"
DEFAULT_PIPE_DIR = Path("/tmp/nvidia-mps")


class NodeWideMpsScan:
    """`is_ours`: whether a process is one of the agent's own MPS daemons (or their servers).
    `problem`: what the last look found (None: nothing)."""

    def __init__(self, is_ours: Callable[[int], bool]) -> None:
        self.is_ours = is_ours
        self.problem: str | None = None  # a node-wide MPS daemon runs (misconfigured)
        self._scanned = -float("inf")  # monotonic time of the last look

    def scan(self) -> None:
        """Look for an MPS daemon gpuq did not start (at most every MPS_SCAN_EVERY); one makes
        the node take no work (misconfigured) until it is gone. Blocking (/proc)."""
        if time.monotonic() - self._scanned < MPS_SCAN_EVERY:
            return
        self._scanned = time.monotonic()
        try:
            found = node_wide_mps(self.is_ours)
        except Exception:
            log.exception("looking for a node-wide MPS daemon failed")
            return
        if found != self.problem:
            if found is not None:
                log.error("%s", found)
            else:
                log.warning("the node-wide MPS daemon is gone")
            self.problem = found


def node_wide_mps(
    is_ours: Callable[[int], bool],
    *,
    proc: Path = Path("/proc"),
    default_pipe: Path = DEFAULT_PIPE_DIR,
) -> str | None:
    """Why the node is misconfigured by an MPS daemon gpuq did not start (None: none runs):
    a process whose comm is nvidia-cuda-mps(-control/-server) that is not ours, or the
    node-wide default pipe's control socket."""
    try:
        entries = list(os.scandir(proc))
    except OSError:
        entries = []
    wanted = MPS_COMM.encode()
    for entry in entries:
        if not entry.name.isdigit():
            continue
        raw = _comm(entry.path)
        if not raw.startswith(wanted):
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
