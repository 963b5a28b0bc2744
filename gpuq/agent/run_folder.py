"""Where an agent keeps job folders and the supervisors' socket (its run folder), made safely.

A root agent keeps them on tmpfs by default (they matter only while supervisors run, and a job
then costs no disk write), in a folder of this installation with a random name,
`/dev/shm/gpuq-<random>`: a fixed name in a world-writable folder could be made first by any
user, which would stop every root agent on the host (or worse, hand it a folder that user
controls). The folder is made with mkdir (which fails on any existing name, a link included:
another name is tried), its path is remembered in `<GPUQ_HOME>/agent/run-root` (next to the
nodes' state folders; a folder per node is made in it; gpuq.run_root reads it), and on reuse it
is accepted only if lstat says it is a folder (not a link), ours, and writable by nobody else;
otherwise a new one is made. A configured `[agent] run_dir` is checked the same way, and so are
the folders above it (root's or ours, writable by nobody else unless sticky): it fails with one
clear line, as the admin chose that folder.

Job folders must let a job's user execute its script (the supervisor runs it as the user): a
root agent's run folders are 0711 (anyone may pass through, nobody else may list or write),
spec.json and results 0600 root's, the script 0700 the user's (gpuq/agent/jobs/supervisors.py
and the supervisor).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from gpuq.config.settings import Settings
from gpuq.errors import InvalidInput
from gpuq.run_root import PREFIX, RECORD, TMPFS, recorded_root

ATTEMPTS = 100  # names tried before giving up (each taken name is someone's folder)


def folder_mode() -> int:
    """A run folder's mode: 0711 for a root agent (a job's user passes through to its script),
    0700 otherwise (jobs run as the agent's user)."""
    return 0o711 if os.geteuid() == 0 else 0o700


def agent_run_dir(settings: Settings) -> Path:
    """The node's folder for job folders and the supervisors' socket (see the module), made."""
    node = settings.agent.node_name
    if settings.agent.run_dir:
        root = checked_run_dir(Path(settings.agent.run_dir).expanduser())
        folder = root / node
        private_dir(folder, folder_mode())
        if noexec(folder):
            raise InvalidInput("agent.run_dir", str(root), "is mounted noexec: scripts run there")
        return folder
    if os.geteuid() != 0 or not TMPFS.is_dir() or noexec(TMPFS):
        return settings.agent_state_dir
    root = tmpfs_root(record_dir(settings))
    folder = root / node
    private_dir(folder, folder_mode())
    return folder


def record_dir(settings: Settings) -> Path:
    """Where the installation's tmpfs run folder is remembered: <GPUQ_HOME>/agent."""
    return settings.agent_state_dir.parent


def tmpfs_root(where: Path) -> Path:
    """This installation's folder on tmpfs: the one remembered in `where` while it is safe,
    else a new one with a random name (remembered there)."""
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = folder_mode()
    known = recorded_root(where)
    if known is not None:
        with contextlib.suppress(FileExistsError):
            os.mkdir(known, 0o700)  # gone (removed at a clean stop): the same name, if free
        if safe_folder(known) is None:
            os.chmod(known, mode)
            return known
    for _ in range(ATTEMPTS):
        path = TMPFS / f"{PREFIX}{secrets.token_hex(12)}"
        try:
            os.mkdir(path, 0o700)  # never an existing name, nor through a link
        except FileExistsError:
            continue
        if (problem := safe_folder(path)) is not None:  # pragma: no cover - ours by mkdir
            raise InvalidInput("agent run folder", str(path), problem)
        os.chmod(path, mode)
        chosen = _remember(where, path, replacing=known)
        if chosen != path:  # another agent of this installation remembered one first
            with contextlib.suppress(OSError):
                path.rmdir()
            return tmpfs_root(where)
        return path
    raise InvalidInput("agent run folder", str(TMPFS), f"no free name after {ATTEMPTS} tries")


def _remember(where: Path, path: Path, *, replacing: Path | None) -> Path | None:
    """Remember `path` in `where`; what is remembered after (another agent of the same
    installation, starting at the same moment, may have been first)."""
    tmp = where / f"{RECORD}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, f"{path}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if replacing is not None and recorded_root(where) == replacing:
            os.rename(tmp, where / RECORD)  # the remembered one is unsafe: replaced
        else:
            os.link(tmp, where / RECORD)  # only where none is remembered yet
    except FileExistsError:
        pass
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return recorded_root(where)


def safe_folder(path: Path) -> str | None:
    """Why `path` is not a folder only this user controls (None: it is): by lstat, a folder
    (not a link), owned by our euid, writable by nobody else."""
    try:
        info = path.lstat()
    except OSError as error:
        return f"cannot be looked at: {error.strerror}"
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if info.st_uid != os.geteuid():
        return f"is owned by uid {info.st_uid}, not by this agent's user (uid {os.geteuid()})"
    if info.st_mode & 0o022:
        return f"is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def private_dir(path: Path, mode: int = 0o700) -> None:
    """Make `path` (its parent is safe), or accept it only if safe_folder does; then `mode`."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    if (problem := safe_folder(path)) is not None:
        raise InvalidInput("agent run folder", str(path), problem)
    if stat.S_IMODE(path.lstat().st_mode) != mode:
        os.chmod(path, mode)


def checked_run_dir(path: Path) -> Path:
    """A configured run_dir, made if missing, and refused unless it and every folder above it
    are safe: it ours and writable by nobody else; each folder above it root's or ours and
    writable by nobody else unless sticky (/tmp). The real path (links resolved) is returned,
    so that a link swapped later does not move it."""
    if not path.is_absolute():
        raise InvalidInput("agent.run_dir", str(path), "is not an absolute path")
    if not path.exists():
        path.mkdir(parents=True, mode=0o700)
    real = Path(os.path.realpath(path))
    euid = os.geteuid()
    for above in reversed(real.parents):
        info = above.stat()
        if info.st_uid not in (0, euid):
            raise InvalidInput(
                "agent.run_dir", str(path), f"lies in {above}, owned by uid {info.st_uid}"
            )
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            raise InvalidInput(
                "agent.run_dir",
                str(path),
                f"lies in {above}, writable by others (mode {stat.S_IMODE(info.st_mode):04o})",
            )
    if (problem := safe_folder(real)) is not None:
        raise InvalidInput("agent.run_dir", str(path), problem)
    return real


def noexec(path: Path) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_NOEXEC)
