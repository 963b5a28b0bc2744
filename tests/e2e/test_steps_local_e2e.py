"""Job steps with real processes and real sockets, without a coordinator: two step workers on
127.0.0.2 and 127.0.0.3 (loopback addresses need no namespace) stand for the followers of a
3-node job, and srun (gpuq.steps.srun_main) runs as the batch script would, on "n0".

What a user relies on: every rank runs once with the right rank, node and GPUs; a failing rank
stops every other rank on every node within seconds and ends the job with a reason naming it;
a stranger without the job's key starts nothing; killing srun or losing its connection leaves
no task behind.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq.steps.step_wire import answer_challenge, recv, send

ROOT = Path(__file__).resolve().parents[2]
JOB_ID = "77"
NODES = ("n0", "n1", "n2")
ADDRS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
RUNNER = """
import pathlib, sys
from gpuq.steps import srun_main

def record(job_id: int, reason: str) -> None:
    pathlib.Path(sys.argv[1]).write_text(f"{job_id}\\n{reason}")

sys.exit(srun_main.main(sys.argv[2:], fail_job=record, fallback_pgid=None))
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((ADDRS[1], 0))
        port = int(probe.getsockname()[1])
    return port


def _node_env(base: dict[str, str], index: int) -> dict[str, str]:
    env = dict(base)
    env.update(
        GPUQ_NODE_INDEX=str(index),
        GPUQ_NODE=NODES[index],
        SLURM_NODEID=str(index),
        CUDA_VISIBLE_DEVICES=f"GPU-{NODES[index]}-a,GPU-{NODES[index]}-b",
    )
    return env


class Job:
    """The fake job: its environment, its two step workers, and srun runs in its folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.key = secrets.token_hex(32)
        self.port = _free_port()
        self.base = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(folder),
            "PYTHONPATH": str(ROOT),
            "TMPDIR": str(folder),
            "GPUQ_JOB_ID": JOB_ID,
            "GPUQ_JOB_NODES": ",".join(NODES),
            "GPUQ_NODE_ADDRS": ",".join(ADDRS),
            "GPUQ_STEP_PORT": str(self.port),
            "GPUQ_STEP_KEY": self.key,
            "GPUQ_TASKS_PER_NODE": "1",
            "GPUQ_GPUS_PER_TASK": "",
            "GPUQ_PYTHON": sys.executable,
            "SLURM_JOB_ID": JOB_ID,
            "SLURM_JOB_NAME": "steps-test",
            "SLURM_JOB_NODELIST": "n[0-2]",
            "SLURM_NNODES": "3",
            "SLURM_CPUS_ON_NODE": "4",
            "SLURM_GPUS_ON_NODE": "2",
            "MASTER_ADDR": ADDRS[0],
            "MASTER_PORT": "29511",
        }
        self.workers: list[subprocess.Popen[bytes]] = []
        (folder / "runner.py").write_text(RUNNER)
        (folder / "rec").mkdir()
        self.reason_file = folder / "fail_job"

    def start_workers(self) -> None:
        for index in (1, 2):
            log = open(self.folder / f"worker{index}.log", "wb")  # noqa: SIM115
            self.workers.append(
                subprocess.Popen(
                    [sys.executable, "-m", "gpuq.steps.step_worker"],
                    env=_node_env(self.base, index),
                    cwd=self.folder,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    start_new_session=True,
                )
            )
            log.close()
        deadline = time.monotonic() + 20
        for addr in ADDRS[1:]:
            while True:
                try:
                    socket.create_connection((addr, self.port), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, (self.folder / "worker1.log").read_text()
                    time.sleep(0.05)

    def srun(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(self.folder / "runner.py"), str(self.reason_file), *args],
            env=env or _node_env(self.base, 0),
            cwd=self.folder,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def stop(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    the_job = Job(tmp_path)
    the_job.start_workers()
    try:
        yield the_job
    finally:
        the_job.stop()


def sleepers(token: str) -> list[int]:
    """Pids of `sleep TOKEN` processes (any node: they all live on this machine)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if cmdline[:2] == [b"sleep", token.encode()] and state != "Z":
            found.append(int(entry))
    return found


def wait_for(what: str, check: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.05)


def sleep_token() -> str:
    return f"300.{random.randrange(10**6, 10**7)}"


def test_every_rank_runs_once_with_its_rank_node_and_gpus(job: Job) -> None:
    srun = job.srun(
        "sh",
        "-c",
        "echo $SLURM_PROCID $SLURM_NODEID $WORLD_SIZE $CUDA_VISIBLE_DEVICES "
        "$MASTER_ADDR:$MASTER_PORT > rec/$SLURM_PROCID",
    )
    _out, err = srun.communicate(timeout=30)
    assert srun.returncode == 0, err
    records = {p.name: p.read_text().split() for p in (job.folder / "rec").iterdir()}
    assert records == {
        str(i): [str(i), str(i), "3", f"GPU-{NODES[i]}-a,GPU-{NODES[i]}-b", "127.0.0.1:29511"]
        for i in range(3)
    }


def test_two_tasks_per_node_each_get_their_gpu_and_labelled_output(job: Job) -> None:
    srun = job.srun(
        "--ntasks-per-node=2",
        "--gpus-per-task=1",
        "-l",
        "sh",
        "-c",
        "echo $SLURM_LOCALID $LOCAL_WORLD_SIZE $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES",
    )
    out, err = srun.communicate(timeout=30)
    assert srun.returncode == 0, err
    lines = sorted(out.splitlines())
    assert lines == [
        f"{rank}: {rank % 2} 2 {NODES[rank // 2]} GPU-{NODES[rank // 2]}-{'ab'[rank % 2]}"
        for rank in range(6)
    ]


