"""Outages fail fast: a coordinator whose SQLite store lives on a small tmpfs that fills up.
`gpuq submit` is answered at once, exit code 3, naming the store's problem ("storage
unavailable: disk full"), not after a minute of retries that blame the coordinator; `gpuq
queue` keeps working; once the disk has room again the next submission is taken and its job
runs, with no restart, and nothing taken before is lost.

Needs root (to mount the tmpfs); skipped otherwise (under CI=true, failed).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for
from helpers import skip_or_fail

from gpuq.domain.states import JobState

CHUNK = 64 << 10


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs (unmounted afterwards)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        skip_or_fail("needs root, to mount a small tmpfs")
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode:
        skip_or_fail(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(filler: Path) -> int:
    """Write `filler` until the disk is full (ENOSPC), as `dd if=/dev/zero` would; its size."""
    written = 0
    with open(filler, "wb", buffering=0) as out:
        chunk = CHUNK
        while chunk:
            try:
                written += out.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                chunk //= 2  # the last blocks too
    return written


def test_a_full_disk_fails_submissions_fast_and_recovery_loses_nothing(
    tmp_path: Path, small_disk: Path
) -> None:
    cluster = Cluster(
        tmp_path, f'database_url = "sqlite:///{small_disk}/gpuq.db"\nstore_write_timeout = 5.0\n'
    )
    try:
        cluster.start_coordinator()
        cluster.start_agent("a", "1xA100-80GB")
        before = cluster.submit("true")
        assert cluster.wait_state(before, "completed", "failed").state is JobState.COMPLETED

        held = cluster.submit("true", hold=True)
        filler = small_disk / "filler"
        assert fill(filler) > 0
        began = time.monotonic()
        refused = cluster.gpuq("submit", "--wrap", "true", timeout=60)
        took = time.monotonic() - began
        assert refused.returncode == 3, (refused.returncode, refused.stdout, refused.stderr)
        assert "storage unavailable: disk full" in refused.stderr, refused.stderr
        assert "did not answer" not in refused.stderr
        assert took < 10, f"gpuq submit took {took:.1f} s"

        queue = cluster.gpuq("queue")  # reads keep working
        assert queue.returncode == 0, queue.stderr
        assert str(held) in queue.stdout
        shown = cluster.gpuq("show", str(before))
        assert shown.returncode == 0 and "completed" in shown.stdout, shown
        cancel = cluster.gpuq("cancel", str(held))  # an edit fails fast too
        assert cancel.returncode == 3 and "storage unavailable" in cancel.stderr, cancel

        filler.unlink()  # room again: no restart
        taken = wait_for(
            lambda: (
                (r := cluster.gpuq("submit", "--parsable", "--wrap", "true")).returncode == 0 and r
            ),
            20,
            "a submission once the disk has room",
        )
        after = int(taken.stdout.strip())
        assert cluster.wait_state(after, "completed", "failed").state is JobState.COMPLETED
        assert cluster.job(before).state is JobState.COMPLETED  # nothing acknowledged is lost
        assert cluster.job(held).state is JobState.HELD
        assert cluster.gpuq("cancel", str(held)).returncode == 0
        assert cluster.coordinator is not None and cluster.coordinator.poll() is None
    finally:
        cluster.close()
