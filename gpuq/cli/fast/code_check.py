"""Whether a CLI helper's loaded code is still what is on disk (gpuq.cli.fast.helper_process):
a helper never runs old code, yet checks it on every call.

The fingerprint (mtime and size of every module of the gpuq package, and of the folders its
dependencies live in) costs 1.3-2 ms to take on 2 CPUs: 300 stats, a tenth of a warm call. So
each spare also holds an inotify watch on those folders, made before the fingerprint it
compares with: while the watch has seen nothing, nothing changed since that fingerprint was
taken, and a call skips the fingerprint (one poll, ~5 us). Once the watch has seen anything
(an edit, pip, a new __pycache__ folder), every call takes the fingerprint as before, until
the helper makes a fresh watch and fingerprint (CodeCheck.renewed).

No watch where inotify cannot see every change: folders on network or FUSE file systems
(a change made from another machine raises no event here), or when inotify is unavailable or
out of watches. There every call takes the fingerprint.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

Fingerprint = tuple[tuple[str, int, int], ...]

# what changes code: a file written, its times or mode set, files or folders made, removed or
# renamed, the folder itself removed or renamed
_MASK = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800
_IN_ONLYDIR = 0x01000000
_IN_NONBLOCK_CLOEXEC = os.O_NONBLOCK | os.O_CLOEXEC
# local file systems, where every change on this machine is a change anywhere (statfs f_type)
_LOCAL = frozenset(
    {
        0xEF53,  # ext2/3/4
        0x58465342,  # xfs
        0x9123683E,  # btrfs
        0x01021994,  # tmpfs
        0x794C7630,  # overlayfs
        0x2FC12FC1,  # zfs
        0xF2F52010,  # f2fs
        0x858458F6,  # ramfs
        0x3153464A,  # jfs
        0x52654973,  # reiserfs
    }
)


def code_folders(package: Path | None = None) -> tuple[list[str], list[str]]:
    """The gpuq package's folders (not __pycache__), and the folders that hold the CLI's
    dependencies (pip changes them when it installs)."""
    root = str(package or Path(__file__).resolve().parents[2])  # gpuq/
    found = [root]
    folders = [root]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False) and entry.name != "__pycache__":
                    found.append(entry.path)
                    folders.append(entry.path)
    sites = []
    for name in ("click", "grpc", "google.protobuf"):
        where = getattr(sys.modules.get(name), "__file__", None)
        if where:
            sites.append(os.path.dirname(os.path.dirname(where)))
    return found, sites


def code_fingerprint(package: Path | None = None) -> Fingerprint:
    """(name, mtime_ns, size) of every module and extension of the gpuq package, then of the
    folders of its dependencies."""
    folders, sites = code_folders(package)
    found = []
    for folder in folders:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.endswith((".py", ".so")) and not entry.is_dir():
                    st = entry.stat()
                    found.append((entry.path, st.st_mtime_ns, st.st_size))
    for site in sites:
        with contextlib.suppress(OSError):
            found.append((site, os.stat(site).st_mtime_ns, 0))
    return tuple(found)


class CodeWatch:
    """An inotify watch on folders; `fd` -1 when there is none (then it is never quiet)."""

    def __init__(self, folders: Iterable[str]) -> None:
        self.fd = -1
        folders = list(folders)
        if not all(_on_local_disk(folder) for folder in folders):
            return
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = int(libc.inotify_init1(_IN_NONBLOCK_CLOEXEC))
        except (OSError, AttributeError):
            return
        if fd < 0:
            return
        for folder in folders:
            if libc.inotify_add_watch(fd, os.fsencode(folder), _MASK | _IN_ONLYDIR) < 0:
                os.close(fd)  # out of watches, or a folder gone: no watch at all
                return
        self.fd = fd

    def quiet(self) -> bool:
        """Nothing seen since the watch was made (an overflow counts as something)."""
        if self.fd < 0:
            return False
        try:
            return not select.select([self.fd], [], [], 0)[0]
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


@dataclass
class CodeCheck:
    """The fingerprint of the code as loaded, and a watch made before it was taken."""

    known: Fingerprint
    watch: CodeWatch

    package: Path | None = None  # the gpuq package's folder (None: this one)

    @classmethod
    def taken(
        cls, loaded_before: Fingerprint | None = None, package: Path | None = None
    ) -> CodeCheck:
        """A watch, then the fingerprint. `loaded_before`: the fingerprint taken before the
        code was loaded; when the package changed since, the check never passes."""
        folders, sites = code_folders(package)
        watch = CodeWatch([*folders, *sites])
        known = code_fingerprint(package)
        if loaded_before is not None and known[: len(loaded_before)] != loaded_before:
            known = ()  # changed while loading: the first call finds it stale,
            watch.close()  # whatever the watch saw since
        return cls(known, watch, package)

    def unchanged(self) -> bool:
        """Whether the code on disk is the code as loaded (a poll while the watch is quiet)."""
        return self.watch.quiet() or code_fingerprint(self.package) == self.known

    def renewed(self) -> CodeCheck | None:
        """A fresh watch and fingerprint once this watch saw something that left the code as
        it was (a new __pycache__); self while quiet; None when the code changed."""
        if self.watch.quiet():
            return self
        fresh = CodeCheck.taken(package=self.package)
        if fresh.known != self.known:
            fresh.watch.close()
            return None
        return fresh


def _on_local_disk(folder: str) -> bool:
    """statfs(2)'s f_type is a local file system's."""
    buffer = ctypes.create_string_buffer(256)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.statfs(os.fsencode(folder), buffer) != 0:
            return False
    except (OSError, AttributeError):
        return False
    f_type = ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF
    return f_type in _LOCAL
