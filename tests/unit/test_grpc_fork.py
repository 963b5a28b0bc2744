"""gRPC's fork support is off in gpuq's processes (gpuq/__init__.py): with it on, gRPC 1.81+
restarts its pollers in every forked child, and a child that closes fds before exec (subprocess
with user=, group=, close_fds) now and then dies of SIGSEGV on "epoll_wait error: Bad file
descriptor" (seen in CI: a `gpuq` run as another user, from a test holding a client, exited
-11). Checked by the cause, which is certain, not by the crash, which is rare: after a fork,
the child of a process with a live channel runs no gRPC thread."""

from __future__ import annotations

import os
import subprocess
import sys

CHILD_THREADS = """
import os, sys, time
{setup}
import grpc
from concurrent import futures
server = grpc.server(futures.ThreadPoolExecutor(2))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
channel = grpc.insecure_channel(f"127.0.0.1:{{port}}")
grpc.channel_ready_future(channel).result(timeout=10)
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    deadline = time.monotonic() + 0.5  # a restarted poller starts within this
    while time.monotonic() < deadline and len(os.listdir("/proc/self/task")) == 1:
        time.sleep(0.01)
    os.write(write, str(len(os.listdir("/proc/self/task"))).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(read, 16).decode())
"""


HUNG = -1  # the process never finished: stuck in gRPC's fork handlers (its default's hazard)


def _child_threads(setup: str, timeout: float = 60) -> int:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    env["GRPC_VERBOSITY"] = "ERROR"
    try:
        result = subprocess.run(
            [sys.executable, "-c", CHILD_THREADS.format(setup=setup)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
    except subprocess.TimeoutExpired:
        return HUNG
    return int(result.stdout.strip())


def test_a_forked_child_of_a_gpuq_process_runs_no_grpc_thread() -> None:
    assert _child_threads("import gpuq") == 1


def test_without_gpuq_grpc_would_start_threads_in_the_child() -> None:
    """The control: the check above sees what it claims to (gRPC's default acts in a fork: it
    restarts its pollers in the child, or now and then hangs in its fork handlers, as CI saw
    once; a child that runs one thread and ends is what would fail it)."""
    threads = _child_threads("", timeout=20)
    assert threads > 1 or threads == HUNG


def test_a_caller_keeps_its_own_setting() -> None:
    code = (
        "import os; os.environ['GRPC_ENABLE_FORK_SUPPORT'] = 'true'; import gpuq; "
        "print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "true"
