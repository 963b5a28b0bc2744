"""What the benchmarks share about their processes: a marker every process of one benchmark run
carries in its environment (the daemons, and what they start: fork servers, supervisors, jobs,
which outlive an agent by design), and the one way to kill them all at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def kill_marked(variable: str, marker: str) -> int:
    """SIGKILL every process whose environment has `variable=marker`; how many were found."""
    needle = f"{variable}={marker}".encode()
    killed = 0
    for _ in range(5):
        found = False
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = Path(entry.path, "environ").read_bytes()
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                found = True
                killed += 1
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)
        if not found:
            break
        time.sleep(0.1)
    return killed
