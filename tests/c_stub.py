"""The C `gpuq` (gpuq/cli/fast/stub.c) for tests: built from this checkout, with the Python
stub beside it as an installation has it, and a fake CLI helper that records what stubs send.

`build_c_stub(folder)` compiles the C stub with -Wall -Wextra -Werror into folder/gpuq and
writes folder/gpuq-py (scripts/gpuq-py with this interpreter on its `#!` line, as pip
rewrites `#!python`), so a test runs exactly what `pip install` puts in a venv's bin.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from helpers import skip_or_fail

from gpuq.cli.fast import protocol

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "gpuq" / "cli" / "fast" / "stub.c"
CFLAGS = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror"]
Step = int | bytes | Callable[[socket.socket], None]


def build_c_stub(folder: Path, count: bool = False) -> Path:
    """folder/gpuq (the C stub) and folder/gpuq-py beside it; the path of the first. `count`:
    gpuq-py adds a line to folder/python-stub-runs each time it runs (python_stub_runs)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        skip_or_fail("needs a C compiler (cc), as `pip install` does")
    folder.mkdir(parents=True, exist_ok=True)
    built = subprocess.run(
        [compiler, *CFLAGS, "-o", str(folder / "gpuq"), str(SOURCE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    script = (REPO / "scripts" / "gpuq-py").read_text().split("\n", 1)[1]
    python_stub = folder / "gpuq-py"
    if count:
        real = folder / "gpuq-py.real"
        real.write_text(f"#!{sys.executable}\n{script}")
        real.chmod(0o755)
        runs = folder / "python-stub-runs"
        python_stub.write_text(f'#!/bin/sh\necho run >> "{runs}"\nexec "{real}" "$@"\n')
    else:
        python_stub.write_text(f"#!{sys.executable}\n{script}")
    python_stub.chmod(0o755)
    return folder / "gpuq"


def python_stub_runs(gpuq: Path) -> int:
    """How often the Python stub beside `gpuq` ran (build_c_stub with count=True)."""
    runs = gpuq.parent / "python-stub-runs"
    return len(runs.read_text().splitlines()) if runs.exists() else 0


@dataclass
class Call:
    """One connection to the fake helper: the request, and the answers it got."""

    request: protocol.Request
    exe: str  # the program that connected (/proc/PID/exe): the C stub, or Python
    answers: list[bytes] = field(default_factory=list)


class FakeHelper:
    """Listens on a helper's socket path and records each request; answers each with
    `script`'s next entry (PID then EXIT with that exit code, or STALE, DECLINED, or a
    function given the connection), the last one again when it runs out. PID names `pid` (a
    process of the test's own)."""

    def __init__(self, path: Path, script: list[Step], pid: int) -> None:
        self.path = path
        self.script = list(script)
        self.pid = pid
        self.calls: list[Call] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(16)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                credentials = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                exe = os.readlink(f"/proc/{struct.unpack('3i', credentials)[0]}/exe")
                request = protocol.read_request(conn)
                for fd in request.fds:
                    os.close(fd)
                call = Call(request, exe)
                self.calls.append(call)
                step = self.script[min(len(self.calls), len(self.script)) - 1]
                if callable(step):
                    step(conn)
                elif isinstance(step, int):
                    call.answers = [
                        protocol.answer(protocol.PID, self.pid),
                        protocol.answer(protocol.EXIT, step << 8),
                    ]
                else:
                    call.answers = [protocol.answer(step)]
                for data in call.answers:
                    conn.sendall(data)

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(10)
        self.path.unlink(missing_ok=True)


def installation_key(env: dict[str, str]) -> str:
    """The key a Python stub computes under `env` (a fresh interpreter: it depends on it)."""
    code = "from gpuq.cli.fast.protocol import installation_key; print(installation_key())"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd="/", capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()
