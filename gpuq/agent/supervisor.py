"""The per-job supervisor: the job's parent, forked by the fork server, one per job.

It owns everything about one run so that the agent can die and come back without the job
noticing: it writes the script, forks and execs the job, enforces the time and memory limits,
kills every leftover process when the job ends, writes result.json durably, and tells the agent
(the hub) over a Unix socket, reconnecting while the agent restarts. It has no threads and sleeps
in poll() unless a timer (time limit, memory poll, reconnect) is due, so a short job costs a fork
and a few dozen syscalls.

Protocol with the hub, newline-delimited JSON on `<state>/agent.sock`:
  supervisor -> hub  {"type": "hello", "job_id", "pid", "job_pid", "started_at",
                      "status": "running"}  (or "status": "ended" with "result")
                     {"type": "ended", "job_id", "result"}
  hub -> supervisor  {"type": "stop", "end_state", "reason", "signal", "grace"}
                     {"type": "signal", "signal"}
                     {"type": "ack"}: the end is recorded; delete the folder and exit
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import time
import traceback
from pathlib import Path
from typing import Any

from gpuq.agent import proctree
from gpuq.agent.cgroups import MemoryCgroup
from gpuq.agent.launch import LaunchSpec
from gpuq.domain.units import format_duration, format_size

ACK_WAIT_DEFAULT = 600.0  # seconds an ended supervisor waits for the agent's ack
RECONNECT_DELAY = 0.2
MEM_POLL_INTERVAL = 0.25
STOP_STATES = ("cancelled", "preempted", "timeout")
KILL_RETRY = 1.0  # SIGKILL again this often while the main process has not gone
LEFTOVER_DEADLINE = 10.0  # give up verifying that leftovers are gone after this long
SETTLE = 0.1  # seconds a tree that was just signalled gets to exit before survivors are killed

SPEC_FILE = "spec.json"
SCRIPT_FILE = "script"
PID_FILE = "supervisor.pid"
RESULT_FILE = "result.json"
SOCKET_NAME = "agent.sock"

Message = dict[str, Any]


# ---- the job folder, shared with the hub ----


def socket_path(job_dir: Path) -> Path:
    """The agent socket of the state dir that holds `job_dir` (<state>/jobs/<id>)."""
    return Path(os.path.dirname(os.path.dirname(job_dir)), SOCKET_NAME)


def write_json_atomic(path: Path, data: Message) -> None:
    """Write `path` so that a reader sees no file or the whole new one, even after a crash.

    temp + fsync + rename. The folder is not fsynced (a second journal commit per job): if a
    crash loses the rename, the complete, fsynced `<name>.tmp` is there, and read_json_durable
    falls back to it.
    """
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(data, separators=(",", ":")).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)


def read_json_durable(path: Path) -> Message | None:
    """What write_json_atomic left at `path` (or in its temporary), None when nothing usable."""
    for candidate in (path, Path(f"{path}.tmp")):
        try:
            data = json.loads(candidate.read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


def supervisor_alive(job_dir: Path) -> int | None:
    """The pid of the job folder's supervisor when it still runs (pid and start time match)."""
    try:
        pid_text, start_text = (job_dir / PID_FILE).read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    if str(proctree.start_time(pid)) != start_text or proctree.has_exited(pid):
        return None
    return pid


def remove_job_dir(job_dir: Path) -> None:
    """Delete a job folder (flat: spec, script, pid file, result and their temporaries)."""
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(job_dir):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
        job_dir.rmdir()


