"""A private PostgreSQL cluster (initdb into a folder, a free port) that a test or a benchmark
may restart without breaking anyone else's database. Runs PostgreSQL as the postgres user
(through runuser): needs root and the server binaries."""

from __future__ import annotations

import glob
import subprocess
from pathlib import Path

from e2e_cluster import free_port


def pg_bin() -> Path | None:
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name or 0)
    )
    for path in reversed(found):
        if (Path(path) / "initdb").exists() and (Path(path) / "pg_ctl").exists():
            return Path(path)
    return None


class PrivatePostgres:
    """A PostgreSQL cluster in `root`, on 127.0.0.1:`port`, run as the postgres user."""

    def __init__(self, bin_dir: Path, root: Path) -> None:
        self.bin = bin_dir
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 60) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *args],
            check=True,
            capture_output=True,
            timeout=timeout,
            cwd=self.root,
        )

    def _pg_ctl(self, *args: str) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} "
            f"-c unix_socket_directories={self.root} -c fsync=off"
        )
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "pg.log"),
            "-w", "-t", "30", "-o", options, *args,
        )  # fmt: skip

    def start(self) -> None:
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
            "--auth=trust", "-E", "UTF8", "--no-sync",
        )  # fmt: skip
        self._pg_ctl("start")

    def restart(self) -> None:
        self._pg_ctl("-m", "fast", "restart")

    def stop_fast(self) -> None:
        self._pg_ctl("-m", "fast", "stop")

    def start_again(self) -> None:
        self._pg_ctl("start")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._pg_ctl("-m", "immediate", "stop")
