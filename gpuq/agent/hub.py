"""The agent's side of job supervision: launch through the fork server, listen to supervisors.

Supervisors outlive the agent, so the hub holds no state that matters: every job's truth is its
folder (`<state>/jobs/<id>`) and its supervisor. A new hub finds live supervisors when they
reconnect to `<state>/agent.sock`, and reports the results that ended jobs left in result.json.
An ended report is repeated until `ack()` (the coordinator recorded the end durably); only then
does the folder go. Reports reach `on_report` in the order each supervisor sent them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gpuq.agent.forkserver import ForkServer
from gpuq.agent.jobdir import (
    ACK_WAIT_DEFAULT,
    RESULT_FILE,
    SOCKET_NAME,
    SPEC_FILE,
    Message,
    read_json_durable,
    remove_job_dir,
    supervisor_alive,
    write_json_atomic,
)
from gpuq.agent.launch import LaunchSpec

log = logging.getLogger(__name__)
LIVENESS_CHECK = 1.0  # seconds between checks on a supervisor that is not connected


@dataclass(frozen=True, slots=True)
class SupervisorReport:
    """What a supervisor said about its job: it runs, or it ended (with the result)."""

    job_id: int
    kind: Literal["running", "ended"]
    end_state: str | None  # a JobState value for "ended", None for "running"
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    at: float = 0.0  # started_at for "running", ended_at for "ended"
    peak_mem: int = 0
    leftovers_killed: int = 0

    @classmethod
    def ended(cls, result: Message) -> SupervisorReport:
        return cls(
            job_id=int(result["job_id"]),
            kind="ended",
            end_state=str(result["end_state"]),
            exit_code=result.get("exit_code"),
            signal=result.get("signal"),
            reason=str(result.get("reason", "")),
            at=float(result.get("ended_at") or time.time()),
            peak_mem=int(result.get("peak_mem") or 0),
            leftovers_killed=int(result.get("leftovers_killed") or 0),
        )


@dataclass(slots=True)
class _Job:
    job_id: int
    conn: _SupervisorConn | None = None
    pid: int | None = None  # the supervisor's
    queued: list[Message] = field(default_factory=list)  # stop/signal/ack before it connects
    running_reported: bool = False
    ended: bool = False
    watching: bool = False  # a liveness check is scheduled


class _LineProtocol(asyncio.Protocol):
    """Newline-delimited JSON over a stream transport."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pending = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        *lines, self.pending = (self.pending + data).split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                log.warning("ignoring a malformed line: %r", line[:200])
                continue
            if isinstance(message, dict):
                self.on_message(message)

    def send(self, message: Message) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def on_message(self, message: Message) -> None:
        raise NotImplementedError


