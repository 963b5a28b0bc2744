"""Starting a CLI helper (gpuq.cli.fast.helper_process), from the stub's slow path after a
call that found none, and stopping helpers (tests, benchmarks, `gpuq` upgrades by hand)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
import time
from pathlib import Path

# what the helper's own environment keeps of the first caller's (each call brings its own)
KEPT_VARS = frozenset({"PATH", "HOME", "LANG", "TMPDIR", "USER", "LOGNAME", "XDG_RUNTIME_DIR"})
KEPT_PREFIXES = ("LC_", "PYTHON", "GPUQ_CLI_HELPER", "GRPC_")
BOOT = (
    "import sys; sys.path[0] = sys.argv[2]; "
    "from gpuq.cli.fast.helper_process import serve; serve(sys.argv[1])"
)


def start_helper(path: str) -> None:
    """Start a helper for `path` in the background (its own session, stdio on /dev/null, an
    environment of its own). A second one, started at the same time, finds the lock taken and
    leaves. Never fails the caller."""
    package_parent = str(Path(__file__).resolve().parents[3])  # above gpuq/cli/fast/
    env = {k: v for k, v in os.environ.items() if k in KEPT_VARS or k.startswith(KEPT_PREFIXES)}
    try:
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.posix_spawn(
            sys.executable,
            [sys.executable, "-c", BOOT, path, package_parent],
            env,
            file_actions=[(os.POSIX_SPAWN_DUP2, devnull, fd) for fd in (0, 1, 2)],
            setsid=True,
        )
    except OSError:
        pass
    finally:
        os.close(devnull)


def stop_helpers(folder: Path, timeout: float = 10.0) -> list[int]:
    """SIGTERM every helper serving a socket in `folder` and wait until each has let go of its
    lock (SIGKILL at the deadline); their pids. For tests and for `gpuq` upgrades by hand."""
    held = {}
    for lock in folder.glob("cli-*.lock"):
        pid = _holder(lock)
        if pid:
            held[lock] = pid
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for lock, pid in held.items():
        while _holder(lock) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _holder(lock):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return list(held.values())


def _holder(lock: Path) -> int | None:
    """The pid of the helper holding `lock` (it writes its pid there), or None when free."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            text = os.pread(fd, 32, 0).strip()
            return int(text) if text.isdigit() else None
        return None  # we got it, so nobody holds it; closing lets go
    finally:
        os.close(fd)
