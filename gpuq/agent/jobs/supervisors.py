"""The agent's side of job supervision: launch through the fork server, listen to supervisors.

Supervisors outlive the agent, so this holds no state that matters: every job's truth is its
folder (`<state>/jobs/<id>`) and its supervisor. A new agent finds live supervisors when they
reconnect to `<state>/agent.sock`, and reports the results that ended jobs left in result.json.
An ended report is repeated until `ack()` (the coordinator recorded the end durably); only then
does the folder go. Reports reach `on_report` in the order each supervisor sent them.

Nothing a job started outlives it: a job whose supervisor died without a result is stopped
here, and only then reported ended (gpuq.agent.jobs.orphan_reaper). The fork server that forks
supervisors is kept alive by gpuq.agent.jobs.fork_server_link, which also says whether this
node can start jobs at all (`forks.not_accepting()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuq.agent.jobs.fork_server import ForkServer
from gpuq.agent.jobs.fork_server_link import ForkServerLink, LaunchRefused
from gpuq.agent.jobs.job_folder import (
    ACK_WAIT_DEFAULT,
    RESULT_FILE,
    SOCKET_NAME,
    SPEC_FILE,
    Message,
    read_json_durable,
    remove_job_dir,
    supervisor_alive,
)
from gpuq.agent.jobs.json_lines import JsonLinesProtocol
from gpuq.agent.jobs.launch_spec import LaunchSpec
from gpuq.agent.jobs.orphan_reaper import orphan_result
from gpuq.agent.jobs.pty_relay import PtyEvent, Terminals
from gpuq.agent.jobs.supervisor_reports import ReportKind, SupervisorReport
from gpuq.domain.states import JobState

log = logging.getLogger(__name__)
LIVENESS_CHECK = 1.0  # seconds between checks on a supervisor that is not connected
# seconds a launch waits for an earlier start of the same job to leave its folder (its
# supervisor removes it when told its end is recorded, perhaps just before this start came)
EARLIER_START_WAIT = 5.0


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


class _SupervisorConn(JsonLinesProtocol):
    def __init__(self, supervisors: Supervisors) -> None:
        super().__init__()
        self.supervisors = supervisors
        self.job: _Job | None = None

    def on_message(self, message: Message) -> None:
        self.supervisors._on_message(self, message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.supervisors._on_disconnect(self)


class Supervisors:
    """Launches jobs through the fork server and relays what their supervisors report.

    `fork_server`: one the agent started before importing grpc (else start() starts one).
    `ack_wait`: how long an ended supervisor waits for its ack before it exits and leaves
    result.json for a later agent; it goes to the fork servers started here.
    `on_health`: told when whether this node can start jobs may have changed.
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
        on_isolation: Callable[[int, str], None] | None = None,
    ) -> None:
        self.state_dir = Path(state_dir).absolute()  # supervisors chdir away from their cwd
        self.jobs_dir = self.state_dir / "jobs"
        self.on_report = on_report
        # each job's device isolation as its supervisor says it in its hello: the node's claim
        # follows what loads really did (gpuq.agent.jobs.isolation.DeviceLoads)
        self.on_isolation = on_isolation
        self.forks = ForkServerLink(fork_server, ack_wait, on_health)
        self.jobs: dict[int, _Job] = {}
        self.server: asyncio.AbstractServer | None = None
        self.closing = False
        self._reapers: set[asyncio.Task[None]] = set()
        # interactive jobs' terminals: their output goes to on_pty (none: it is read and
        # dropped, so that a job never blocks on it), always before the job's end report
        self.terminals = Terminals(on_pty or _drop_output)
        self._finishing: set[asyncio.Task[None]] = set()
        # the lease every supervisor holds (gpuq.agent.fencing): (until, why); None: none given
        # yet by this agent (adopted supervisors keep the last agent's)
        self._lease: tuple[float, str] | None = None

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
        await self.forks.start()
        self._recover()

    async def close(self) -> None:
        """Stop listening and let the fork server go; supervisors and jobs keep running."""
        self.closing = True
        await self.forks.stop_restarts()
        for task in (*self._reapers, *self._finishing):
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
        await self.forks.close()
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
        """Start `spec` in a new supervisor; its pid. Reports follow through on_report.
        LaunchRefused when no supervisor runs for it (the job did not start)."""
        if self.server is None:
            raise RuntimeError("Supervisors.start() first")
        job_dir = self._job_dir(spec.job_id)
        if self._lease is not None:
            spec = dataclasses.replace(spec, lease_until=self._lease[0])
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
                self.forks.launch_refused(str(error))
            raise
        self.forks.launch_worked()
        if job.pid is None:
            job.pid = pid
        if job.conn is None:
            self._watch(job)
        return pid

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
            forks = await self.forks.ready_client()
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
        end_state: JobState = JobState.CANCELLED,
        reason: str = "",
        signal: int = 0,
        grace: float = 30.0,
    ) -> bool:
        """Stop the job: `signal` (0: SIGTERM) to its whole tree, SIGKILL after `grace`; it
        ends `end_state` (the supervisor keeps cancelled, preempted, timeout, node_fail,
        out_of_memory and failed, and makes anything else cancelled). False when no such job
        runs."""
        message: Message = {"type": "stop", "end_state": end_state, "reason": reason}
        message.update(signal=signal, grace=grace)
        return self._command(job_id, message)

    def lease(self, until: float, why: str = "") -> None:
        """Every supervisor stops its job at `until` (this host's monotonic clock) unless told
        a later one; `why`: the reason a job fenced then gives (none: the supervisor's own)."""
        self._lease = (until, why)
        message: Message = {"type": "lease", "until": until, "why": why}
        for job in self.jobs.values():
            if job.conn is not None and not job.ended:
                job.conn.send(message)

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

    def started_jobs(self) -> list[int]:
        """Running jobs whose supervisor said they started (their output files are open)."""
        return sorted(
            job_id for job_id, job in self.jobs.items() if job.running_reported and not job.ended
        )

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
            data = json.loads((self._job_dir(job_id) / SPEC_FILE).read_bytes())
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
            if self.on_isolation is not None and isinstance(message.get("isolation"), str):
                self.on_isolation(job.job_id, message["isolation"])
            if job.terminal and not (job.ended or job.ending):
                self.terminals.add(job.job_id, job.attempt)
                self.terminals.attach(job.job_id, self._job_dir(job.job_id))
            if self._lease is not None and message.get("status") != "ended":
                until, why = self._lease
                conn.send({"type": "lease", "until": until, "why": why})
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
                running = SupervisorReport(
                    job.job_id, ReportKind.RUNNING, None, at=at, attempt=job.attempt
                )
                self._report(running)
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

    async def _stop_orphans(self, job: _Job, job_dir: Path) -> None:
        result = await orphan_result(job_dir, job.job_id, job.pid, self.forks)
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
    """Terminal output nobody asked for (no on_pty)."""