def test_a_failing_rank_stops_every_rank_and_ends_the_job(job: Job) -> None:
    token = sleep_token()
    started = time.monotonic()
    srun = job.srun(
        "sh", "-c", f'if [ "$SLURM_PROCID" = 1 ]; then sleep 0.5; exit 1; fi; exec sleep {token}'
    )
    _out, err = srun.communicate(timeout=30)
    took = time.monotonic() - started
    assert srun.returncode == 1, err
    assert took < 10, err
    wait_for("no sleeper left", lambda: not sleepers(token), 5)
    job_id, reason = job.reason_file.read_text().split("\n", 1)
    assert job_id == JOB_ID
    assert reason.startswith("task 1 on n1 exited 1 at "), reason
    assert reason.endswith("; tasks 0,2 were stopped"), reason


def test_keep_going_without_kill_on_bad_exit(job: Job) -> None:
    srun = job.srun(
        "-K0", "sh", "-c", 'if [ "$SLURM_PROCID" = 2 ]; then exit 3; fi; sleep 1; echo done'
    )
    out, err = srun.communicate(timeout=30)
    assert srun.returncode == 3, err
    assert out.split() == ["done", "done"]
    assert not job.reason_file.exists()


def test_a_wrong_key_starts_nothing_and_the_worker_serves_on(job: Job) -> None:
    env = _node_env(job.base, 0)
    env["GPUQ_STEP_KEY"] = secrets.token_hex(32)
    srun = job.srun("sh", "-c", "echo ran > rec/$SLURM_PROCID", env=env)
    _out, err = srun.communicate(timeout=30)
    assert srun.returncode != 0
    assert "n1: cannot reach its step worker" in err and "refused" in err, err
    assert list((job.folder / "rec").iterdir()) == []
    # a raw client with a wrong answer is cut off at once
    with socket.create_connection((ADDRS[1], job.port), timeout=5) as sock:
        challenge = recv(sock)
        assert challenge is not None and challenge["type"] == "challenge"
        send(sock, {"type": "auth", "mac": "0" * 64})
        assert recv(sock) is None
    srun = job.srun("sh", "-c", "echo ran > rec/$SLURM_PROCID")
    assert srun.wait(timeout=30) == 0
    assert sorted(p.name for p in (job.folder / "rec").iterdir()) == ["0", "1", "2"]


def test_terminating_srun_stops_every_task(job: Job) -> None:
    token = sleep_token()
    srun = job.srun("sleep", token)
    wait_for("three sleepers", lambda: len(sleepers(token)) == 3, 15)
    srun.send_signal(signal.SIGTERM)
    assert srun.wait(timeout=10) == 128 + signal.SIGTERM
    wait_for("no sleeper left", lambda: not sleepers(token), 5)


def test_killed_srun_leaves_no_remote_task(job: Job) -> None:
    token = sleep_token()
    srun = job.srun("sleep", token)
    wait_for("three sleepers", lambda: len(sleepers(token)) == 3, 15)
    local = set(sleepers(token))
    srun.kill()  # no chance to clean up: the workers see the connection drop
    srun.wait(timeout=10)
    try:
        wait_for("only srun's own child left", lambda: len(sleepers(token)) <= 1, 5)
    finally:
        for pid in sleepers(token):  # srun's own orphan: the job's cgroup takes it at the end
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert local


def test_a_dropped_connection_stops_the_workers_tasks(job: Job) -> None:
    token = sleep_token()
    sock = socket.create_connection((ADDRS[2], job.port), timeout=5)
    answer_challenge(sock, bytes.fromhex(job.key))
    send(
        sock,
        {
            "type": "start",
            "argv": ["sleep", token],
            "cwd": str(job.folder),
            "env": {"FOO": "bar"},
            "tasks": [{"rank": 0, "local_id": 0, "env": {}}],
            "gpus_per_task": None,
        },
    )
    started = recv(sock)
    assert started is not None and started["type"] == "started"
    wait_for("the sleeper", lambda: len(sleepers(token)) == 1, 10)
    sock.close()
    wait_for("no sleeper left", lambda: not sleepers(token), 5)
    # and the worker serves the next step
    srun = job.srun("true")
    assert srun.wait(timeout=30) == 0


def test_a_malformed_step_is_refused_and_the_worker_serves_on(job: Job) -> None:
    with socket.create_connection((ADDRS[1], job.port), timeout=5) as sock:
        answer_challenge(sock, bytes.fromhex(job.key))
        send(
            sock,
            {
                "type": "start",
                "argv": ["true"],
                "env": {"NOT-A-NAME": "x"},
                "tasks": [{"rank": 0, "local_id": 0, "env": {}}],
            },
        )
        refusal = recv(sock)
        assert refusal is not None and refusal["type"] == "error"
        assert "not a variable name: 'NOT-A-NAME'" in refusal["message"]
        assert recv(sock) is None
    with socket.create_connection((ADDRS[1], job.port), timeout=5) as sock:
        assert (recv(sock) or {}).get("type") == "challenge"
        sock.sendall(b"\xff" * 64)  # a frame far over the size limit
        with contextlib.suppress(ConnectionResetError):  # closed with our bytes unread
            assert recv(sock) is None
    srun = job.srun("true")
    assert srun.wait(timeout=30) == 0
