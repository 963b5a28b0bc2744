"""Interactive jobs' terminals on the coordinator: the relay between a submitter's `Attach`
stream (gpuq run, gpuq alloc) and the job's pty on its node (PtyInput / PtyOutput on the agent
stream).

One TerminalState per live interactive job, in memory only (after a restart every interactive
job starts detached). It holds the job's output not yet delivered, bounded: above
OUTPUT_HIGH the agent is told to `pause` reading the pty, below OUTPUT_LOW to `resume`, so a
slow reader slows the job instead of filling the coordinator. Input waits here until the job
runs on a connected agent (at most INPUT_LIMIT per job: the Attach stream is not read further
meanwhile, so gRPC's flow control holds the client back).

An interactive job lives as long as its attachment, like srun: when the Attach stream goes
away before the job ended, or nobody attached within ATTACH_GRACE seconds (of its submission,
or of a coordinator restart), the job is cancelled through the normal cancel path.

Plain functions drive the state; the servicer (Attach) only turns errors into status codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from gpuq.convert import result_to_proto
from gpuq.coordinator.access.permissions import check_attaches
from gpuq.coordinator.background_tasks import Background
from gpuq.coordinator.changes.effects import Cause
from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.node_table import NodeTable
from gpuq.coordinator.workload.job_actions import JobActions
from gpuq.coordinator.workload.selection import Selection
from gpuq.domain.limits import MAX_JOB_ID, clean_line
from gpuq.domain.model import Job, JobEvent, JobSpec, parse_signal
from gpuq.domain.states import JobState
from gpuq.errors import InvalidInput, NotFound, Unsatisfiable
from gpuq.identity import Caller
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import queue_pb2

log = logging.getLogger(__name__)

OUTPUT_HIGH = 4 << 20  # bytes of undelivered output at which the agent is told to pause
OUTPUT_LOW = 512 << 10  # ... and below which it is told to resume
OUTPUT_HARD = 16 << 20  # beyond this (an agent that ignores pause) output is dropped, logged
INPUT_LIMIT = 1 << 20  # bytes of input one job may have waiting here
MAX_CHUNK = 64 << 10  # bytes of one AttachRequest.input, PtyOutput.data, reply or PtyInput
MAX_SIZE = 65535  # rows or columns of a window
ATTACH_GRACE = 60.0  # seconds an interactive job may wait for its first (or next) attachment
TICK = 1.0  # seconds between two looks at an attached job's pending reason
FOREIGN_LOG_INTERVAL = 60.0  # seconds between warnings about one node's stray pty output
MAX_PROBLEM = 500  # characters of an agent's reason why it cannot relay a terminal
GONE = "its terminal (gpuq run / gpuq alloc) went away"
NEVER_ATTACHED = f"nobody attached to its terminal within {ATTACH_GRACE:g} s"


@dataclass(eq=False)
class TerminalState:
    """One live interactive job's terminal, as the coordinator relays it."""

    job_id: int
    user: str
    rows: int
    cols: int
    detached_since: float
    attached: bool = False
    cancelling: bool = False  # detached for good: its cancellation is under way
    output: deque[bytes] = field(default_factory=deque)
    buffered: int = 0  # bytes in output
    paused: bool = False  # the agent was told to pause (and not yet to resume)
    inbox: deque[bytes | None] = field(default_factory=deque)  # input; None: end of input
    inbox_bytes: int = 0
    size_sent: tuple[int, int, int] = (0, 0, 0)  # (attempt, rows, cols) the agent last got
    problem: str = ""  # the agent's reason why it cannot relay this terminal
    error: Exception | None = None  # a bad request: ends the Attach stream
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    room: asyncio.Event = field(default_factory=asyncio.Event)


def check_interactive_spec(spec: JobSpec) -> None:
    """An interactive job is one job: no array (each task would need a terminal of its own)."""
    if spec.terminal is not None and spec.array is not None:
        raise InvalidInput("--array", "", "an interactive job (gpuq run, gpuq alloc) is one job")


