"""The fork server: a clean, single-threaded helper that forks one supervisor per job.

A process that serves gRPC must not fork and run Python before exec (about 4% of such children
crash), and a fresh interpreter per job costs tens of milliseconds. So the agent starts this
helper once, before it imports grpc, as a new interpreter; the helper imports everything a
supervisor needs and then forks a supervisor per request, which costs a fork.

Protocol on the control socket (JSON lines): the hub sends `{"spawn": job_dir}`, the server
answers `{"job_dir": job_dir, "pid": N}` or `{"job_dir": job_dir, "error": text}`, in order.
At EOF (the agent is gone) the server exits; supervisors are in their own sessions and go on.

`ForkServer.start()` is the agent's side: call it before importing grpc.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from gpuq.agent import supervisor as supervisor_module
from gpuq.agent.cgroups import memory_hierarchy


class ForkServer:
    """The agent's handle on a running fork server: its process and the control socket."""

    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.process = process
        self.sock = sock

    @classmethod
    def start(cls, ack_wait: float = supervisor_module.ACK_WAIT_DEFAULT) -> ForkServer:
        """Start the helper as a fresh interpreter (no preexec_fn: safe even after grpc)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        command = [sys.executable, "-m", "gpuq.agent.forkserver"]
        command += ["--fd", str(theirs.fileno()), "--ack-wait", repr(float(ack_wait))]
        process = subprocess.Popen(
            command,
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C meant for `gpuq serve` must not reach it
        )
        theirs.close()
        return cls(process, ours)

    def close(self) -> None:
        """Close the control socket: the server sees EOF and exits; its supervisors go on."""
        self.sock.close()


def _reap(signum: int, frame: object) -> None:
    """SIGCHLD: collect exited supervisors so that none stays a zombie."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _spawn(control: socket.socket, job_dir: str, ack_wait: float) -> dict[str, object]:
    try:
        pid = os.fork()
    except OSError as exc:
        return {"job_dir": job_dir, "error": f"fork failed: {exc.strerror}"}
    if pid != 0:
        return {"job_dir": job_dir, "pid": pid}
    code = 1
    try:  # pragma: no cover - runs in the forked supervisor, which replaces the SIGCHLD handler
        control.close()
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.setsid()
        code = supervisor_module.main(Path(job_dir), ack_wait)
    finally:
        os._exit(code)


def _answer(control: socket.socket, line: bytes, ack_wait: float) -> dict[str, object]:
    """One request's reply; a malformed request gets an error, in its place in the order."""
    try:
        job_dir = json.loads(line)["spawn"]
    except (ValueError, KeyError, TypeError):
        return {"job_dir": None, "error": f"malformed request {line[:200]!r}"}
    return _spawn(control, str(job_dir), ack_wait)


def serve(control: socket.socket, ack_wait: float) -> None:
    """Answer spawn requests until EOF. Blocking reads are fine: there is nothing else to do,
    and the SIGCHLD handler runs between them (Python retries the interrupted recv)."""
    signal.signal(signal.SIGCHLD, _reap)
    if os.geteuid() == 0:
        memory_hierarchy()  # cached, so supervisors inherit the answer
    # Every page this process holds is mapped into each fork and unmapped at its exit, and every
    # page a supervisor writes is copied: give back the heap that imports left free, and keep
    # the collector off the objects that exist now (it would write to all of them).
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
    gc.freeze()
    pending = b""
    while True:
        data = control.recv(65536)
        if not data:
            return
        pending += data
        *lines, pending = pending.split(b"\n")
        replies = []
        for line in lines:
            if line.strip():
                replies.append(_answer(control, line, ack_wait))
        if replies:
            control.sendall(b"".join(json.dumps(r).encode() + b"\n" for r in replies))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuq.agent.forkserver")
    parser.add_argument("--fd", type=int, required=True, help="the control socket's fd")
    parser.add_argument("--ack-wait", type=float, default=supervisor_module.ACK_WAIT_DEFAULT)
    args = parser.parse_args(argv)
    control = socket.socket(fileno=args.fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(ConnectionError):
        serve(control, args.ack_wait)
    return 0


if __name__ == "__main__":
    sys.exit(main())
