"""Where a coordinator listens: its home and Unix socket (made and removed safely), its TCP
addresses (checked before grpc tries, so a wrong one is one clear line), and its SQLite file.

The socket is bound under a private name and renamed into place, and removed at exit only if
it is still the file this coordinator made: grpc itself unlinks an existing socket when it
binds and unlinks its path when it stops, whoever's file is there.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from pathlib import Path

import grpc

from gpuq.config.settings import Settings
from gpuq.errors import GpuqError

UNIX_PATH_MAX = 107  # bytes in sockaddr_un.sun_path, less the NUL


def remove_if_same(path: Path, ident: tuple[int, int]) -> None:
    """Unlink `path` only if it is still the file `ident` names (never another's socket)."""
    with contextlib.suppress(OSError):
        info = path.lstat()
        if (info.st_dev, info.st_ino) == ident:
            path.unlink()


def prepare_home(home: Path, *, shared: bool) -> None:
    """GPUQ_HOME, made: 0711 for a coordinator that serves every user (root, or its service
    user: other users reach its sockets by name, nothing else), 0700 for a private one."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(home, 0o711 if shared else 0o700)


def private_sqlite_file(settings: Settings) -> None:
    """The default SQLite store, created 0600 before SQLite makes it with the umask's mode (its
    -wal and -shm files take the database file's): it holds every job's script and environment."""
    if settings.coordinator.database_url is not None:
        return
    path = settings.home / "gpuq.db"
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    for name in ("gpuq.db", "gpuq.db-wal", "gpuq.db-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(settings.home / name, 0o600)


def bind_tcp(
    server: grpc.aio.Server,
    address: str,
    credentials: grpc.ServerCredentials | None,
    setting: str,
) -> str:
    """Bind `address` (TLS with `credentials`, else plaintext); HOST:PORT as bound."""
    host = address.rpartition(":")[0]
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise GpuqError(
            f"cannot listen on {address} (in use?); set [coordinator] {setting} in the config"
        )
    return f"{host}:{bound}"


def check_listen(listen: str, setting: str = "listen") -> None:
    """One clear error, before grpc tries (and logs lines of its own), when the TCP address
    is in use or is not an address of this machine."""
    host, _, port_text = listen.rpartition(":")
    port = int(port_text)
    if port == 0:
        return
    try:
        found = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise GpuqError(f"cannot listen on {listen}: {exc.strerror}") from None
    problems: list[OSError] = []
    for family, kind, proto, _, address in found:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                problems.append(exc)
    in_use = [p for p in problems if p.errno == errno.EADDRINUSE]
    if in_use or len(problems) == len(found):
        problem = (in_use or problems)[0].strerror
        where = f"[coordinator] {setting} in the config"
        if setting == "listen":
            where += " (or --listen)"
        raise GpuqError(f"cannot listen on {listen}: {problem}; set {where}")
