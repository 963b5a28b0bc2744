"""A fake MPS control daemon for fake GPUs, with the real one's contract (nvidia-cuda-mps-control).

    python -m gpuq.agent.fake.mps_daemon -f
        the daemon, in the foreground (as `-f` of the real one)
    echo quit | python -m gpuq.agent.fake.mps_daemon
        a client: each stdin line goes to the daemon

Both read CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY (the defaults are the real ones'
node-wide /tmp/nvidia-mps and /var/log/nvidia-mps; gpuq always sets both) and
CUDA_VISIBLE_DEVICES. The daemon listens on the Unix socket `<pipe>/control`, writes
`<log>/control.log` ("... Started", the GPU, each command, "... Stopped") and `<pipe>/devices`
(the GPUs it serves, its CUDA_VISIBLE_DEVICES: its clients see them numbered from 0, as the
real server's do; gpu_state.fake_cuda_devices reads it), and stays until a
client sends `quit` (or it gets SIGTERM); it then removes `control` and exits 0. A client with
no daemon to talk to exits 1, as the real one does. Socket paths are bound relative to the pipe
folder, so a deep folder does not meet the Unix socket path limit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from pathlib import Path

DEFAULT_PIPE = "/tmp/nvidia-mps"
DEFAULT_LOG = "/var/log/nvidia-mps"
CONTROL = "control"
DEVICES = "devices"


def _folders() -> tuple[Path, Path]:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE)
    log = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG)
    return pipe, log


def _log(log: Path, text: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with open(log / "control.log", "a") as file:
        file.write(f"[{stamp}] {text}\n")


def daemon() -> int:
    pipe, log = _folders()
    pipe.mkdir(parents=True, exist_ok=True)
    log.mkdir(parents=True, exist_ok=True)
    os.chdir(pipe)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(CONTROL)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(CONTROL)
    server.listen(8)
    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        server.close()

    signal.signal(signal.SIGTERM, on_term)
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    Path(DEVICES).write_text(f"{gpu}\n")
    _log(log, f"Control daemon (fake) started, pid {os.getpid()}, devices {gpu or 'all'}")
    try:
        while not stopping:
            try:
                conn, _ = server.accept()
            except OSError:
                break
            with conn:
                data = b""
                while chunk := conn.recv(4096):
                    data += chunk
                    if data.endswith(b"\n"):
                        break
                command = data.decode(errors="replace").strip()
                _log(log, f"Command: {command}")
                if command == "quit":
                    with contextlib.suppress(OSError):
                        conn.sendall(b"\n")
                    stopping = True
                else:
                    with contextlib.suppress(OSError):
                        conn.sendall(b"fake\n")
    finally:
        with contextlib.suppress(OSError):
            server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(CONTROL)
        _log(log, "Control daemon (fake) stopped")
    return 0


def client() -> int:
    pipe, _ = _folders()
    for line in sys.stdin:
        command = line.strip()
        if not command:
            continue
        try:
            os.chdir(pipe)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(5.0)
                conn.connect(CONTROL)
                conn.sendall(f"{command}\n".encode())
                answer = conn.recv(4096)
        except OSError as error:
            print(f"Cannot find MPS control daemon process ({error})", file=sys.stderr)
            return 1
        sys.stdout.write(answer.decode(errors="replace"))
    return 0


def main(argv: list[str]) -> int:
    if "-f" in argv or "-d" in argv:
        return daemon()
    return client()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
