"""Opt-in GPU sharing through MPS: one private MPS control daemon per shared GPU in use.

A share job gets one GPU that the admin shares (gpuq.agent.jobs.mps_share); when the first
share job starts on it the agent starts an MPS control daemon for that GPU alone
(CUDA_VISIBLE_DEVICES = its UUID) with a private pipe and log folder,
`<run_dir>/mps/<id>/{pipe,log}` (never the node-wide /tmp/nvidia-mps), and sets the GPU's
compute mode to EXCLUSIVE_PROCESS where NVML permits (a failure is logged, not fatal: MPS works
without it); when the last share job on the GPU ends the daemon is told `quit` (then killed if
it stays) and the compute mode goes back to DEFAULT. An MPS server serves one Unix user at a
time: the pipe and log folders belong to the user the daemon was started for (0700; root reaches
them anyway), and a share job of another user is refused while it runs (the scheduler never
sends one). The job's environment names the folders and its limits (mps_share).

The daemon is started with a plain subprocess from the agent (no preexec_fn, no user=: DESIGN.md,
a process serving gRPC must not run Python between fork and exec), in a session of its own and
in the foreground (`nvidia-cuda-mps-control -f`, drivers 510 and later), so that the agent knows
its pid, reaps it and can kill its process group (the control daemon and its MPS server). Fake
GPUs get gpuq.agent.fake.mps_daemon, which keeps the real one's contract (the `control` socket in
the pipe folder, a log, `quit` from a client on stdin).

Like jobs, a daemon outlives an agent that stops while share jobs use it: its folder's
daemon.pid lets the next agent take it over (recover), and stop it after the last of them.

A daemon the admin left running outside gpuq would capture every CUDA job on the node: the
agent reports the node misconfigured (it takes no work) until it is gone (mps_node_scan).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpuq.agent.jobs.mps_share import MpsShare

log = logging.getLogger(__name__)

REAL_COMMAND = ("nvidia-cuda-mps-control",)
FAKE_COMMAND = (sys.executable, "-m", "gpuq.agent.fake.mps_daemon")
START_WAIT = 10.0  # seconds a new daemon has to make its control socket
QUIT_WAIT = 5.0  # seconds a daemon told `quit` has to exit before SIGKILL
COMPUTE_MODE_DEFAULT = 0
COMPUTE_MODE_EXCLUSIVE_PROCESS = 3
PID_FILE = "daemon.pid"  # in a GPU's folder: "PID UID GPU-UUID STARTTIME" of its daemon

SetComputeMode = Callable[[str, int], None]  # (GPU uuid, NVML compute mode); raises on failure


class MpsError(Exception):
    """A share job cannot start here (a daemon would not start, or serves another user)."""


def folder_name(uuid: str) -> str:
    """A short folder name for a GPU (Unix socket paths in it must stay under 108 bytes)."""
    body = uuid.split("-", 1)[-1].replace("-", "")
    return body[:12] or "gpu"


@dataclass(slots=True)
class _Daemon:
    uuid: str
    uid: int
    folder: Path
    process: subprocess.Popen[bytes] | None
    pid: int
    jobs: set[int] = field(default_factory=set)

    @property
    def pipe_dir(self) -> Path:
        return self.folder / "pipe"

    @property
    def log_dir(self) -> Path:
        return self.folder / "log"

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return _alive(self.pid)


class MpsDaemons:
    """The agent's MPS control daemons, one per shared GPU with share jobs on it."""

    def __init__(
        self,
        run_dir: Path,
        *,
        fake: bool,
        set_compute_mode: SetComputeMode | None = None,
        command: tuple[str, ...] | None = None,
    ) -> None:
        self.root = Path(run_dir).absolute() / "mps"
        self.command = command or (FAKE_COMMAND if fake else REAL_COMMAND)
        self.set_compute_mode = set_compute_mode
        self.daemons: dict[str, _Daemon] = {}  # GPU uuid -> its daemon
        self.job_gpu: dict[int, str] = {}  # share job -> its GPU
        self._locks: dict[str, asyncio.Lock] = {}
        self._stops: set[asyncio.Task[None]] = set()

    # ---- jobs ------------------------------------------------------------------------------

    async def acquire(
        self, job_id: int, uuid: str, uid: int, gid: int, *, percent: int, mem_limit: int
    ) -> MpsShare:
        """The GPU's daemon for this job (started for `uid` if none runs); MpsError when it
        cannot start or serves another user's jobs."""
        async with self._lock(uuid):
            daemon = self.daemons.get(uuid)
            if daemon is not None and not daemon.alive():
                log.warning("the MPS control daemon of GPU %s (pid %d) died", uuid, daemon.pid)
                await asyncio.to_thread(self._stop_sync, daemon)
                self.daemons.pop(uuid, None)
                daemon = None
            if daemon is not None and daemon.uid != uid:
                busy = sorted(daemon.jobs)
                if busy:
                    raise MpsError(
                        f"the MPS server of GPU {uuid} serves uid {daemon.uid} (jobs "
                        f"{', '.join(map(str, busy))}): one user at a time"
                    )
                await asyncio.to_thread(self._stop_sync, daemon)
                self.daemons.pop(uuid, None)
                daemon = None
            if daemon is None:
                daemon = await asyncio.to_thread(self._start_sync, uuid, uid, gid)
                self.daemons[uuid] = daemon
                await self._wait_ready(daemon)
            daemon.jobs.add(job_id)
            self.job_gpu[job_id] = uuid
            return MpsShare(str(daemon.pipe_dir), str(daemon.log_dir), percent, mem_limit)

    def recover(self) -> None:
        """Take over the daemons an earlier agent left for its running share jobs (each
        folder's daemon.pid: pid, uid, GPU and the process's start time, so that a reused
        pid is not taken for it). Call adopt() for the running share jobs, then
        stop_idle()."""
        try:
            folders = sorted(p for p in self.root.iterdir() if p.is_dir())
        except OSError:
            return
        for folder in folders:
            try:
                pid_text, uid_text, uuid, start = (folder / PID_FILE).read_text().split()
                pid, uid = int(pid_text), int(uid_text)
            except (OSError, ValueError):
                continue
            if _start_time(pid) != start or uuid in self.daemons:
                continue
            self.daemons[uuid] = _Daemon(uuid, uid, folder, None, pid)
            log.info("took over the MPS control daemon of GPU %s (pid %d)", uuid, pid)

    def stop_idle(self) -> None:
        """Stop (in the background) the daemons no share job uses."""
        for uuid, daemon in list(self.daemons.items()):
            if not daemon.jobs:
                self._stop_later(uuid)

    def adopt(self, job_id: int, uuid: str) -> None:
        """A share job that started before this agent did: its GPU's daemon (if this agent
        knows one) stays while the job runs."""
        self.job_gpu[job_id] = uuid
        if (daemon := self.daemons.get(uuid)) is not None:
            daemon.jobs.add(job_id)

    def release(self, job_id: int) -> None:
        """The job ended (or never started): the last share job on a GPU stops its daemon
        (in the background)."""
        uuid = self.job_gpu.pop(job_id, None)
        if uuid is None:
            return
        daemon = self.daemons.get(uuid)
        if daemon is None:
            return
        daemon.jobs.discard(job_id)
        if not daemon.jobs:
            self._stop_later(uuid)

    def _stop_later(self, uuid: str) -> None:
        task = asyncio.get_running_loop().create_task(self._stop_if_idle(uuid))
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    async def _stop_if_idle(self, uuid: str) -> None:
        async with self._lock(uuid):
            daemon = self.daemons.get(uuid)
            if daemon is None or daemon.jobs:
                return  # a new share job came first: it keeps the daemon
            self.daemons.pop(uuid, None)
            await asyncio.to_thread(self._stop_sync, daemon)

    async def close(self, *, all_daemons: bool = False) -> None:
        """The agent stops: stop the daemons no share job uses (every one with
        all_daemons); those of running share jobs stay for the next agent (recover)."""
        await asyncio.gather(*self._stops, return_exceptions=True)
        for uuid, daemon in list(self.daemons.items()):
            if all_daemons or not daemon.jobs:
                self.daemons.pop(uuid, None)
                await asyncio.to_thread(self._stop_sync, daemon)

    def pids(self) -> set[int]:
        return {d.pid for d in self.daemons.values()}

    def is_ours(self, pid: int) -> bool:
        """pid is one of this agent's daemons, or a process one of them started (its MPS
        server), or a daemon whose pipe folder lies in ours (an earlier agent's)."""
        ours = self.pids()
        current: int | None = pid
        for _ in range(4):
            if current is None or current <= 1:
                break
            if current in ours:
                return True
            current = _parent(current)
        pipe = _environ(pid).get("CUDA_MPS_PIPE_DIRECTORY", "")
        return bool(pipe) and Path(pipe).is_relative_to(self.root)

    # ---- daemons ---------------------------------------------------------------------------

    def _lock(self, uuid: str) -> asyncio.Lock:
        lock = self._locks.get(uuid)
        if lock is None:
            lock = self._locks[uuid] = asyncio.Lock()
        return lock

    def _env(self, uuid: str, folder: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
        env.update(
            CUDA_VISIBLE_DEVICES=uuid,
            CUDA_MPS_PIPE_DIRECTORY=str(folder / "pipe"),
            CUDA_MPS_LOG_DIRECTORY=str(folder / "log"),
        )
        return env

    def _start_sync(self, uuid: str, uid: int, gid: int) -> _Daemon:
        root = os.geteuid() == 0
        for path in (self.root, self.root / folder_name(uuid)):
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
            os.chmod(path, 0o711 if root else 0o700)  # the user passes through to the pipe
        folder = self.root / folder_name(uuid)
        for sub in ("pipe", "log"):
            path = folder / sub
            if path.is_symlink() or path.is_file():
                path.unlink()
            shutil.rmtree(path, ignore_errors=True)  # an earlier user's files
            os.mkdir(path, 0o700)
            if root:
                os.chown(path, uid, gid)  # the one user this daemon serves
        self._compute_mode(uuid, COMPUTE_MODE_EXCLUSIVE_PROCESS)
        out = open(folder / "log" / "agent-start.log", "ab")  # noqa: SIM115 (the child's)
        try:
            process = subprocess.Popen(
                [*self.command, "-f"],
                env=self._env(uuid, folder),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd="/",
                close_fds=True,
                start_new_session=True,
            )
        except OSError as error:
            self._compute_mode(uuid, COMPUTE_MODE_DEFAULT)
            raise MpsError(
                f"cannot start the MPS control daemon ({self.command[0]}): {error}"
            ) from error
        finally:
            out.close()
        with contextlib.suppress(OSError):
            text = f"{process.pid} {uid} {uuid} {_start_time(process.pid)}\n"
            (folder / PID_FILE).write_text(text)
        log.info(
            "started the MPS control daemon of GPU %s (pid %d, uid %d, %s)",
            uuid,
            process.pid,
            uid,
            folder,
        )
        return _Daemon(uuid, uid, folder, process, process.pid)

    async def _wait_ready(self, daemon: _Daemon) -> None:
        control = daemon.pipe_dir / "control"
        deadline = time.monotonic() + START_WAIT
        while not control.exists():
            if not daemon.alive() or time.monotonic() > deadline:
                self.daemons.pop(daemon.uuid, None)
                await asyncio.to_thread(self._stop_sync, daemon)
                raise MpsError(
                    f"the MPS control daemon of GPU {daemon.uuid} did not start (see "
                    f"{daemon.log_dir})"
                )
            await asyncio.sleep(0.02)

    def _stop_sync(self, daemon: _Daemon) -> None:
        """`quit` through the control client, then SIGKILL to its group if it stays."""
        if daemon.alive():
            try:
                subprocess.run(
                    list(self.command),
                    input=b"quit\n",
                    env=self._env(daemon.uuid, daemon.folder),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    cwd="/",
                    timeout=QUIT_WAIT,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as error:
                log.warning("telling the MPS daemon of GPU %s to quit: %s", daemon.uuid, error)
        deadline = time.monotonic() + QUIT_WAIT
        while daemon.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if daemon.alive():
            log.warning("the MPS daemon of GPU %s stays after quit: killing it", daemon.uuid)
            with contextlib.suppress(OSError):
                os.killpg(daemon.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(daemon.pid, signal.SIGKILL)
        if daemon.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.process.wait(QUIT_WAIT)
        with contextlib.suppress(OSError):
            (daemon.folder / PID_FILE).unlink()
        self._compute_mode(daemon.uuid, COMPUTE_MODE_DEFAULT)
        log.info("stopped the MPS control daemon of GPU %s", daemon.uuid)

    def _compute_mode(self, uuid: str, mode: int) -> None:
        if self.set_compute_mode is None:
            return
        try:
            self.set_compute_mode(uuid, mode)
        except Exception as error:  # not permitted (not root, a vGPU): MPS works without it
            log.warning("cannot set GPU %s's compute mode to %d: %s", uuid, mode, error)


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat.rpartition(b")")[2].split()
    return int(fields[1]) if len(fields) > 1 else None


def _environ(pid: int) -> Mapping[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _start_time(pid: int) -> str:
    """The process's start time (clock ticks since boot, /proc/PID/stat), "" when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return ""
    fields = stat.rpartition(b")")[2].split()
    return fields[19].decode() if len(fields) > 19 else ""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rpartition(b")")[2][1:2] not in (b"Z", b"")
