"""Throwaway Unix users for tests of who a job runs as (real accounts, real processes).

`unix_user` (a fixture) makes a user named gpuqt_<hex> with a group of its own, an extra
supplementary group and a private home (0700, theirs) in a temporary folder; at teardown it
kills what the user still runs, then removes the user, the groups and their files. `run_as`
runs a Python command as such a user: with /usr/bin/python3 (the system's 3.11, the venv's ABI;
the `python3` on PATH may be pyenv's under /root, which is 0700) and a PYTHONPATH that reaches
this checkout's gpuq package and the venv's site-packages: in place when every user can read
them, else from a world-readable copy made once per session (CI's checkout may live in /root).

Everything here needs root; without it the fixtures skip (CI runs as root).
"""

from __future__ import annotations

import atexit
import contextlib
import grp
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import skip_or_fail

import gpuq

SYSTEM_PYTHON = "/usr/bin/python3"
CHECKOUT_PACKAGE = Path(gpuq.__file__).parent
SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])


@dataclass(frozen=True, slots=True)
class UnixUser:
    name: str
    uid: int
    gid: int  # its primary group (of its own name)
    extra_group: str  # a supplementary group it is a member of
    extra_gid: int
    home: Path  # 0700, its own


def needs_root() -> None:
    if os.geteuid() != 0:
        skip_or_fail("needs root to make Unix users (CI runs as root)")
    for tool in ("useradd", "userdel", "groupadd", "groupdel"):
        if shutil.which(tool) is None:
            skip_or_fail(f"needs {tool}")


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=60)


def make_user(homes: Path) -> UnixUser:
    """A new user with a home of its own below `homes` (which must be 0755 or so)."""
    name = f"gpuqt_{secrets.token_hex(4)}"
    extra = f"{name}x"
    home = homes / name
    _run("groupadd", extra)
    try:
        _run(
            "useradd",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            str(home),
            "--shell",
            "/bin/sh",
            "--groups",
            extra,
            name,
        )
    except subprocess.CalledProcessError:
        with contextlib.suppress(subprocess.CalledProcessError):
            _run("groupdel", extra)
        raise
    entry = pwd.getpwnam(name)
    home.mkdir(mode=0o700)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    home.chmod(0o700)
    return UnixUser(name, entry.pw_uid, entry.pw_gid, extra, grp.getgrnam(extra).gr_gid, home)


def remove_user(user: UnixUser) -> None:
    """Kill what the user runs, then remove the user, its groups and its home."""
    for pid in _processes_of(user.uid):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    _retry("userdel", user.name)
    for group in (user.name, user.extra_group):
        _retry("groupdel", group)
    shutil.rmtree(user.home, ignore_errors=True)


def _retry(tool: str, name: str) -> None:
    """userdel/groupdel, again while another process holds the password files' lock (exit
    10, or 1 with "cannot lock"); a name already gone (6) is fine."""
    for _ in range(50):
        result = subprocess.run([tool, name], capture_output=True, text=True, timeout=60)
        if result.returncode in (0, 6) or "does not exist" in result.stderr:
            return
        time.sleep(0.1)


def _processes_of(uid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    found.append(int(entry))
    return found


@pytest.fixture(scope="session")
def user_homes() -> Iterator[Path]:
    """A folder every user may pass through, for the test users' homes."""
    needs_root()
    homes = Path(tempfile.mkdtemp(prefix="gpuqt-homes-"))
    homes.chmod(0o755)
    try:
        yield homes
    finally:
        shutil.rmtree(homes, ignore_errors=True)


@pytest.fixture
def unix_user(user_homes: Path) -> Iterator[UnixUser]:
    user = make_user(user_homes)
    try:
        yield user
    finally:
        remove_user(user)


@pytest.fixture
def two_users(user_homes: Path) -> Iterator[tuple[UnixUser, UnixUser]]:
    first, second = make_user(user_homes), make_user(user_homes)
    try:
        yield first, second
    finally:
        remove_user(first)
        remove_user(second)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A folder every user may pass through, for a cluster whose sockets they call."""
    needs_root()
    folder = Path(tempfile.mkdtemp(prefix="gpuqt-cluster-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def readable_by_all(path: Path) -> bool:
    """Whether any user can read `path`: every folder above it passable by others, it readable."""
    path = path.resolve()
    for above in reversed(path.parents):
        if not above.stat().st_mode & stat.S_IXOTH:
            return False
    return bool(path.stat().st_mode & stat.S_IROTH)


_COPY: list[Path] = []


def user_pythonpath() -> str:
    """A PYTHONPATH any user can read with gpuq and the venv's packages (see the module)."""
    parts = [CHECKOUT_PACKAGE.parent, SITE_PACKAGES]
    if all(readable_by_all(part) for part in parts):
        return os.pathsep.join(str(part) for part in parts)
    if not _COPY:
        root = Path(tempfile.mkdtemp(prefix="gpuqt-python-"))
        root.chmod(0o755)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        shutil.copytree(CHECKOUT_PACKAGE, root / "src" / "gpuq", ignore=ignore)
        shutil.copytree(SITE_PACKAGES, root / "site", ignore=ignore, symlinks=True)
        subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
        _COPY.append(root)
        atexit.register(shutil.rmtree, root, True)
    root = _COPY[0]
    return os.pathsep.join([str(root / "src"), str(root / "site")])


def run_as(
    user: UnixUser,
    args: Sequence[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """`python3 ARGS` as `user` (its uid, primary group and supplementary groups), in its home
    unless `cwd` says otherwise, with a PYTHONPATH that reaches gpuq."""
    environ = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(user.home),
        "USER": user.name,
        "LOGNAME": user.name,
        "PYTHONPATH": user_pythonpath(),
        "PYTHONDONTWRITEBYTECODE": "1",
        **(env or {}),
    }
    python = SYSTEM_PYTHON if Path(SYSTEM_PYTHON).exists() else sys.executable
    return subprocess.run(
        [python, *args],
        cwd=cwd or user.home,
        env=environ,
        user=user.uid,
        group=user.gid,
        extra_groups=[user.gid, user.extra_gid],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
