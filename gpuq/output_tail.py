"""The tail of a job's output file, read by a process that may be root (the dashboard's
coordinator, the agent reading progress and an ended job's evidence) from a path the job's user
chose: only a regular file of that user, opened so that no link, FIFO or device is ever read or
opened for reading (README "Dashboard")."""

from __future__ import annotations

import os
import stat
from typing import Any

from gpuq.errors import NotFound, PermissionDenied

LOG_TAIL = 64 * 1024  # bytes of a job's output the log view shows


def read_tail(path: str, uid: int) -> dict[str, Any]:
    """The dashboard's log view: the last LOG_TAIL bytes of a job's output file, as text."""
    data, size, start = read_output_tail(path, uid, LOG_TAIL)
    return {
        "path": path,
        "text": data.decode("utf-8", errors="replace"),
        "size": size,
        "truncated": start > 0,
    }


def read_output_tail(
    path: str, uid: int, limit: int, known_size: int = -1
) -> tuple[bytes, int, int]:
    """The last `limit` bytes of a job's output file, its size and where they start: only a
    regular file owned by the job's user (`uid`). `known_size`: when the file still has that
    size, nothing is read (b"" comes back): a reader polling a quiet file costs two syscalls.
    The reader may be root and the path is the user's, so the path is first
    opened O_PATH (nothing is opened for reading: no FIFO blocks, no device sees an open), its
    final symlink not followed; only a regular file of that user is then opened for reading,
    through /proc/self/fd, so the file read is the one checked."""
    if not path.startswith("/"):
        raise NotFound(f"{path}: not an absolute path")
    refused = f"{path}: not readable from the coordinator (not a regular file of the job's user)"
    try:
        handle = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotFound(f"{path}: no such file on the coordinator's machine") from None
    except OSError:
        raise PermissionDenied(refused) from None
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
            raise PermissionDenied(refused)
        try:
            fd = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:
            raise PermissionDenied(refused) from None
    finally:
        os.close(handle)
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - limit)
        data = b"" if size == known_size else os.pread(fd, limit, start)
    finally:
        os.close(fd)
    return data, size, start
