"""The agent's link to its fork server, kept alive: spawns, restarts, and whether launches work.

A fork server that dies is restarted with backoff; while none runs, a launch raises
LaunchRefused (the job did not start: it may go back to the queue). The fork server also says
how a supervisor that ended abnormally died ({"exited": pid, "status": N}), which the agent
adds to the end of a job whose supervisor was lost.

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
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from gpuq.agent.jobs.fork_server import ForkServer
from gpuq.agent.jobs.job_folder import Message
from gpuq.agent.jobs.json_lines import JsonLinesProtocol

log = logging.getLogger(__name__)
RESTART_DELAYS = (0.0, 0.2, 0.5, 1.0, 2.0)  # backoff between fork server restarts, then 5 s
RESTART_DELAY_MAX = 5.0
EXITS_KEPT = 1000  # abnormal supervisor exits remembered, newest
LAUNCH_WAIT = 2.0  # seconds a launch waits for a fork server that is being restarted
LAUNCH_FAILURES_DRAIN = 3  # launches refused in a row after which the node takes no work
DRAIN_RETRY = 30.0  # seconds after the last of them until the node takes work again, to try
TEST_BLOCK_ENV = "GPUQ_TEST_FORK_SERVER_BLOCK"  # see the module's docstring


class LaunchRefused(Exception):
    """The job was not started (no supervisor runs for it): it may go back to the queue."""


class ForkClient(JsonLinesProtocol):
    """The agent's end of the fork server's control socket: replies come in request order."""

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


class ForkServerLink:
    """The fork server the agent spawns supervisors through, restarted when it dies.

    `fork_server`: one the agent started before importing grpc (else start() starts one).
    `ack_wait`: how long an ended supervisor waits for its ack before it exits and leaves
    result.json for a later agent; it goes to the fork servers this link starts.
    """

    def __init__(
        self,
        fork_server: ForkServer | None,
        ack_wait: float,
        on_health: Callable[[], None] | None = None,
    ) -> None:
        self.fork_server = fork_server  # pass one started before grpc was imported
        self.ack_wait = ack_wait
        self.on_health = on_health  # not_accepting() may have changed
        self.client: ForkClient | None = None
        self.ready = asyncio.Event()  # a fork server runs and is connected
        self.refusing: str | None = None  # why launches are refused (no fork server runs)
        self.restarts = 0  # fork servers started after the first
        self.closing = False
        self._restarter: asyncio.Task[None] | None = None
        self.exits: dict[int, int] = {}  # wait status of supervisors that ended abnormally
        self.failed_launches = 0  # refused in a row
        self._last_failure = ""  # why the last of them was refused
        self._last_failure_at = 0.0  # time.monotonic()

    async def start(self) -> None:
        if self.fork_server is None:
            self.fork_server = ForkServer.start(self.ack_wait)
        await self._connect()

    async def _connect(self) -> None:
        assert self.fork_server is not None
        client = ForkClient(self._lost, self._supervisor_exited)
        loop = asyncio.get_running_loop()
        await loop.create_unix_connection(lambda: client, sock=self.fork_server.sock)
        self.client = client
        self.ready.set()
        self.failed_launches = 0  # a new fork server: launches get a fresh chance
        self.set_refusing(None)

    # ---- whether the node can start jobs ----

    def set_refusing(self, problem: str | None) -> None:
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

    def launch_refused(self, problem: str) -> None:
        """A launch was refused for want of a supervisor (not for the job's own sake)."""
        before = self.not_accepting()
        self.failed_launches += 1
        self._last_failure, self._last_failure_at = problem, time.monotonic()
        if (self.not_accepting() is None) != (before is None):
            self._health_changed()

    def launch_worked(self) -> None:
        """A supervisor runs for a launch: refusals in a row start over."""
        if self.failed_launches:
            drained = self.not_accepting() is not None
            self.failed_launches = 0
            if drained:
                self._health_changed()

    # ---- spawning ----

    async def ready_client(self) -> ForkClient:
        """The connected fork server, once one is (a restart takes milliseconds; once a
        restart failed, refuse at once). LaunchRefused while none runs."""
        if not self.ready.is_set() and self.refusing is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ready.wait(), LAUNCH_WAIT)
        client = self.client
        if not self.ready.is_set() or client is None:
            raise LaunchRefused(self.refusing or "the fork server is being restarted")
        return client

    # ---- how supervisors died ----

    def _supervisor_exited(self, pid: int, status: int) -> None:
        self.exits[pid] = status
        while len(self.exits) > EXITS_KEPT:
            del self.exits[next(iter(self.exits))]

    async def exit_told(self, pid: int) -> None:
        """Wait until the fork server has said how supervisor `pid` ended."""
        while pid not in self.exits:
            await asyncio.sleep(0.01)

    def how_it_died(self, pid: int | None) -> str:
        """ " (killed by signal 9)" when the fork server told how the supervisor ended."""
        status = self.exits.pop(pid, None) if pid is not None else None
        if status is None:
            return ""
        if os.WIFSIGNALED(status):
            return f" (killed by signal {os.WTERMSIG(status)})"
        return f" (exit code {os.waitstatus_to_exitcode(status)})"

    # ---- restarts ----

    def _lost(self) -> None:
        """The fork server's socket closed: unless we are closing, it died; start another."""
        self.ready.clear()
        if self.closing or (self._restarter is not None and not self._restarter.done()):
            return
        log.error("the fork server is gone; restarting it")
        self._restarter = asyncio.get_running_loop().create_task(self._restart())

    async def _restart(self) -> None:
        """Start a new fork server, with backoff, until one runs; launches are refused (not
        failed) while none does."""
        attempt = 0
        while not self.closing and not self.ready.is_set():
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
                await self._connect()
            except Exception as error:
                self.fork_server = None
                self.set_refusing(f"the fork server cannot be restarted: {error}")
                log.error("%s (attempt %d)", self.refusing, attempt)
                continue
            self.restarts += 1
            log.warning("fork server restarted (pid %d)", self.fork_server.process.pid)

    # ---- closing ----

    async def stop_restarts(self) -> None:
        """The agent is closing: no fork server is started any more."""
        self.closing = True
        if self._restarter is not None:
            self._restarter.cancel()
            with contextlib.suppress(BaseException):
                await self._restarter

    async def close(self) -> None:
        """Let the fork server go (it exits at EOF; its supervisors go on), and wait a moment
        for it to exit."""
        self.closing = True
        if self.client is not None and self.client.transport is not None:
            self.client.transport.close()
        if self.fork_server is not None:
            process = self.fork_server.process
            for _ in range(200):
                if process.poll() is not None:
                    break
                await asyncio.sleep(0.01)