class Terminals:
    def __init__(
        self,
        writer: StoreWriter,
        jobs: LiveJobs,
        nodes: NodeTable,
        actions: JobActions,
        clock: Callable[[], float],
    ) -> None:
        self.writer = writer
        self.jobs = jobs
        self.actions = actions
        self.clock = clock
        self.states: dict[int, TerminalState] = {}
        self.session_of = nodes.session  # the node's connected agent stream, or None
        self.grace = ATTACH_GRACE
        self._logged: dict[str, float] = {}  # node -> when its stray output was last logged
        self._background = Background("cancelling an interactive job")

    # ---- attaching (the Attach stream) ---------------------------------------------------

    async def open(self, job_id: int, user: str) -> TerminalState:
        """Attach `user` to their interactive job: NotFound, PermissionDenied (another's),
        Unsatisfiable (not interactive, ended, already attached, being cancelled)."""
        if not 1 <= job_id <= MAX_JOB_ID:
            raise NotFound(f"no job {job_id}")
        job = self.jobs.jobs.get(job_id)
        if job is None:
            stored = await self.writer.read(lambda s: s.get_job(job_id))  # NotFound
            self._check_owner(stored, user)
            self._check_interactive(stored)
            raise Unsatisfiable(f"job {job_id} has ended ({stored.state.value})")
        self._check_owner(job, user)
        self._check_interactive(job)
        state = self._state_for(job)
        if state.attached:
            raise Unsatisfiable(f"job {job_id} is already attached (one gpuq run at a time)")
        if state.cancelling:
            raise Unsatisfiable(f"job {job_id} is being cancelled: {GONE}")
        state.attached = True
        return state

    @staticmethod
    def _check_owner(job: Job, user: str) -> None:
        """Only the owner: the terminal carries their keystrokes and their job's output."""
        check_attaches(user, job.user, job.id)

    @staticmethod
    def _check_interactive(job: Job) -> None:
        if job.spec.terminal is None or job.tasks:
            raise Unsatisfiable(
                f"job {job.id} is not interactive (gpuq run, gpuq alloc): see gpuq logs"
            )

    def close(self, state: TerminalState) -> None:
        """The Attach stream ended: a job that has not ended is cancelled (srun's rule), and
        its output from now on is dropped (nobody will read it; the agent never waits)."""
        state.attached = False
        state.detached_since = self.clock()
        if state.job_id not in self.jobs.jobs:
            self.states.pop(state.job_id, None)
            return
        self._give_up(state, GONE)

    def _give_up(self, state: TerminalState, reason: str) -> None:
        state.cancelling = True
        state.output.clear()
        state.buffered = 0
        state.inbox.clear()
        state.inbox_bytes = 0
        state.room.set()
        if state.paused:
            self._control(state, resume=True)
        self._background.spawn(self._cancel(state, reason))

    async def _cancel(self, state: TerminalState, reason: str) -> None:
        owner = Caller(state.user, None)
        cause = Cause.chore("interactive terminal")
        outcomes = await self.actions.cancel(Selection((str(state.job_id),)), owner, cause, reason)
        for outcome in outcomes:
            log.info("job %s: %s (%s)", outcome.job_id, reason, outcome.message)

    def take(self, state: TerminalState, request: queue_pb2.AttachRequest) -> None:
        """One request of the stream: input, a window size, a signal, the end of input.
        InvalidInput for a value out of range (the stream then ends)."""
        if request.rows or request.cols:
            for name, value in (("rows", request.rows), ("cols", request.cols)):
                if not 1 <= value <= MAX_SIZE:
                    raise InvalidInput(f"terminal {name}", value, f"must be 1 to {MAX_SIZE}")
            state.rows, state.cols = request.rows, request.cols
        if len(request.input) > MAX_CHUNK:
            raise InvalidInput("input", len(request.input), f"more than {MAX_CHUNK} bytes at once")
        if request.input:
            state.inbox.append(request.input)
            state.inbox_bytes += len(request.input)
        if request.eof:
            state.inbox.append(None)
        if request.signal:
            signal = parse_signal(str(request.signal), "signal")
            self._signal(state, signal)
        self.flush(state)

    async def read(
        self, state: TerminalState, requests: AsyncIterator[queue_pb2.AttachRequest]
    ) -> None:
        """Take the stream's requests; while INPUT_LIMIT bytes wait, read no further (the
        client is held back by flow control). A bad request ends the stream (state.error)."""
        try:
            async for request in requests:
                while state.inbox_bytes >= INPUT_LIMIT:
                    state.room.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(state.room.wait(), TICK)
                    self.flush(state)
                self.take(state, request)
        except Exception as error:  # InvalidInput, or the stream failed
            state.error = error
            state.wake.set()

    async def replies(
        self, state: TerminalState, explain: Callable[[Job], str]
    ) -> AsyncIterator[queue_pb2.AttachReply]:
        """The job's state as it changes, its output, then the end (after all output)."""
        shown: tuple[str, str, str] | None = None
        while True:
            state.wake.clear()
            if state.error is not None:
                raise state.error
            job = self.jobs.jobs.get(state.job_id)
            if job is not None:
                now = self._shown(job, state, explain)
                if now != shown:
                    shown = now
                    yield queue_pb2.AttachReply(state=now[0], reason=now[1], node=now[2])
                self.flush(state)
            while state.output:
                yield queue_pb2.AttachReply(output=self._next_chunk(state))
                self._drained(state)
            if job is None:  # ended: its agent sent all its output before the end
                yield await self._ending(state.job_id)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.wake.wait(), TICK)

    def _shown(
        self, job: Job, state: TerminalState, explain: Callable[[Job], str]
    ) -> tuple[str, str, str]:
        """(state, reason, node) as the client shows them."""
        if job.state is JobState.PENDING:
            return job.state.value, explain(job) or job.reason, ""
        if job.state is JobState.RUNNING:
            reason = f"its terminal cannot be relayed: {state.problem}" if state.problem else ""
            return job.state.value, reason or job.reason, job.node or ""
        return job.state.value, job.reason, ""

    async def _ending(self, job_id: int) -> queue_pb2.AttachReply:
        job = await self.writer.read(lambda s: s.get_job(job_id))
        reply = queue_pb2.AttachReply(state=job.state.value, reason=job.reason, ended=True)
        if job.result is not None:
            reply.result.CopyFrom(result_to_proto(job.result))
        else:
            reply.result.reason = job.reason
        return reply

    def _next_chunk(self, state: TerminalState) -> bytes:
        """Up to MAX_CHUNK bytes of the output, joined from what the agent sent."""
        parts: list[bytes] = []
        size = 0
        while state.output and size + len(state.output[0]) <= MAX_CHUNK:
            part = state.output.popleft()
            parts.append(part)
            size += len(part)
        if not parts:  # never happens (entries are at most MAX_CHUNK), but never loop
            parts.append(state.output.popleft())
        data = b"".join(parts)
        state.buffered -= len(data)
        return data

    def _drained(self, state: TerminalState) -> None:
        if state.paused and state.buffered < OUTPUT_LOW:
            self._control(state, resume=True)

    # ---- toward the agent ----------------------------------------------------------------

    def flush(self, state: TerminalState) -> None:
        """Send the agent the window size (when it changed, or the job started again) and
        the waiting input, once the job runs on a connected agent that is not behind."""
        job = self.jobs.jobs.get(state.job_id)
        if job is None or job.state is not JobState.RUNNING or job.node is None:
            return
        session = self.session_of(job.node)
        if session is None or session.backlog() >= INPUT_LIMIT:
            return
        attempt = job.start_count
        inputs: list[apb.PtyInput] = []
        if state.size_sent != (attempt, state.rows, state.cols):
            state.size_sent = (attempt, state.rows, state.cols)
            inputs.append(
                apb.PtyInput(job_id=job.id, attempt=attempt, rows=state.rows, cols=state.cols)
            )
        while state.inbox:
            item = state.inbox.popleft()
            if item is None:
                inputs.append(apb.PtyInput(job_id=job.id, attempt=attempt, eof=True))
            else:
                inputs.append(apb.PtyInput(job_id=job.id, attempt=attempt, data=item))
        state.inbox_bytes = 0
        state.room.set()
        if inputs:
            session.pty(inputs)

    def _control(self, state: TerminalState, *, pause: bool = False, resume: bool = False) -> None:
        """Pause or resume the agent's reading of the job's pty."""
        state.paused = pause
        job = self.jobs.jobs.get(state.job_id)
        if job is None or job.state is not JobState.RUNNING or job.node is None:
            return
        session = self.session_of(job.node)
        if session is not None:
            attempt = job.start_count
            session.pty([apb.PtyInput(job_id=job.id, attempt=attempt, pause=pause, resume=resume)])

    def _signal(self, state: TerminalState, signal: int) -> None:
        """A signal for the job's processes (a running job's; a waiting job has none)."""
        job = self.jobs.jobs.get(state.job_id)
        if job is None or job.state is not JobState.RUNNING or job.node is None:
            return
        session = self.session_of(job.node)
        if session is not None:
            session.signal([apb.SignalJob(job_id=job.id, signal=signal)])

    def agent_connected(self, node: str) -> None:
        """An agent (re)registered: its interactive jobs get their size again, and a pause
        still in force."""
        for state in self.states.values():
            job = self.jobs.jobs.get(state.job_id)
            if job is None or job.node != node or job.state is not JobState.RUNNING:
                continue
            state.size_sent = (0, 0, 0)
            self.flush(state)
            if state.paused:
                self._control(state, pause=True)

    # ---- from the agent ------------------------------------------------------------------

    def output(self, node: str, entries: Sequence[apb.PtyOutput]) -> None:
        """An agent's pty output: kept for the job's attachment, from the node the job runs
        on and its current start only (anything else is ignored, logged once a minute)."""
        for entry in entries:
            job = self._accepted(node, entry)
            if job is None:
                continue
            state = self._state_for(job)
            if entry.problem:
                state.problem = clean_line(entry.problem, MAX_PROBLEM)
                log.warning("job %d on %s: its terminal: %s", job.id, node, state.problem)
            if entry.data and not state.cancelling:
                self._keep(state, entry.data)
            state.wake.set()

    def _keep(self, state: TerminalState, data: bytes) -> None:
        if state.buffered + len(data) > OUTPUT_HARD:
            self._warn(f"job {state.job_id}", "its agent sends output past a pause: dropped")
            return
        state.output.append(data)
        state.buffered += len(data)
        # nobody reads a detached job's output yet: it pauses sooner (many such jobs must not
        # fill the coordinator's memory)
        high = OUTPUT_HIGH if state.attached else OUTPUT_LOW
        if state.buffered > high and not state.paused:
            self._control(state, pause=True)

    def _accepted(self, node: str, entry: apb.PtyOutput) -> Job | None:
        job = self.jobs.jobs.get(entry.job_id) if 1 <= entry.job_id <= MAX_JOB_ID else None
        if (
            job is not None
            and job.state is JobState.RUNNING
            and job.node == node
            and entry.attempt == job.start_count
            and job.spec.terminal is not None
            and len(entry.data) <= MAX_CHUNK
        ):
            return job
        self._warn(
            node,
            f"node {node} sent terminal output for job {entry.job_id} (start {entry.attempt}), "
            "which does not run there as an interactive job at that start: ignored",
        )
        return None

    def _warn(self, key: str, text: str) -> None:
        """Logged at most once a minute per key (a node, a job)."""
        now = self.clock()
        if now - self._logged.get(key, -math.inf) >= FOREIGN_LOG_INTERVAL:
            self._logged[key] = now
            log.warning("%s (such messages are logged once a minute)", text)

    # ---- job state changes and the grace --------------------------------------------------

    def published(self, event: JobEvent, job: Job | None) -> None:
        """A job's state changed (an event bus listener): wake its attachment; a start sends
        the agent its window size; an interactive job just submitted waits for its
        attachment from now on."""
        try:
            state = self.states.get(event.job_id)
            if state is None:
                current = self.jobs.jobs.get(event.job_id)
                if current is None or current.spec.terminal is None or current.tasks:
                    return
                state = self._state_for(current)
            state.wake.set()
            if event.to_state is JobState.RUNNING:
                self.flush(state)
            elif event.job_id not in self.jobs.jobs and not state.attached:
                self.states.pop(event.job_id, None)
        except Exception:  # never in the way of the state change itself
            log.exception("interactive job %d: following its state failed", event.job_id)

    def _state_for(self, job: Job) -> TerminalState:
        state = self.states.get(job.id)
        if state is None:
            terminal = job.spec.terminal
            rows, cols = (terminal.rows, terminal.cols) if terminal is not None else (24, 80)
            state = TerminalState(job.id, job.user, rows or 24, cols or 80, self.clock())
            self.states[job.id] = state
        return state

    async def sweep(self) -> None:
        """A chore: interactive jobs nobody attached to within the grace are cancelled (after
        a restart each one is new here: detached since now); ended ones are forgotten."""
        now = self.clock()
        for job in list(self.jobs.jobs.values()):
            if job.spec.terminal is None or job.tasks:
                continue
            state = self._state_for(job)
            waited = now - state.detached_since
            if not state.attached and not state.cancelling and waited >= self.grace:
                log.info("job %d: %s; cancelling it", job.id, NEVER_ATTACHED)
                self._give_up(state, NEVER_ATTACHED)
        for job_id, state in list(self.states.items()):
            if job_id not in self.jobs.jobs and not state.attached:
                del self.states[job_id]


async def relay(
    terminals: Terminals,
    requests: AsyncIterator[queue_pb2.AttachRequest],
    user: str,
    explain: Callable[[Job], str],
) -> AsyncIterator[queue_pb2.AttachReply]:
    """One Attach stream, from its first request (which names the job) to the job's end or
    the stream's; GpuqError for a refusal or a bad request."""
    first = await anext(aiter(requests), None)
    if first is None:
        return
    state = await terminals.open(first.job_id, user)
    reader: asyncio.Task[None] | None = None
    try:
        terminals.take(state, first)
        reader = asyncio.create_task(terminals.read(state, requests))
        async for reply in terminals.replies(state, explain):
            yield reply
    finally:
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
        terminals.close(state)
