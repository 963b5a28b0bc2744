"""The fake NVML library's files: claims, fault names, device nodes, small readers.

Pure helpers of fake.nvml_library and fake.nvml_box (the files' grammar is in fake.gpu_state).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Any

import pynvml

PROCESS_KINDS = ("compute", "graphics", "mps")
GI_IDS = 7  # GPU instance ids 1..7, compute instance ids 0..6, as the fake hands them out
CI_IDS = 7


class Mismatch:
    """Marks "LibraryMismatch" in a fault file: NVMLLibraryMismatchError, not an NVMLError."""


def error_class(name: str) -> Any:
    """pynvml's NVMLError subclass for an error name ("GpuIsLost"), Mismatch, or None."""
    if name.lower() in ("librarymismatch", "nvmllibrarymismatcherror"):
        return Mismatch
    found = getattr(pynvml, f"NVMLError_{name.removeprefix('NVMLError_')}", None)
    return found if isinstance(found, type) and issubclass(found, pynvml.NVMLError) else None


def cap_minor(gpu: int, gi: int, ci: int | None) -> int:
    """Distinct capability minors per GPU, GI and CI (the real driver's are fixed per slot)."""
    base = 1 + gpu * GI_IDS * (CI_IDS + 1) + (gi - 1) * (CI_IDS + 1)
    return base if ci is None else base + 1 + ci


def make_char_device(path: Path, major: int, minor: int) -> None:
    """A character device node; an existing right one is kept, failures leave none."""
    with contextlib.suppress(OSError):
        info = path.lstat()
        if stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(major, minor):
            return
        path.unlink()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(path, 0o666)
    except OSError:
        with contextlib.suppress(OSError):
            path.unlink()


def read_claim(entry: Path) -> tuple[int, int, str] | None:
    """(pid, bytes, kind) of a claim file whose process the driver would still list; else None."""
    if not entry.name.isdigit():
        return None
    words = read_text(entry).split()
    if not words or not words[0].isdigit():
        return None
    pid, stuck = int(entry.name), "stuck" in words
    kind = next((w for w in words[1:] if w in PROCESS_KINDS), "compute")
    if not stuck and not pid_alive(pid):
        entry.unlink(missing_ok=True)  # NVML forgets a process that exited
        return None
    return pid, int(words[0]), kind


def socket_cpus(cpus: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if len(cpus) < 2:
        return cpus, cpus
    half = len(cpus) // 2
    return cpus[:half], cpus[half:]


def fake_bus_id(index: int) -> str:
    """00000000:1B:00.0 for GPU 0, then 3 buses apart: distinct and growing up to GPU 63."""
    return f"00000000:{0x1B + 3 * index:02X}:00.0"


def read_text(path: Path, *, keep_case: bool = False) -> str:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return text if keep_case else text.lower()


def fabric_state(text: str) -> tuple[int, str]:
    """(NVML fabric state, error name) a fake GPU's `fabric` file says: "not started", "in
    progress", "completed" (or no file), or an error name ("completed ERROR" alike): the
    registration completed with that error."""
    words = text.replace("_", " ").split()
    phrase = " ".join(words).lower()
    if phrase == "not started":
        return pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED, ""
    if phrase == "in progress":
        return pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, ""
    if words and words[0].lower() == "completed":
        words = words[1:]
    return pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, " ".join(words)


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def read_utilization(path: Path, now: float) -> int | None:
    """The percent a utilization file says now: one value, or a series "90 90 0 [every=S]"
    whose values follow each other every S seconds (default 1) from the file's last write,
    the last one holding; None when the file is missing or malformed."""
    try:
        words = path.read_text().split()
        written = path.stat().st_mtime
    except (OSError, UnicodeDecodeError):
        return None
    every = 1.0
    values: list[int] = []
    for word in words:
        key, _, value = word.partition("=")
        try:
            if key == "every" and value:
                every = max(float(value), 0.001)
            else:
                values.append(int(word))
        except ValueError:
            return None
    if not values:
        return None
    step = int(max(now - written, 0.0) / every)
    return min(max(values[min(step, len(values) - 1)], 0), 100)


def pid_alive(pid: int) -> bool:
    """Whether pid runs; a zombie does not (its CUDA context, and NVML entry, are gone)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    return not gone_or_zombie(pid)


def gone_or_zombie(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return Path("/proc/self/stat").exists()  # exited just now, unless there is no /proc
    except OSError:
        return False
    state = text.rpartition(")")[2].split()[:1]
    return state in (["Z"], ["X"])