class _SupervisorConn(_LineProtocol):
    def __init__(self, hub: SupervisorHub) -> None:
        super().__init__()
        self.hub = hub
        self.job: _Job | None = None

    def on_message(self, message: Message) -> None:
        self.hub._on_message(self, message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.hub._on_disconnect(self)


class _ForkClient(_LineProtocol):
    """The hub's end of the fork server's control socket: replies come in request order."""

    def __init__(self) -> None:
        super().__init__()
        self.waiters: deque[asyncio.Future[Message]] = deque()

    def on_message(self, message: Message) -> None:
        waiter = self.waiters.popleft()
        if not waiter.done():
            waiter.set_result(message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectionError("the fork server is gone"))

    async def spawn(self, job_dir: Path) -> int:
        if self.transport is None:
            raise ConnectionError("the fork server is gone")
        waiter: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        self.send({"spawn": str(job_dir)})
        reply = await waiter
        if "error" in reply:
            raise OSError(f"cannot start a supervisor for {job_dir}: {reply['error']}")
        return int(reply["pid"])


class SupervisorHub:
    """Launches jobs through the fork server and relays what their supervisors report.

    `fork_server`: one the agent started before importing grpc (else start() starts one).
    `ack_wait`: how long an ended supervisor waits for its ack before it exits and leaves
    result.json for a later hub; it goes to the fork server this hub starts.
    """

    def __init__(
        self,
        state_dir: Path,
        on_report: Callable[[SupervisorReport], None],
        *,
        fork_server: ForkServer | None = None,
        ack_wait: float = ACK_WAIT_DEFAULT,
    ) -> None:
        self.state_dir = Path(state_dir).absolute()  # supervisors chdir away from their cwd
        self.jobs_dir = self.state_dir / "jobs"
        self.on_report = on_report
        self.fork_server = fork_server  # pass one started before grpc was imported
        self.ack_wait = ack_wait
        self.jobs: dict[int, _Job] = {}
        self.server: asyncio.AbstractServer | None = None
        self.forks: _ForkClient | None = None
        self.closing = False

    # ---- life cycle ----

    async def start(self) -> None:
        """Listen, start the fork server, and take over the jobs an earlier agent left."""
        self.jobs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o700)
        sock_path = self.state_dir / SOCKET_NAME
        with contextlib.suppress(FileNotFoundError):
            sock_path.unlink()
        loop = asyncio.get_running_loop()
        self.server = await loop.create_unix_server(
            lambda: _SupervisorConn(self), str(sock_path), backlog=1024
        )
        # not via umask, which is process-wide (the agent has threads); the folder is 0700 anyway
        os.chmod(sock_path, 0o600)
        if self.fork_server is None:
            self.fork_server = ForkServer.start(self.ack_wait)
        forks = _ForkClient()
        await loop.create_unix_connection(lambda: forks, sock=self.fork_server.sock)
        self.forks = forks
        self._recover()

    async def close(self) -> None:
        """Stop listening and let the fork server go; supervisors and jobs keep running."""
        self.closing = True
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        for job in self.jobs.values():
            if job.conn is not None and job.conn.transport is not None:
                job.conn.transport.close()
        if self.forks is not None and self.forks.transport is not None:
            self.forks.transport.close()
        if self.fork_server is not None:
            process = self.fork_server.process
            for _ in range(200):
                if process.poll() is not None:
                    break
                await asyncio.sleep(0.01)
        # leave no litter: the socket, and the folders when no job folder is left in them
        with contextlib.suppress(OSError):
            (self.state_dir / SOCKET_NAME).unlink()
            self.jobs_dir.rmdir()
            self.state_dir.rmdir()

    def _recover(self) -> None:
        for entry in sorted(os.scandir(self.jobs_dir), key=lambda e: e.name):
            if not entry.name.isdigit() or int(entry.name) in self.jobs:
                continue
            job_dir = Path(entry.path)
            job = _Job(int(entry.name), pid=supervisor_alive(job_dir))
            self.jobs[job.job_id] = job
            if job.pid is not None:
                self._watch(job)  # it will reconnect; notice if it dies before that
            else:
                self._report_from_disk(job, job_dir)

    # ---- commands ----

    def _job_dir(self, job_id: int) -> Path:
        return self.jobs_dir / str(job_id)

    async def launch(self, spec: LaunchSpec) -> int:
        """Start `spec` in a new supervisor; its pid. Reports follow through on_report."""
        if self.forks is None:
            raise RuntimeError("SupervisorHub.start() first")
        job_dir = self._job_dir(spec.job_id)
        job_dir.mkdir(mode=0o700)
        fd = os.open(job_dir / SPEC_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, json.dumps(spec.to_dict()).encode())
        finally:
            os.close(fd)
        job = self.jobs[spec.job_id] = _Job(spec.job_id)
        try:
            pid = await self.forks.spawn(job_dir)
        except BaseException:
            del self.jobs[spec.job_id]
            remove_job_dir(job_dir)
            raise
        if job.pid is None:
            job.pid = pid
        if job.conn is None:
            self._watch(job)
        return pid

    async def stop(
        self,
        job_id: int,
        end_state: str = "cancelled",
        reason: str = "",
        signal: int = 0,
        grace: float = 30.0,
    ) -> bool:
        """Stop the job: `signal` (0: SIGTERM) to its whole tree, SIGKILL after `grace`.
        False when the hub knows no such running job."""
        message: Message = {"type": "stop", "end_state": end_state, "reason": reason}
        message.update(signal=signal, grace=grace)
        return self._command(job_id, message)

    async def signal(self, job_id: int, sig: int) -> bool:
        """Deliver `sig` to every process of the job."""
        return self._command(job_id, {"type": "signal", "signal": sig})

    async def ack(self, job_id: int) -> None:
        """The end is recorded: let the supervisor remove the folder and exit."""
        job = self.jobs.pop(job_id, None)
        if job is not None and job.conn is not None:
            job.conn.send({"type": "ack"})
        elif job is not None and job.pid is not None and supervisor_alive(self._job_dir(job_id)):
            job.queued.append({"type": "ack"})
            self.jobs[job_id] = job  # sent when it reconnects
        else:
            remove_job_dir(self._job_dir(job_id))

    def running_jobs(self) -> list[int]:
        """Jobs launched or adopted whose end has not been reported."""
        return sorted(job_id for job_id, job in self.jobs.items() if not job.ended)

    def _command(self, job_id: int, message: Message) -> bool:
        job = self.jobs.get(job_id)
        if job is None or job.ended:
            return False
        if job.conn is not None:
            job.conn.send(message)
        else:
            job.queued.append(message)
        return True

    # ---- what supervisors say ----

    def _on_message(self, conn: _SupervisorConn, message: Message) -> None:
        kind = message.get("type")
        if kind == "hello":
            job = self.jobs.get(int(message["job_id"]))
            if job is None:
                job = self.jobs[int(message["job_id"])] = _Job(int(message["job_id"]))
            job.conn, job.pid, conn.job = conn, int(message["pid"]), job
            for queued in job.queued:
                conn.send(queued)
            if {"type": "ack"} in job.queued:
                del self.jobs[job.job_id]  # acked while it was away: nothing more to hear
            job.queued.clear()
            if message.get("status") == "ended":
                self._report_end(job, message["result"])
            elif not job.running_reported and not job.ended:
                job.running_reported = True
                at = float(message.get("started_at") or time.time())
                self._report(SupervisorReport(job.job_id, "running", None, at=at))
        elif kind == "ended" and conn.job is not None:
            self._report_end(conn.job, message["result"])

    def _on_disconnect(self, conn: _SupervisorConn) -> None:
        job = conn.job
        if job is None or job.conn is not conn:
            return
        job.conn = None
        if not self.closing and self.jobs.get(job.job_id) is job:
            self._watch(job)

    def _report_end(self, job: _Job, result: Message) -> None:
        if not job.ended:
            job.ended = True
            self._report(SupervisorReport.ended(result))

    def _report(self, report: SupervisorReport) -> None:
        try:
            self.on_report(report)
        except Exception:
            log.exception("on_report failed for job %s", report.job_id)

    # ---- supervisors that are not connected ----

    def _watch(self, job: _Job) -> None:
        """Check now and then that a disconnected supervisor lives; if it died, use its folder."""
        if not job.watching:
            job.watching = True
            asyncio.get_running_loop().call_later(LIVENESS_CHECK, self._check, job)

    def _check(self, job: _Job) -> None:
        job.watching = False
        if self.closing or job.conn is not None or self.jobs.get(job.job_id) is not job:
            return
        job_dir = self._job_dir(job.job_id)
        if supervisor_alive(job_dir) is not None:
            self._watch(job)
        elif job.queued and job.queued[-1] == {"type": "ack"}:
            del self.jobs[job.job_id]
            remove_job_dir(job_dir)
        elif not job.ended:
            self._report_from_disk(job, job_dir)

    def _report_from_disk(self, job: _Job, job_dir: Path) -> None:
        """The supervisor is gone: its result.json, or a result that says it was lost."""
        result = read_json_durable(job_dir / RESULT_FILE)
        if result is None:
            now = time.time()
            result = {"job_id": job.job_id, "end_state": "failed", "exit_code": None}
            result.update(signal=None, started_at=now, ended_at=now, peak_mem=0)
            result.update(leftovers_killed=0, reason="supervisor lost before the job ended")
            with contextlib.suppress(OSError):
                write_json_atomic(job_dir / RESULT_FILE, result)
        self._report_end(job, result)