class _HubLink:
    """The supervisor's end of the agent socket: non-blocking, newline-delimited JSON."""

    def __init__(self, path: Path, poller: select.poll) -> None:
        self.path = path
        self.poller = poller
        self.sock: socket.socket | None = None
        self.inbuf = b""
        self.outbuf = b""

    def connect(self) -> bool | None:
        """True when connected; False when the agent is absent; None when its backlog is full."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(str(self.path))
        except BlockingIOError:
            sock.close()
            return None
        except OSError:
            sock.close()
            return False
        self.sock, self.inbuf, self.outbuf = sock, b"", b""
        self.poller.register(sock.fileno(), select.POLLIN)
        return True

    def close(self) -> None:
        if self.sock is not None:
            self.poller.unregister(self.sock.fileno())
            self.sock.close()
            self.sock = None

    def send(self, message: Message) -> None:
        if self.sock is None:
            return
        self.outbuf += json.dumps(message, separators=(",", ":")).encode() + b"\n"
        self.flush()

    def flush(self) -> None:
        assert self.sock is not None
        try:
            sent = self.sock.send(self.outbuf)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.close()
            return
        self.outbuf = self.outbuf[sent:]
        mask = select.POLLIN | (select.POLLOUT if self.outbuf else 0)
        self.poller.modify(self.sock.fileno(), mask)

    def on_event(self, events: int) -> list[Message] | None:
        """Messages that arrived, or None when the agent went away (the link is closed then)."""
        assert self.sock is not None
        if events & select.POLLOUT:
            self.flush()
        if self.sock is None or not events & (select.POLLIN | select.POLLHUP | select.POLLERR):
            return [] if self.sock is not None else None
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return []
        except OSError:
            data = b""
        if not data:
            self.close()
            return None
        self.inbuf += data
        *lines, self.inbuf = self.inbuf.split(b"\n")
        return [message for line in lines if (message := _decode(line)) is not None]


class Supervisor:
    """One job's run from fork to ack; `run()` returns when the supervisor should exit."""

    def __init__(self, job_dir: Path, ack_wait: float = ACK_WAIT_DEFAULT) -> None:
        self.job_dir = job_dir
        self.ack_wait = ack_wait
        self.me = os.getpid()
        self.poller = select.poll()
        self.link = _HubLink(socket_path(job_dir), self.poller)
        self.spec: LaunchSpec | None = None
        self.job_pid = 0  # the main process; also the job's process group id
        self.status: int | None = None  # wait status of the main process once reaped
        self.main_gone = False  # reaped, or never started
        self.tree_killed = False  # SIGKILL went to the whole tree before the main process ended
        self.tree_signalled = -1e9  # monotonic time the whole tree last got a signal from us
        self.launch_error: str | None = None
        self.decided: tuple[str, str] | None = None  # (end state, reason) chosen before the end
        self.cgroup: MemoryCgroup | None = None
        self.polling = False
        self.peak = 0
        self.started_at = 0.0
        self.timers: dict[str, float] = {}
        self.result: Message | None = None
        self.acked = False
        self.wake_r, self.wake_w = os.pipe()

    # ---- start ----

    def _prepare(self) -> LaunchSpec:
        proctree.become_subreaper()
        job_dir = str(self.job_dir)
        identity = f"{self.me} {proctree.start_time(self.me)}\n".encode()
        _write_file(f"{job_dir}/{PID_FILE}.tmp", identity, 0o600)
        os.rename(f"{job_dir}/{PID_FILE}.tmp", f"{job_dir}/{PID_FILE}")
        fd = os.open(f"{job_dir}/{SPEC_FILE}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            spec = LaunchSpec.from_dict(json.loads(_read_all(fd)))
        finally:
            os.close(fd)
        owner = None if spec.uid is None else (spec.uid, -1 if spec.gid is None else spec.gid)
        _write_file(f"{job_dir}/{SCRIPT_FILE}", spec.script.encode(), 0o700, owner)
        # SIGCHLD wakes poll() through the pipe; installed before the fork so no exit is missed
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        proctree.set_handler(signal.SIGCHLD, lambda signum, frame: None)
        self.poller.register(self.wake_r, select.POLLIN)
        return spec

    def _start(self, spec: LaunchSpec) -> None:
        if spec.mem_limit is not None:
            if spec.mem_enforcement in ("auto", "cgroup"):
                self.cgroup = MemoryCgroup.create(spec.job_id, spec.cgroup_parent, spec.mem_limit)
            self.polling = self.cgroup is None
        cgroup_fd = self.cgroup.open_procs() if self.cgroup is not None else None
        self.started_at = time.time()
        try:
            self.job_pid, self.launch_error = proctree.spawn_job(
                spec, self.job_dir / SCRIPT_FILE, cgroup_fd
            )
        finally:
            if cgroup_fd is not None:
                os.close(cgroup_fd)
        if self.launch_error is not None:
            if self.job_pid:
                self.status = os.waitpid(self.job_pid, 0)[1]  # it has _exited already
            self.main_gone = True
            return
        now = time.monotonic()
        if spec.time_limit is not None:
            if spec.warning_seconds > 0 and spec.warning_seconds < spec.time_limit:
                self.timers["warn"] = now + spec.time_limit - spec.warning_seconds
            self.timers["limit"] = now + spec.time_limit
        if self.polling:
            self.timers["mem"] = now

    # ---- the loop ----

    def run(self) -> None:
        self.spec = self._prepare()
        self._start(self.spec)
        if self.main_gone:
            self._finish()  # a launch failure: the first hello already carries the result
        self._connect()
        while not self.acked:
            if self.result is None:
                self._reap()
                if self.main_gone:
                    self._finish()
                    continue
            due = min(self.timers.values(), default=None)
            timeout = -1 if due is None else max(0, int((due - time.monotonic()) * 1000) + 1)
            for fd, events in self.poller.poll(timeout):
                if fd == self.wake_r:
                    _drain(self.wake_r)
                else:
                    self._on_link(events)
            if self._run_timers():
                return

    def _run_timers(self) -> bool:
        """Run every due timer; True when the supervisor should exit without an ack."""
        now = time.monotonic()
        for name, when in sorted(self.timers.items(), key=lambda item: item[1]):
            if when > now:
                break
            del self.timers[name]
            if name == "give_up":
                return True
            getattr(self, f"_on_{name}")()
        return False

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.job_pid:
                self.status, self.main_gone = status, True

    # ---- talking to the hub ----

    def _connect(self) -> None:
        if self.link.sock is not None:
            return
        connected = self.link.connect()
        if not connected:
            delay = 0.01 if connected is None else RECONNECT_DELAY  # None: backlog full
            self.timers["connect"] = time.monotonic() + delay
            return
        assert self.spec is not None
        hello: Message = {"type": "hello", "job_id": self.spec.job_id, "pid": self.me}
        hello.update(job_pid=self.job_pid, started_at=self.started_at)
        if self.result is None:
            hello["status"] = "running"
        else:
            hello.update(status="ended", result=self.result)
        self.link.send(hello)

    _on_connect = _connect

    def _on_link(self, events: int) -> None:
        messages = self.link.on_event(events)
        if messages is None:
            self.timers["connect"] = time.monotonic() + RECONNECT_DELAY
            return
        for message in messages:
            kind = message.get("type")
            try:
                if kind == "stop":
                    self._stop(message)
                elif kind == "signal" and self.result is None:
                    self._signal_tree(int(message["signal"]))
                elif kind == "ack" and self.result is not None:
                    self.acked = True
            except (KeyError, TypeError, ValueError):
                continue  # a malformed command is dropped; the job goes on

    def _stop(self, message: Message) -> None:
        if self.result is not None:
            return
        state = str(message.get("end_state"))
        state = state if state in STOP_STATES else "cancelled"
        self._decide(state, str(message.get("reason") or f"{state} by the agent"))
        self._signal_tree(int(message.get("signal") or signal.SIGTERM))
        assert self.spec is not None
        grace = float(message.get("grace", self.spec.kill_grace))
        kill_at = time.monotonic() + max(0.0, grace)
        self.timers["kill"] = min(self.timers.get("kill", kill_at), kill_at)

    # ---- limits ----

    def _decide(self, end_state: str, reason: str) -> None:
        if self.decided is None:
            self.decided = (end_state, reason)

    def _signal_tree(self, sig: int) -> None:
        self.tree_signalled = time.monotonic()
        extra = self.cgroup.pids() if self.cgroup is not None else ()
        proctree.signal_tree(self.me, self.job_pid, sig, extra)

    def _on_warn(self) -> None:
        assert self.spec is not None
        self._signal_tree(self.spec.warning_signal)

    def _on_limit(self) -> None:
        assert self.spec is not None and self.spec.time_limit is not None
        self._decide("timeout", f"time limit {format_duration(self.spec.time_limit)} reached")
        self._signal_tree(self.spec.warning_signal or signal.SIGTERM)
        kill_at = time.monotonic() + self.spec.kill_grace
        self.timers["kill"] = min(self.timers.get("kill", kill_at), kill_at)

    def _on_kill(self) -> None:
        self.tree_killed = True
        self._signal_tree(signal.SIGKILL)
        self.timers["kill"] = time.monotonic() + KILL_RETRY

    def _on_mem(self) -> None:
        assert self.spec is not None and self.spec.mem_limit is not None
        rss = proctree.tree_rss(proctree.descendants(self.me))
        self.peak = max(self.peak, rss)
        if rss > self.spec.mem_limit and self.decided is None:
            self._decide("out_of_memory", f"exceeded --mem {format_size(self.spec.mem_limit)}")
            self._on_kill()
            return
        self.timers["mem"] = time.monotonic() + MEM_POLL_INTERVAL

    # ---- the end ----

    def _finish(self) -> None:
        """The main process is gone: kill the rest, classify, write result.json, tell the hub."""
        assert self.spec is not None
        leftovers = self._kill_leftovers()
        end_state, reason = self._classify()
        if leftovers:
            noun = "process" if leftovers == 1 else "processes"
            reason = f"{reason}; " if reason else ""
            reason += f"{leftovers} leftover {noun} killed"
        peak = self.peak
        if self.cgroup is not None:
            peak = max(peak, self.cgroup.peak())
            self.cgroup.remove()
        code = None
        if self.launch_error is None and self.status is not None:
            code = os.waitstatus_to_exitcode(self.status)  # negative: killed by a signal
        self.result = {
            "job_id": self.spec.job_id,
            "end_state": end_state,
            "exit_code": code if code is not None and code >= 0 else None,
            "signal": -code if code is not None and code < 0 else None,
            "reason": reason,
            "started_at": self.started_at,
            "ended_at": time.time(),
            "peak_mem": peak,
            "leftovers_killed": leftovers,
        }
        write_json_atomic(self.job_dir / RESULT_FILE, self.result)
        self.timers = {"give_up": time.monotonic() + self.ack_wait}
        if self.link.sock is not None:
            self.link.send({"type": "ended", "job_id": self.spec.job_id, "result": self.result})
        else:
            self.timers["connect"] = time.monotonic()

    def _classify(self) -> tuple[str, str]:
        assert self.spec is not None
        if self.launch_error is not None or self.status is None:
            return "failed", self.launch_error or "launch failed"
        if self.decided is not None:
            return self.decided
        if self.cgroup is not None and self.cgroup.oom_kills() > 0:
            assert self.spec.mem_limit is not None
            return "out_of_memory", f"exceeded --mem {format_size(self.spec.mem_limit)}"
        code = os.waitstatus_to_exitcode(self.status)
        if code == 0:
            return "completed", ""
        if code > 0:
            return "failed", f"exit code {code}"
        return "failed", f"killed by signal {proctree.signal_name(-code)}"

    def _kill_leftovers(self) -> int:
        """SIGKILL and reap whatever of the job is still alive; the number of leftovers killed.

        Processes dying from a signal the whole tree just got (the SIGTERM of a stop, say) are
        not leftovers: they get SETTLE seconds to go before the survivors are counted.
        """
        killed: set[int] = set()
        now = time.monotonic()
        deadline = now + LEFTOVER_DEADLINE
        settle_until = self.tree_signalled + SETTLE if now - self.tree_signalled < 2.0 else 0.0
        while True:
            self._reap()
            extra = self.cgroup.pids() if self.cgroup is not None else []
            pids = {*proctree.descendants(self.me), *extra}
            if not pids and not proctree.group_alive(self.job_pid):
                break  # all reaped: nothing of the job is left, not even a zombie
            alive = proctree.living(pids)  # not counting those already dying
            if alive and time.monotonic() < settle_until:
                alive = []  # a signal may still be pending for them
            killed.update(alive)
            if alive:
                self._signal_tree(signal.SIGKILL)
            if time.monotonic() > deadline:
                break
            select.select([self.wake_r], [], [], 0.01)
            _drain(self.wake_r)
        return 0 if self.tree_killed else len(killed)


def _decode(line: bytes) -> Message | None:
    """One protocol line; None for a blank or broken one (a bug must not kill the job)."""
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def _write_file(path: str, data: bytes, mode: int, owner: tuple[int, int] | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)  # whatever the umask
        if owner is not None:
            os.fchown(fd, *owner)
    finally:
        os.close(fd)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 512):
            pass


