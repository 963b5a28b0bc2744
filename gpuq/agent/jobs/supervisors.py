"""The agent's side of job supervision: launch through the fork server, listen to supervisors.

Supervisors outlive the agent, so the hub holds no state that matters: every job's truth is its
folder (`<state>/jobs/<id>`) and its supervisor. A new hub finds live supervisors when they
reconnect to `<state>/agent.sock`, and reports the results that ended jobs left in result.json.
An ended report is repeated until `ack()` (the coordinator recorded the end durably); only then
does the folder go. Reports reach `on_report` in the order each supervisor sent them.

Nothing a job started outlives it: when a supervisor dies without a result (even by SIGKILL),
the hub stops the job's process group and cgroup (recorded in the folder's job.pid) itself and
only then reports the end. The hub also heals its fork server: one that dies is restarted with
backoff; while none runs, a launch raises LaunchRefused (the job did not start).

`not_accepting()` says why the node should be given no work: no fork server runs and a restart
failed, or LAUNCH_FAILURES_DRAIN launches in a row were refused (for DRAIN_RETRY seconds after
the last, then it is tried again). `on_health` is called when that may have changed.

Test hook: when the environment variable GPUQ_TEST_FORK_SERVER_BLOCK names a file that exists,
restarting the fork server fails (as it would if it could not be started); removing the file
lets the next attempt succeed. It is read only when a restart is attempted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pwd
import signal
import stat
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gpuq.agent.jobs import process_tree
from gpuq.agent.jobs.fork_server import ForkServer
from gpuq.agent.jobs.job_folder import (
    ACK_WAIT_DEFAULT,
    JOB_PID_FILE,
    RESULT_FILE,
    SOCKET_NAME,
    SPEC_FILE,
    Message,
    read_json_durable,
    remove_job_dir,
    supervisor_alive,
    write_json_atomic,
)
from gpuq.agent.jobs.launch_spec import Account, LaunchSpec
from gpuq.agent.jobs.pty_relay import PtyEvent, Terminals

log = logging.getLogger(__name__)
LIVENESS_CHECK = 1.0  # seconds between checks on a supervisor that is not connected
ORPHAN_POLL = 0.05  # seconds between looks at a dead supervisor's job while stopping it
ORPHAN_GIVE_UP = 10.0  # seconds after SIGKILL to stop waiting for a job's processes to go
RESTART_DELAYS = (0.0, 0.2, 0.5, 1.0, 2.0)  # backoff between fork server restarts, then 5 s
RESTART_DELAY_MAX = 5.0
EXITS_KEPT = 1000  # abnormal supervisor exits remembered, newest
EXIT_WAIT = 0.5  # seconds to wait for the fork server's word on how a supervisor died
LAUNCH_WAIT = 2.0  # seconds a launch waits for a fork server that is being restarted
# seconds a launch waits for an earlier start of the same job to leave its folder (its
# supervisor removes it when told its end is recorded, perhaps just before this start came)
EARLIER_START_WAIT = 5.0
LAUNCH_FAILURES_DRAIN = 3  # launches refused in a row after which the node takes no work
DRAIN_RETRY = 30.0  # seconds after the last of them until the node takes work again, to try
TEST_BLOCK_ENV = "GPUQ_TEST_FORK_SERVER_BLOCK"  # see the module's docstring


class LaunchRefused(Exception):
    """The job was not started (no supervisor runs for it): it may go back to the queue."""


def lookup_account(user: str) -> Account | None:
    """`user`'s entry in this node's password database (None: no such account)."""
    if not user or "\0" in user:
        return None
    try:
        entry = pwd.getpwnam(user)
    except (KeyError, ValueError, OSError):
        return None
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir, entry.pw_shell)


def coordinator_socket_owner(addresses: list[str]) -> int | None:
    """The uid owning the coordinator's Unix socket when one of `addresses` is `unix:PATH`
    and a user other than root owns it (a user's private coordinator), else None. A socket
    that cannot be looked at counts as owned by nobody trusted (-1: no job runs)."""
    owners = set()
    for address in addresses:
        if not address.startswith("unix:"):
            continue
        path = address[len("unix:") :].removeprefix("//")
        try:
            info = os.stat(path)
        except OSError:
            owners.add(-1)
            continue
        if info.st_uid != 0 or not stat.S_ISSOCK(info.st_mode):
            owners.add(info.st_uid if stat.S_ISSOCK(info.st_mode) else -1)
    if not owners:
        return None
    return owners.pop() if len(owners) == 1 else -1


@dataclass(frozen=True, slots=True)
class SupervisorReport:
    """What a supervisor said about its job: it runs, or it ended (with the result)."""

    job_id: int
    # not_started: the agent's own, for a launch it handed back (no supervisor ran it)
    kind: Literal["running", "ended", "not_started"]
    end_state: str | None  # a JobState value for "ended", None for "running"
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    at: float = 0.0  # started_at for "running", ended_at for "ended"
    peak_mem: int = 0
    leftovers_killed: int = 0
    attempt: int = 0  # which start of the job (the launch spec's attempt; 0: unknown)

    @classmethod
    def ended(cls, result: Message, attempt: int = 0) -> SupervisorReport:
        return cls(
            attempt=attempt,
            job_id=int(result["job_id"]),
            kind="ended",
            end_state=str(result["end_state"]),
            exit_code=result.get("exit_code"),
            signal=result.get("signal"),
            reason=_with_isolation(str(result.get("reason", "")), result.get("isolation")),
            at=float(result.get("ended_at") or time.time()),
            peak_mem=int(result.get("peak_mem") or 0),
            leftovers_killed=int(result.get("leftovers_killed") or 0),
        )


def _with_isolation(reason: str, isolation: object) -> str:
    """The end reason, with the isolation the job had when it was not enforced (its device
    rules could not be applied): a job's record never hides that."""
    if not isinstance(isolation, str) or not isolation.startswith("advisory"):
        return reason
    note = f"GPU isolation {isolation}"
    return f"{reason}; {note}" if reason else note


@dataclass(slots=True)
class _Job:
    job_id: int
    attempt: int = 0  # the launch spec's: which start of the job this is
    conn: _SupervisorConn | None = None
    pid: int | None = None  # the supervisor's
    queued: list[Message] = field(default_factory=list)  # stop/signal/ack before it connects
    running_reported: bool = False
    ended: bool = False
    watching: bool = False  # a liveness check is scheduled
    reaping: bool = False  # its supervisor died; its processes are being stopped
    terminal: bool = False  # an interactive job: its terminal is relayed (self.terminals)
    ending: bool = False  # its end is being reported (after its terminal's last output)


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

    def __init__(
        self,
        on_lost: Callable[[], None] | None = None,
        on_exit: Callable[[int, int], None] | None = None,
    ) -> None:
        super().__init__()
        self.waiters: deque[asyncio.Future[Message]] = deque()
        self.on_lost = on_lost
        self.on_exit = on_exit

    def on_message(self, message: Message) -> None:
        if "exited" in message:  # a supervisor ended abnormally: not a reply
            if self.on_exit is not None:
                self.on_exit(int(message["exited"]), int(message["status"]))
            return
        waiter = self.waiters.popleft()
        if not waiter.done():
            waiter.set_result(message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectionError("the fork server is gone"))
        if self.on_lost is not None:
            self.on_lost()

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
        on_health: Callable[[], None] | None = None,
        on_pty: Callable[[PtyEvent], None] | None = None,
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
        self.forks_ready = asyncio.Event()
        self.refusing: str | None = None  # why launches are refused (no fork server runs)
        self.restarts = 0  # fork servers started after the first
        self._restarter: asyncio.Task[None] | None = None
        self._reapers: set[asyncio.Task[None]] = set()
        self.exits: dict[int, int] = {}  # wait status of supervisors that ended abnormally
        self.on_health = on_health  # not_accepting() may have changed
        self.failed_launches = 0  # refused in a row
        self._last_failure = ""  # why the last of them was refused
        self._last_failure_at = 0.0  # time.monotonic()
        # interactive jobs' terminals: their output goes to on_pty (none: it is read and
        # dropped, so that a job never blocks on it), always before the job's end report
        self.terminals = Terminals(on_pty or _drop_output)
        self._finishing: set[asyncio.Task[None]] = set()

    # ---- life cycle ----

    async def start(self) -> None:
        """Listen, start the fork server, and take over the jobs an earlier agent left."""
        # a root agent's jobs run as their users, who must pass through to their scripts
        # (0711: nobody else may list or write; spec.json and results stay 0600 root's)
        mode = 0o711 if os.geteuid() == 0 else 0o700
        self.jobs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.state_dir, mode)
        os.chmod(self.jobs_dir, mode)
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
        await self._connect_forks()
        self._recover()

    async def _connect_forks(self) -> None:
        assert self.fork_server is not None
        forks = _ForkClient(self._forks_lost, self._supervisor_exited)
        loop = asyncio.get_running_loop()
        await loop.create_unix_connection(lambda: forks, sock=self.fork_server.sock)
        self.forks = forks
        self.forks_ready.set()
        self.failed_launches = 0  # a new fork server: launches get a fresh chance
        self._set_refusing(None)

    def _set_refusing(self, problem: str | None) -> None:
        changed = problem != self.refusing
        self.refusing = problem
        if changed:
            self._health_changed()

    def _health_changed(self) -> None:
        if self.on_health is not None:
            try:
                self.on_health()
            except Exception:
                log.exception("on_health failed")

    def not_accepting(self) -> str | None:
        """Why this node cannot start jobs now (None: it can)."""
        if self.refusing is not None:
            return self.refusing
        if (
            self.failed_launches >= LAUNCH_FAILURES_DRAIN
            and time.monotonic() - self._last_failure_at < DRAIN_RETRY
        ):
            return f"launches keep failing (the last: {self._last_failure})"
        return None

    def _supervisor_exited(self, pid: int, status: int) -> None:
        self.exits[pid] = status
        while len(self.exits) > EXITS_KEPT:
            del self.exits[next(iter(self.exits))]

    def _forks_lost(self) -> None:
        """The fork server's socket closed: unless we are closing, it died; start another."""
        self.forks_ready.clear()
        if self.closing or (self._restarter is not None and not self._restarter.done()):
            return
        log.error("the fork server is gone; restarting it")
        self._restarter = asyncio.get_running_loop().create_task(self._restart_forks())

    async def _restart_forks(self) -> None:
        """Start a new fork server, with backoff, until one runs; launches are refused (not
        failed) while none does."""
        attempt = 0
        while not self.closing and not self.forks_ready.is_set():
            old = self.fork_server
            if old is not None:
                with contextlib.suppress(OSError):
                    old.close()
                if old.process.poll() is None:  # alive, yet its socket broke: end it
                    with contextlib.suppress(OSError):
                        old.process.kill()
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(old.process.wait, 5)
            delay = RESTART_DELAYS[attempt] if attempt < len(RESTART_DELAYS) else RESTART_DELAY_MAX
            attempt += 1
            await asyncio.sleep(delay)
            try:
                if (block := os.environ.get(TEST_BLOCK_ENV)) and os.path.exists(block):
                    raise OSError(f"blocked by {TEST_BLOCK_ENV} (a test hook)")
                self.fork_server = ForkServer.start(self.ack_wait)
                await self._connect_forks()
            except Exception as error:
                self.fork_server = None
                self._set_refusing(f"the fork server cannot be restarted: {error}")
                log.error("%s (attempt %d)", self.refusing, attempt)
                continue
            self.restarts += 1
            log.warning("fork server restarted (pid %d)", self.fork_server.process.pid)

    async def close(self) -> None:
        """Stop listening and let the fork server go; supervisors and jobs keep running."""
        self.closing = True
        for task in (self._restarter, *self._reapers, *self._finishing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self.terminals.close_all()
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
            attempt, terminal = _facts_in(job_dir)
            job = _Job(int(entry.name), attempt, pid=supervisor_alive(job_dir), terminal=terminal)
            self.jobs[job.job_id] = job
            if terminal:
                self.terminals.add(job.job_id, attempt)
            if job.pid is not None:
                self._watch(job)  # it will reconnect; notice if it dies before that
            else:
                self._report_from_disk(job, job_dir)

    # ---- commands ----

    def _job_dir(self, job_id: int) -> Path:
        return self.jobs_dir / str(job_id)

    async def launch(self, spec: LaunchSpec) -> int:
        """Start `spec` in a new supervisor; its pid. Reports follow through on_report."""
        if self.server is None:
            raise RuntimeError("SupervisorHub.start() first")
        job_dir = self._job_dir(spec.job_id)
        text = json.dumps(spec.to_dict()).encode()
        await self._earlier_start_gone(job_dir)
        terminal = spec.terminal is not None
        job = self.jobs[spec.job_id] = _Job(spec.job_id, spec.attempt, terminal=terminal)
        if terminal:  # input that comes before the supervisor does is kept for it
            self.terminals.add(spec.job_id, spec.attempt)
        try:
            pid = await self._spawn(job_dir, text)
        except BaseException as error:
            if self.jobs.get(spec.job_id) is job:
                del self.jobs[spec.job_id]
                self.terminals.discard(spec.job_id)
            if isinstance(error, LaunchRefused):
                self._launch_failed(str(error))
            raise
        if self.failed_launches:
            drained = self.not_accepting() is not None
            self.failed_launches = 0
            if drained:
                self._health_changed()
        if job.pid is None:
            job.pid = pid
        if job.conn is None:
            self._watch(job)
        return pid

    def _launch_failed(self, problem: str) -> None:
        """A launch was refused for want of a supervisor (not for the job's own sake)."""
        before = self.not_accepting()
        self.failed_launches += 1
        self._last_failure, self._last_failure_at = problem, time.monotonic()
        if (self.not_accepting() is None) != (before is None):
            self._health_changed()

    async def _earlier_start_gone(self, job_dir: Path) -> None:
        """Wait until an earlier start of the job has left its folder (its supervisor removes
        it once the end is acknowledged); a folder whose supervisor is gone is removed here.
        LaunchRefused when it stays (the job goes back to the queue)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + EARLIER_START_WAIT
        while job_dir.exists():
            if supervisor_alive(job_dir) is None:
                with contextlib.suppress(OSError):
                    remove_job_dir(job_dir)
                if not job_dir.exists():
                    return
            if loop.time() > deadline:
                raise LaunchRefused("an earlier start of the job has not left its folder yet")
            await asyncio.sleep(0.01)

    async def _spawn(self, job_dir: Path, spec_text: bytes) -> int:
        """Ask the fork server for a supervisor; retried once on a restarted fork server.
        LaunchRefused when no supervisor runs for the job (it did not start)."""
        problem = ""
        for _ in range(2):
            if not self.forks_ready.is_set() and self.refusing is None:
                # being restarted (it takes milliseconds); once a restart failed, refuse at once
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.forks_ready.wait(), LAUNCH_WAIT)
            forks = self.forks
            if not self.forks_ready.is_set() or forks is None:
                raise LaunchRefused(self.refusing or "the fork server is being restarted")
            job_dir.mkdir(mode=0o700)
            if os.geteuid() == 0:  # its user passes through to its script (the only entry)
                os.chmod(job_dir, 0o711)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            fd = os.open(job_dir / SPEC_FILE, flags, 0o600)
            try:
                os.write(fd, spec_text)
            finally:
                os.close(fd)
            try:
                return await forks.spawn(job_dir)
            except ConnectionError as error:
                problem = str(error)
                pid = self._withdraw(job_dir)
                if pid is not None:
                    return pid  # it forked the supervisor before it died: the job runs
            except OSError as error:  # it answered that it could not fork: nothing started
                remove_job_dir(job_dir)
                raise LaunchRefused(str(error)) from error
            except BaseException:
                remove_job_dir(job_dir)
                raise
        raise LaunchRefused(problem)

    def _withdraw(self, job_dir: Path) -> int | None:
        """A spawn whose answer was lost: the supervisor's pid if one runs the job, else make
        sure none ever will (a supervisor that finds no spec.json ends without starting it)."""
        try:
            os.rename(job_dir / SPEC_FILE, job_dir / f"{SPEC_FILE}.withdrawn")
        except OSError:
            return None
        pid = supervisor_alive(job_dir)
        if pid is not None:  # it read the spec before the rename (it writes its pid first)
            os.rename(job_dir / f"{SPEC_FILE}.withdrawn", job_dir / SPEC_FILE)
            return pid
        remove_job_dir(job_dir)
        return None

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

    def attempt_of(self, job_id: int) -> int:
        """Which start of the job this node runs (its launch spec's attempt; 0: unknown)."""
        job = self.jobs.get(job_id)
        return job.attempt if job is not None else 0

    def supervisor_pids(self) -> dict[int, int]:
        """Supervisor pid -> job id, for the jobs still running (where no cgroup tells)."""
        return {
            job.pid: job_id
            for job_id, job in self.jobs.items()
            if job.pid is not None and not job.ended
        }

    def launch_spec_of(self, job_id: int) -> LaunchSpec | None:
        """The launch spec of a job this node runs, from its folder (None: gone/unreadable);
        what an agent that restarted knows of the jobs it adopted."""
        try:
            data = json.loads((self._job_dir(job_id) / "spec.json").read_bytes())
            return LaunchSpec.from_dict(data)
        except (OSError, ValueError, TypeError):
            return None

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
                job_id = int(message["job_id"])
                attempt, terminal = _facts_in(self._job_dir(job_id))
                job = self.jobs[job_id] = _Job(job_id, attempt, terminal=terminal)
            job.conn, job.pid, conn.job = conn, int(message["pid"]), job
            if job.terminal and not (job.ended or job.ending):
                self.terminals.add(job.job_id, job.attempt)
                self.terminals.attach(job.job_id, self._job_dir(job.job_id))
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
                report = SupervisorReport(job.job_id, "running", None, at=at, attempt=job.attempt)
                self._report(report)
        elif kind == "ended" and conn.job is not None:
            self._report_end(conn.job, message["result"])

    def _on_disconnect(self, conn: _SupervisorConn) -> None:
        job = conn.job
        if job is None or job.conn is not conn:
            return
        job.conn = None
        if not self.closing and self.jobs.get(job.job_id) is job:
            # a supervisor that died (SIGKILL) is in exit by now: look at once, not in a second
            asyncio.get_running_loop().call_soon(self._check, job)

    def _report_end(self, job: _Job, result: Message) -> None:
        if job.ended or job.ending:
            return
        report = SupervisorReport.ended(result, job.attempt)
        if not job.terminal:
            job.ended = True
            self._report(report)
            return
        job.ending = True  # after the last of its terminal's output
        task = asyncio.get_running_loop().create_task(self._end_terminal_job(job, report))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def _end_terminal_job(self, job: _Job, report: SupervisorReport) -> None:
        try:
            await self.terminals.finish(job.job_id, job.attempt)
        except Exception:  # the end must be reported whatever happened to the terminal
            log.exception("job %d: finishing its terminal", job.job_id)
        job.ended = True
        self._report(report)

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
        if job.reaping:
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
        """The supervisor is gone: its result.json, or (it died before the job ended) stop
        what is left of the job, then report a result that says so."""
        result = read_json_durable(job_dir / RESULT_FILE)
        if result is not None:
            self._report_end(job, result)
        elif not job.reaping:
            job.reaping = True
            task = asyncio.get_running_loop().create_task(self._stop_orphans(job, job_dir))
            self._reapers.add(task)
            task.add_done_callback(self._reapers.discard)

    async def _exit_told(self, pid: int) -> None:
        while pid not in self.exits:
            await asyncio.sleep(0.01)

    def _how_it_died(self, job: _Job) -> str:
        """ " (killed by signal 9)" when the fork server told how the supervisor ended."""
        status = self.exits.pop(job.pid, None) if job.pid is not None else None
        if status is None:
            return ""
        if os.WIFSIGNALED(status):
            return f" (killed by signal {os.WTERMSIG(status)})"
        return f" (exit code {os.waitstatus_to_exitcode(status)})"

    async def _stop_orphans(self, job: _Job, job_dir: Path) -> None:
        """SIGTERM to the job's process group and cgroup, SIGKILL after its kill grace (as a
        stop would: a job may save its work), and the end reported once nothing is left, so
        that its GPUs are freed only then."""
        try:
            stopped = await asyncio.to_thread(stop_job_processes, job_dir, job.job_id)
            if job.pid is not None and self.forks_ready.is_set():
                # how it died comes from the fork server (its parent), perhaps a moment later;
                # a supervisor of an earlier fork server has another parent: no word comes
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._exit_told(job.pid), EXIT_WAIT)
        except Exception as error:  # never leave the job unreported
            log.exception("stopping the processes of job %d", job.job_id)
            reason = f"supervisor lost before the job ended; stopping its processes failed: {error}"
        else:
            left = f"{_count(stopped)} stopped" if stopped else "no process of it was left"
            reason = f"supervisor lost before the job ended{self._how_it_died(job)}; {left}"
        log.warning("job %d: %s", job.job_id, reason)
        now = time.time()
        result: Message = {"job_id": job.job_id, "end_state": "failed", "exit_code": None}
        result.update(signal=None, started_at=now, ended_at=now, peak_mem=0)
        result.update(leftovers_killed=0, reason=reason)
        with contextlib.suppress(OSError):
            write_json_atomic(job_dir / RESULT_FILE, result)
        job.reaping = False
        if self.jobs.get(job.job_id) is job:
            self._report_end(job, result)


def _facts_in(job_dir: Path) -> tuple[int, bool]:
    """The attempt in a job folder's launch spec (0: none recorded, or no spec), and whether
    the job is interactive (it has a terminal)."""
    try:
        spec = read_json_durable(job_dir / SPEC_FILE) or {}
        return int(spec.get("attempt") or 0), bool(spec.get("terminal"))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0, False


def _drop_output(event: PtyEvent) -> None:
    """Terminal output nobody asked for (a hub without on_pty)."""


def _count(processes: int) -> str:
    return f"its {processes} processes were" if processes != 1 else "its process was"


def stop_job_processes(job_dir: Path, job_id: int) -> int:
    """Stop every process of a job whose supervisor is gone; how many it had when this began.

    Found by job.pid (the process group and cgroups the supervisor recorded) and by the job's
    environment (GPUQ_JOB_ID and GPUQ_NODE, for processes that left the group of a job without
    a cgroup). Blocking: run it in a thread."""
    spec = read_json_durable(job_dir / SPEC_FILE) or {}
    env = spec.get("env") or {}
    grace = float(spec.get("kill_grace") or 0.0)
    pgid, cgroups = None, []
    try:
        head, _, tail = (job_dir / JOB_PID_FILE).read_text().partition("\n")
        # one folder a line: the job's groups in each cgroup hierarchy (memory first)
        cgroups = [line.strip() for line in tail.splitlines() if line.strip()]
        pid_text, start_text = head.split()
        pgid = int(pid_text)
        if pgid <= 1 or not _group_is_the_jobs(pgid, int(start_text)):
            pgid = None
    except (OSError, ValueError):
        pass
    # the environment is what a job says of itself (any process may set GPUQ_JOB_ID): it
    # finds the job's processes only where no cgroup holds them
    marker = (
        (str(env["GPUQ_JOB_ID"]), str(env["GPUQ_NODE"]))
        if "GPUQ_NODE" in env and not cgroups
        else None
    )
    count: int | None = None
    termed: set[int] = set()  # SIGTERM goes once to each: a job's trap must not run again
    term_until = time.monotonic() + grace
    give_up = term_until + ORPHAN_GIVE_UP
    while True:
        pids = _processes_of_job(pgid, cgroups, marker)
        if count is None:
            count = len(pids)
        if not pids:
            for cgroup in cgroups:
                _remove_cgroup(cgroup)
            return count
        killing = time.monotonic() >= term_until
        sig = signal.SIGKILL if killing else signal.SIGTERM
        if pgid is not None and (killing or not termed):
            with contextlib.suppress(OSError):
                os.killpg(pgid, sig)
        for pid in pids if killing else pids - termed:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        termed |= pids
        if time.monotonic() > give_up:
            log.error("job %d: processes %s outlive SIGKILL", job_id, sorted(pids))
            return count
        time.sleep(ORPHAN_POLL)


def _processes_of_job(
    pgid: int | None, cgroups: list[str], marker: tuple[str, str] | None
) -> set[int]:
    """The job's live processes: by its process group, marker and first cgroup (which holds
    the whole job), plus any member of its other groups (a process that joined only one)."""
    pids = process_tree.processes_of_job(pgid, cgroups[0] if cgroups else None, marker)
    for cgroup in cgroups[1:]:
        with contextlib.suppress(OSError, ValueError):
            members = process_tree.read_proc(f"{cgroup}/cgroup.procs").split()
            pids.update(pid for pid in map(int, members) if not process_tree.has_exited(pid))
    pids.discard(os.getpid())
    return pids


def _remove_cgroup(path: str) -> None:
    """Remove the dead supervisor's job cgroup once it is empty (the kernel may need a moment
    to see its last process gone); a cgroup that stays busy is left, and logged."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                log.warning("could not remove the job cgroup %s: %s", path, exc)
                return
            time.sleep(ORPHAN_POLL)


def _group_is_the_jobs(pgid: int, start: int) -> bool:
    """The recorded group still names the job's: its leader is the job's main process, or it
    is gone (the number stays taken while any member of its group lives)."""
    now = process_tree.start_time(pgid)
    return now is None or now == start
