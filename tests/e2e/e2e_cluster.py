"""A real gpuq cluster for end-to-end tests: a coordinator and agents as separate processes,
fake GPUs, a real SQLite store in a temporary GPUQ_HOME, talking gRPC.

Every process started here, and every supervisor and job below them, carries a marker in its
environment; `Cluster.close` kills whatever still carries it, since supervisors are built to
outlive agents.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gpuq.client import Client
from gpuq.config.loading import load_settings
from gpuq.domain.model import Job
from gpuq.errors import GpuqError

T = TypeVar("T")
MARKER = "GPUQ_TEST_CLUSTER"


def wait_for(
    condition: Callable[[], T | None], timeout: float = 20.0, what: str = "condition"
) -> T:
    """Poll until condition() is truthy; its value. Fails the test at the deadline."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = condition()
        except GpuqError as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


ALLOW_ROOT = "allow_root_jobs = true\n"


# the harness's fencing: a node silent for NODE_TIMEOUT is given up; its jobs' supervisors
# stopped them FENCE_TIME after its last sign of life, and killed them KILL_GRACE later (the
# node timeout must leave room for both: gpuq.domain.policy.fence_wait). FENCE_TIME outlasts
# a coordinator restart, so that one costs no running job.
FENCE_TIME = 6.0
KILL_GRACE = 2.0
NODE_TIMEOUT = 9.0


def root_jobs_allowed(config: str, agent: str = "") -> str:
    """`config` (what follows the harness's [coordinator] lines) with root's jobs allowed on
    the coordinator and the agents (tests run as root in CI, and submit as themselves), and
    `agent` lines added to the [agent] section."""
    coordinator = ALLOW_ROOT + config
    if "[agent]\n" in coordinator:
        return coordinator.replace("[agent]\n", "[agent]\n" + ALLOW_ROOT + agent, 1)
    return coordinator + "\n[agent]\n" + ALLOW_ROOT + agent


class Cluster:
    def __init__(
        self,
        root: Path,
        config: str = "",
        *,
        fence_time: float = FENCE_TIME,
        node_timeout: float = NODE_TIMEOUT,
    ) -> None:
        self.root = root
        self.home = root / "home"
        self.home.mkdir(parents=True, mode=0o700)
        self.marker = uuid.uuid4().hex
        self.env = {**os.environ, "GPUQ_HOME": str(self.home), MARKER: self.marker}
        self.env.pop("GPUQ_CONFIG", None)
        (self.home / "config.toml").write_text(
            "[coordinator]\n"
            f'listen = "127.0.0.1:{free_port()}"\n'
            "heartbeat_interval = 0.3\n"
            f"heartbeat_timeout = {node_timeout}\n"
            f"kill_grace = {KILL_GRACE}\n"
            + root_jobs_allowed(config, f"fence_time = {fence_time}\n")
        )
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self._client: Client | None = None

    # ---- processes -----------------------------------------------------------------------

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{log_name}.log", "ab")  # noqa: SIM115 - lives with the process
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuq.cli.main",
                "--home",
                str(self.home),
                *args,
                "--log-level",
                "debug",
            ],
            cwd=self.root,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def start_coordinator(self) -> None:
        address_file = self.home / "coordinator.json"
        address_file.unlink(missing_ok=True)
        self.coordinator = self._spawn(["coordinator"], "coordinator")
        wait_for(lambda: address_file.exists(), what="the coordinator to listen")
        wait_for(lambda: self.client().nodes() is not None, what="a first RPC")

    @property
    def tcp_address(self) -> str:
        return str(json.loads((self.home / "coordinator.json").read_text())["tcp"])

    def start_agent(self, name: str, fake_gpus: str, tcp: bool = False) -> None:
        args = ["agent", "--node-name", name, "--fake-gpus", fake_gpus]
        if tcp:
            args += ["--coordinator", self.tcp_address]
        self.agents[name] = self._spawn(args, f"agent-{name}")
        self.wait_node(name, "up")

    def wait_node(self, name: str, state: str, timeout: float = 20.0) -> None:
        def ready() -> bool:
            nodes = {n.name: n for n in self.client().nodes()}
            node = nodes.get(name)
            up = node is not None and node.state == state
            if state != "up" or not up:
                return up
            # connected, and its GPUs reported by a first heartbeat (until then none is given
            # out, and a job would go to another node)
            return node.reason != "agent not connected" and (not node.gpus or bool(node.usage))

        wait_for(ready, timeout, f"node {name} to be {state}")

    def kill(self, process: subprocess.Popen[bytes] | None) -> None:
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(10)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        running = [p for p in [*self.agents.values(), self.coordinator] if p is not None]
        running = [p for p in running if p.poll() is None]
        for process in running:  # all at once: each takes a moment to stop
            process.terminate()
        for process in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
            self.kill(process)
        run_root = load_settings(home=self.home).agent_run_root
        # jobs do not inherit the marker (an agent drops GPUQ_* variables a user sets): a job
        # whose supervisor was killed is found by its folder (cwd under root, its script in
        # the agent's run folder)
        kill_marked(self.marker, (self.root, run_root))
        # job folders of agents that were killed (the default run folder is outside root)
        shutil.rmtree(run_root, ignore_errors=True)

    # ---- client side -----------------------------------------------------------------------

    def client(self) -> Client:
        if self._client is None:
            self._client = Client(settings=load_settings(home=self.home), timeout=10)
        return self._client

    def submit(self, command: str, **options: Any) -> int:
        options.setdefault("environ", self.env)
        options.setdefault("chdir", str(self.root))
        return self.client().submit(wrap=command, **options)

    def job(self, job_id: int) -> Job:
        return self.client().get(job_id)

    def wait_state(self, job_id: int, *states: str, timeout: float = 30.0) -> Job:
        return wait_for(
            lambda: (job := self.job(job_id)).state.value in states and job,
            timeout,
            f"job {job_id} to be {' or '.join(states)}",
        )

    def gpuq(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run the real `gpuq` command line."""
        return subprocess.run(
            [sys.executable, "-m", "gpuq.cli.main", *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def free_port() -> int:
    """A TCP port that was free a moment ago (kept across coordinator restarts in a test)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def kill_marked(marker: str, folders: tuple[Path, ...] = ()) -> None:
    """SIGKILL every process whose environment carries this test's marker, or whose working
    folder or command line lies in one of `folders` (a test's own jobs)."""
    needle = f"{MARKER}={marker}".encode()
    places = tuple(str(f.resolve()) + "/" for f in folders)
    for _ in range(3):
        found = False
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = Path(entry.path, "environ").read_bytes()
                ours = needle in environ.split(b"\0")
                if not ours and places:
                    cwd = os.readlink(Path(entry.path, "cwd")) + "/"
                    command = Path(entry.path, "cmdline").read_bytes().decode(errors="replace")
                    ours = cwd.startswith(places) or any(p in command for p in places)
            except OSError:
                continue
            if ours:
                found = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)
        if not found:
            return
        time.sleep(0.1)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True