def main(job_dir: Path, ack_wait: float = ACK_WAIT_DEFAULT) -> int:
    """Supervise the job in `job_dir`; the exit code for the forked process (0: acked or waited).

    A crash of the supervisor itself must not lose the job's end: the job is killed and a failed
    result is written, which the hub finds when it sees the supervisor gone.
    """
    supervisor = Supervisor(job_dir.absolute(), ack_wait)
    try:
        supervisor.run()
    except BaseException as exc:
        traceback.print_exc()
        _crash_result(supervisor, exc)
        return 1
    if supervisor.acked:
        remove_job_dir(supervisor.job_dir)
    return 0


def _crash_result(supervisor: Supervisor, exc: BaseException) -> None:
    with contextlib.suppress(BaseException):
        if supervisor.job_pid:
            proctree.signal_tree(supervisor.me, supervisor.job_pid, signal.SIGKILL)
        if supervisor.result is None and supervisor.spec is not None:
            now = time.time()
            write_json_atomic(
                supervisor.job_dir / RESULT_FILE,
                {
                    "job_id": supervisor.spec.job_id,
                    "end_state": "failed",
                    "exit_code": None,
                    "signal": None,
                    "reason": f"supervisor error: {exc!r}",
                    "started_at": supervisor.started_at or now,
                    "ended_at": now,
                    "peak_mem": supervisor.peak,
                    "leftovers_killed": 0,
                },
            )
