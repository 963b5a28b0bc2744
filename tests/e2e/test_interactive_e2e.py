"""Interactive jobs end to end (issue 13): `gpuq run` and `gpuq alloc` run on a pseudo-terminal
of the test's (as a person's terminal), against a real coordinator and a real agent with fake
GPUs. The command sees its allocated GPU and its exit code comes back; Ctrl-C typed on the
terminal reaches the command as SIGINT; an alloc shell sees its GPUs and limits and its exit
ends the job.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cluster import Cluster

pytestmark = pytest.mark.timeout(120)
MIB = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("interactive"))
    try:
        cluster.start_coordinator()
        cluster.start_agent("a", "2xA100-80GB")
        yield cluster
    finally:
        cluster.close()


class Terminal:
    """`gpuq ARGS` on a pty of ours, as run from a person's terminal. Each one still running
    when its test ends is killed (its job is then cancelled: its terminal went away)."""

    started: list[subprocess.Popen[bytes]] = []

    def __init__(self, cluster: Cluster, *args: str, rows: int = 30, cols: int = 100) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = {**cluster.env, "TERM": "xterm", "GPUQ_CLI_HELPER": "off"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpuq.cli.main", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cluster.root,
            env=env,
            start_new_session=True,
        )
        os.close(slave)
        Terminal.started.append(self.process)
        self.master = master
        self.output = bytearray()

    def _read(self, timeout: float) -> bool:
        """Whatever came within `timeout`; False once the other end is closed."""
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: every holder of the slave closed it
            return False
        self.output += data
        return bool(data)

    def expect(self, pattern: str, timeout: float = 30.0) -> re.Match[bytes]:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern.encode())
        while (found := regex.search(self.output)) is None:
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(min(left, 0.2)):
                text = self.output.decode(errors="replace")
                raise AssertionError(f"no {pattern!r} in the terminal's output: {text!r}")
        return found

    def resize(self, rows: int, cols: int, *, signalled: bool = True) -> None:
        """As a terminal window does: the new size, then SIGWINCH (to the process itself:
        it has no controlling terminal here); `signalled=False`: a SIGWINCH not handled yet."""
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        if signalled:
            self.process.send_signal(signal.SIGWINCH)

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def wait(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            self._read(0.1)
        with contextlib.suppress(OSError):
            while self._read(0.05) and select.select([self.master], [], [], 0)[0]:
                pass
        code = self.process.wait(max(0.1, deadline - time.monotonic()))
        os.close(self.master)
        return code

    def job_id(self) -> int:
        return int(self.expect(r"gpuq: job (\d+) running on a").group(1))


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    yield
    while Terminal.started:
        process = Terminal.started.pop()
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_run_prints_the_allocated_gpu_and_returns_the_exit_code(cluster: Cluster) -> None:
    code = "import os; print('GPU=' + os.environ['CUDA_VISIBLE_DEVICES'])"
    term = Terminal(cluster, "run", "--gpus", "1", "--", sys.executable, "-c", code)
    job = term.job_id()
    uuid = term.expect(r"GPU=(\S+)\r\n").group(1).decode()
    assert term.wait() == 0
    assert [uuid] == list(cluster.job(job).gpus)
    assert cluster.job(job).state.value == "completed"

    term = Terminal(cluster, "run", "--quiet", "--", "sh", "-c", "echo bye; exit 7")
    term.expect("bye")
    assert term.wait() == 7
    assert b"gpuq:" not in term.output  # --quiet


def test_ctrl_c_reaches_the_command(cluster: Cluster) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *_: (print('GOT SIGINT', flush=True), sys.exit(42)))\n"
        "print('READY', flush=True)\n"
        "time.sleep(60)\n"
    )
    term = Terminal(cluster, "run", "--", sys.executable, "-c", code)
    term.job_id()
    term.expect("READY")
    term.type(b"\x03")
    term.expect("GOT SIGINT")
    assert term.wait() == 42


def test_alloc_gives_a_shell_with_the_allocation(cluster: Cluster) -> None:
    cpus = str(min(2, os.cpu_count() or 1))
    term = Terminal(cluster, "alloc", "--gpus", "1", "--cpus", cpus, "--mem", "512M")
    job = term.job_id()
    memory = "$(cat /sys/fs/cgroup/memory$(grep :memory: /proc/self/cgroup | cut -d: -f3)"
    memory += "/memory.limit_in_bytes 2>/dev/null || echo none)"
    term.type(f"echo GPUS=$CUDA_VISIBLE_DEVICES CPUS=$OMP_NUM_THREADS MEM={memory}\n".encode())
    found = term.expect(r"GPUS=(GPU-\S+) CPUS=(\d+) MEM=(\w+)")
    assert found.group(1).decode() == cluster.job(job).gpus[0]
    assert found.group(2).decode() == cpus
    if found.group(3) != b"none":  # a cgroup v1 memory hierarchy: the job's limit
        assert int(found.group(3)) == 512 * MIB
    term.resize(40, 120)  # the window changes: the shell's terminal follows
    term.type(b"stty size\n")
    term.expect(r"[^0-9]40 120\r\n")
    # keys typed before the SIGWINCH is handled still find the job's terminal resized
    term.resize(45, 130, signalled=False)
    term.type(b"stty size\n")
    term.expect(r"[^0-9]45 130\r\n")
    term.type(b"exit 5\n")
    assert term.wait() == 5
    assert cluster.job(job).state.value == "failed"


def test_interrupted_while_it_waits_the_job_is_cancelled(cluster: Cluster) -> None:
    term = Terminal(cluster, "run", "--begin", "now+1h", "--", "true")
    job = int(term.expect(r"gpuq: job (\d+) queued: ").group(1))
    term.process.send_signal(signal.SIGINT)  # Ctrl-C (the terminal is cooked while it waits)
    assert term.wait() == 130
    assert "went away" in cluster.wait_state(job, "cancelled").reason


def test_closing_the_terminal_cancels_the_job(cluster: Cluster, tmp_path: Path) -> None:
    term = Terminal(cluster, "run", "--", "sleep", "300")
    job = term.job_id()
    term.process.terminate()  # as a closed terminal window's SIGHUP would
    assert term.wait() == 128 + 15
    done = cluster.wait_state(job, "cancelled")
    assert "went away" in done.reason


def test_run_with_pipes_passes_bytes_and_the_end_of_input(cluster: Cluster) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpuq.cli.main", "run", "--", "sh", "-c", "cat; echo done"],
        input=b"one\ntwo\n",
        capture_output=True,
        cwd=cluster.root,
        env={**cluster.env, "GPUQ_CLI_HELPER": "off"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"one\ntwo\ndone\n"  # no echo, no \r\n: it is not a terminal
    assert re.search(rb"gpuq: job \d+ running on a", done.stderr)


def test_a_coordinator_restart_keeps_the_job_and_its_terminal(tmp_path: Path) -> None:
    """The coordinator restarts while the command runs: gpuq run attaches again within the
    grace, and the job's later output and exit code still come back."""
    cluster = Cluster(tmp_path)
    try:
        cluster.start_coordinator()
        cluster.start_agent("a", "1xA100-80GB")
        script = "echo first; sleep 8; echo second; exit 3"
        term = Terminal(cluster, "run", "--", "sh", "-c", script)
        term.job_id()
        term.expect("first")
        cluster.kill(cluster.coordinator)
        cluster.start_coordinator()
        term.expect("attaching again")
        term.expect("second", timeout=40)
        assert term.wait() == 3
    finally:
        cluster.close()
