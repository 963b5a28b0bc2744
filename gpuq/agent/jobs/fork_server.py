"""The fork server: a clean, single-threaded helper that forks one supervisor per job.

A process that serves gRPC must not fork and run code before exec (about 4% of such children
crash), and a fresh interpreter per job costs tens of milliseconds. So the agent starts this
helper once, before it imports grpc, as a new interpreter that imports almost nothing and hands
over to the C loop in gpuq/agent/native (the extension module gpuq.agent._supervise): it forks a
supervisor per request, and the supervisors run C only, which keeps a `true` job near the cost
of its own fork and exec.

Protocol on the control socket (JSON lines): the agent sends `{"spawn": job_dir}`, the server
answers `{"job_dir": job_dir, "pid": N}` or `{"job_dir": job_dir, "error": text}`, in order.
At EOF (the agent is gone) the server exits; supervisors are in their own sessions and go on.
After 20 ms without a request the server forks the next supervisor ahead of its job (a spare,
`gpuq spare` in ps), and the next request hands it the folder instead of forking; the reply is
the same (see forkserver.c).

`ForkServer.start()` is the agent's side: call it before importing grpc.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys

from gpuq.agent.jobs.job_folder import ACK_WAIT_DEFAULT
from gpuq.errors import GpuqError


class ForkServer:
    """The agent's handle on a running fork server: its process and the control socket."""

    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.process = process
        self.sock = sock

    @classmethod
    def start(cls, ack_wait: float = ACK_WAIT_DEFAULT) -> ForkServer:
        """Start the helper as a fresh interpreter (no preexec_fn: safe even after grpc)."""
        if importlib.util.find_spec("gpuq.agent._supervise") is None:
            raise GpuqError(
                "gpuq's compiled part (gpuq.agent._supervise) is missing: install gpuq with pip, "
                "which needs a C compiler and the Python headers (in a source checkout: "
                "pip install -e .)"
            )
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # -P: nothing from the current folder on sys.path (a root agent must not import code from
        # wherever it was started, and a source checkout there lacks the compiled module)
        command = [sys.executable, "-P", "-S", "-c", serve_code(theirs.fileno(), ack_wait)]
        process = subprocess.Popen(
            command,
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            cwd="/",
            start_new_session=True,  # a Ctrl-C meant for `gpuq serve` must not reach it
        )
        theirs.close()
        return cls(process, ours)

    def close(self) -> None:
        """Close the control socket: the server sees EOF and exits; its supervisors go on."""
        self.sock.close()


def serve_code(fd: int, ack_wait: float) -> str:
    """What the helper runs: no site (its .pth files and their imports), no current folder, just
    the folder gpuq is installed in. Every page it holds is copied into each fork's page table,
    and this keeps it a third smaller than a full interpreter start (0.4 ms less per job)."""
    here = os.path.abspath(__file__)  # <root>/gpuq/agent/jobs/fork_server.py
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here))))
    return (
        f"import sys; sys.path.insert(0, {root!r}); from gpuq.agent import _supervise; "
        f"_supervise.serve({fd}, {float(ack_wait)!r})"
    )
