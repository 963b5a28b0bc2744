"""The coordinator's side of the agent streams: registration and reconciliation, heartbeats,
job reports and terminal output, each handed to the part that owns it.

A node reports only on jobs dispatched to it; what it says is bounded at the edge
(gpuq.coordinator.nodes.agent_input).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from gpuq.config.settings import CoordinatorSettings
from gpuq.convert import result_from_proto, telemetry_from_proto, unit_from_proto
from gpuq.coordinator.background_tasks import Background
from gpuq.coordinator.changes.effects import Cause, StopOrder
from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.changes.transitions import Ending
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.node_table import NodeEntry, NodeTable
from gpuq.coordinator.nodes.agent_commands import AgentCommands
from gpuq.coordinator.nodes.agent_input import (
    LOOPBACK,
    MAX_END_REASON,
    check_registration,
    clean_usage,
    one_line,
    sane_report,
)
from gpuq.coordinator.nodes.agent_session import AgentSession
from gpuq.coordinator.terminal_relay import Terminals
from gpuq.coordinator.workload.job_endings import JobEndings
from gpuq.coordinator.workload.job_samples import JobSamples
from gpuq.domain.diagnosis import EndEvidence
from gpuq.domain.limits import MAX_NODE_TEXT, clean_line
from gpuq.domain.model import Node, NodeState, is_advisory
from gpuq.domain.policy import MAX_FENCE_TIME, silence_allowed
from gpuq.domain.states import TRANSITIONS, JobState
from gpuq.errors import Conflict
from gpuq.store.evidence_rows import MAX_OUTPUT_TAIL
from gpuq.v1 import agent_pb2 as apb

log = logging.getLogger(__name__)

# how a job's processes can end, as an agent sees it (node_fail: an agent cut off from the
# coordinator stopped it, "fenced"; back to pending is a start that never reached the agent,
# reported as NOT_STARTED, not an ending)
AGENT_ENDINGS = TRANSITIONS[JobState.RUNNING] - {JobState.PENDING}
NOT_RECEIVED = "requeued: the agent never received the start"
FOREIGN_LOG_INTERVAL = 60.0  # seconds between warnings of one node's reports on others' jobs
# what an agent reports about a job that is over on its side (ended, or handed back unstarted)
_OVER = (apb.JobReport.ENDED, apb.JobReport.NOT_STARTED)


class AgentLink:
    def __init__(
        self,
        settings: CoordinatorSettings,
        writer: StoreWriter,
        jobs: LiveJobs,
        nodes: NodeTable,
        endings: JobEndings,
        samples: JobSamples,
        terminals: Terminals,
        agents: AgentCommands,
        wake: Callable[[], None],
        clock: Callable[[], float],
        steady: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.writer = writer
        self.jobs = jobs
        self.nodes = nodes
        self.endings = endings
        self.samples = samples
        self.terminals = terminals
        self.agents = agents
        self.wake = wake
        self.clock = clock
        self.steady = steady  # what a node's silence is measured by (NodeEntry.heard_at)
        self._background = Background("handling agent reports")
        self._foreign_logged: dict[str, float] = {}  # node -> when its last was logged

    # ---- stream lifecycle ------------------------------------------------------------------

    async def register(self, message: apb.Register, session: AgentSession) -> None:
        check_registration(message)  # InvalidInput: the stream ends INVALID_ARGUMENT
        name = message.node
        entry = self.nodes.get(name)
        if entry is not None and entry.session is not None and not entry.session.closed:
            raise Conflict(f"node {name} is already connected to another agent")
        now, heard_at = self.clock(), self.steady()
        node = node_from_registration(message, now)
        # what it runs that the coordinator does not (found before the node is offered again)
        strays = [r.job_id for r in self._strays(name, message.jobs)]
        held = await self.writer.read(lambda s: s.units_used_on(name, strays)) if strays else {}
        await self.writer.write(lambda tx: tx.save_node(node))
        session.registered(self.settings.heartbeat_interval, self.settings.heartbeat_timeout)
        address = message.address or session.peer_address or LOOPBACK
        self.nodes.nodes[name] = NodeEntry(
            node,
            last_seen=now,
            heard_at=heard_at,
            session=session,
            held=held,
            registered=True,
            address=address,
        )
        if _is_mark(message.sent):
            session.seen(message.sent)
        self._check_fence(name, node.fence_time)
        if held:
            log.warning(
                "node %s still runs jobs %s the coordinator gave up on: stopping them; their "
                "GPUs are offered once they are gone",
                name,
                sorted(held),
            )
        try:
            await self._reconcile(name, message.jobs, session)
        except BaseException:
            self.disconnected(name, session)  # a later registration must not be refused
            raise
        self.terminals.agent_connected(name)  # its interactive jobs' window sizes, pauses
        log.info(
            "node %s registered: %d GPUs%s", name, len(node.units), " (FAKE)" if node.fake else ""
        )
        if node.gpu_problem:
            log.warning("node %s offers no GPUs: %s", name, node.gpu_problem)
        if is_advisory(node.isolation):
            log.warning("node %s: GPU isolation is %s", name, node.isolation)
        self.wake()

    def _check_fence(self, node: str, fence_time: float) -> None:
        """Warn when the node's fence outlasts the node timeout: its jobs are then given up
        only once the fence has certainly acted (gpuq.coordinator.nodes.node_admin), late."""
        timeout, grace = self.settings.heartbeat_timeout, self.settings.kill_grace
        needed = silence_allowed(timeout, fence_time, grace)
        if needed > timeout:
            log.warning(
                "node %s: its [agent] fence_time (%g s) plus the kill grace (%g s) is longer "
                "than heartbeat_timeout (%g s): its jobs are given up after %g s of silence",
                node,
                fence_time,
                grace,
                timeout,
                needed,
            )

    def disconnected(self, node: str, session: AgentSession) -> None:
        """The stream ended; the node stays up until its heartbeat timeout (a restarting
        agent re-adopts its jobs within it)."""
        entry = self.nodes.get(node)
        if entry is not None and entry.session is session:
            entry.session = None
        session.close()

    def heartbeat(
        self, node: str, message: apb.Heartbeat, session: AgentSession | None = None
    ) -> None:
        entry = self.nodes.get(node)
        if entry is None:
            return
        self._heard(entry)
        if session is not None and entry.session is session and _is_mark(message.sent):
            session.seen(message.sent)  # after _heard: the echo never runs ahead of it
        first = not entry.heard
        entry.heard = True
        # applied before the reports of the same message (the servicer's order): a unit its
        # ended job left dirty is dirty before that job's end frees it, so the pass that
        # follows the end never gives it out
        before = entry.agent_health()
        entry.usage = clean_usage(message.usage)
        after = entry.agent_health()
        if first:
            self.wake()  # its units may be given out now
        if after != before:
            for uuid in sorted(after.keys() - before.keys()):
                log.warning("node %s: unit %s %s: %s", node, uuid, *after[uuid])
            for uuid in sorted(before.keys() - after.keys()):
                log.info("node %s: unit %s is ok again", node, uuid)
            self.wake()  # a unit that is ok again may start a job
        self._accepting(node, entry, message)
        self._isolation(node, entry, message.isolation)
        self.samples.heard(node, message.jobs, message.progress)
        if message.output_gone:
            self.samples.outputs_gone(node, message.output_gone)

    def _accepting(self, node: str, entry: NodeEntry, message: apb.Heartbeat) -> None:
        """An agent that cannot start jobs (its fork server cannot be restarted, launches
        keep failing) is sent none until it says it can again; its running jobs stay."""
        drained = clean_line(message.not_accepting_reason, MAX_NODE_TEXT)
        drained = drained or "it cannot start jobs"
        drained = drained if message.not_accepting else ""
        if drained != entry.drained:
            if drained and not entry.drained:
                log.warning("node %s takes no work: its agent says %s", node, drained)
            elif not drained:
                log.info("node %s takes work again: its agent can start jobs", node)
            entry.drained = drained
            self.wake()

    @staticmethod
    def _isolation(node: str, entry: NodeEntry, text: str) -> None:
        """The agent's isolation now (a job's device rules failed, or apply again); "" from an
        older agent leaves the registration's."""
        isolation = clean_line(text, MAX_NODE_TEXT)
        if not isolation or isolation == entry.node.isolation:
            return
        if is_advisory(isolation):
            log.warning("node %s: GPU isolation is %s", node, isolation)
        else:
            log.info("node %s: GPU isolation is %s again", node, isolation)
        entry.node = replace(entry.node, isolation=isolation)

    def reports(self, node: str, reports: Sequence[apb.JobReport]) -> None:
        """Handle reports without holding up the stream: ends commit in the writer's batches."""
        entry = self.nodes.get(node)
        if entry is not None:
            self._heard(entry)
        ends = [r for r in reports if r.kind in _OVER and sane_report(r)]
        if ends:
            if entry is not None and entry.held:
                gone = [r.job_id for r in ends if entry.held.pop(r.job_id, None) is not None]
                if gone:
                    log.info("node %s: stopped jobs %s are gone; their GPUs are free", node, gone)
                    self.wake()
            self._background.spawn(self._record_ends(node, ends))

    def _heard(self, entry: NodeEntry) -> None:
        """A sign of life from the node now: its silence starts over (on the steady clock,
        which gpuq.coordinator.nodes.node_admin measures it by; the wall clock's for show)."""
        entry.last_seen = self.clock()
        entry.heard_at = self.steady()

    def pty(self, node: str, entries: Sequence[apb.PtyOutput]) -> None:
        """Interactive jobs' terminal output (gpuq.coordinator.terminal_relay), taken before
        the reports of the same message: a job's output arrives before its end."""
        self.terminals.output(node, entries)

    async def close(self) -> None:
        await self._background.cancel()

    # ---- which reports count ------------------------------------------------------------------

    def _strays(self, node: str, reports: Sequence[apb.JobReport]) -> list[apb.JobReport]:
        """Jobs the agent says run there that the coordinator does not run there (not at
        all, or another start of them): they are to be stopped."""
        ours = {j.id for j in self.jobs.running_on(node)}
        return [
            r
            for r in reports
            if r.kind == apb.JobReport.RUNNING and (r.job_id not in ours or not self._current(r))
        ]

    def _dispatched_here(self, node: str, report: apb.JobReport) -> bool:
        """A node's report counts as a running job's end only for a job that runs there; any
        other is perhaps a start given up with the node (JobEndings.record_late), else it
        changes nothing (_ignored)."""
        job = self.jobs.jobs.get(report.job_id)
        return job is not None and job.state is JobState.RUNNING and node in job.node_names

    def _ignored(self, node: str, job_id: int) -> None:
        """A report that is neither a running job's end nor a given-up start's. A job no
        longer running is normal after a reconnection (ended, or given up before this
        coordinator started); one running on another node is not, and is logged (at most
        once a minute per node)."""
        job = self.jobs.jobs.get(job_id)
        if job is None or job.state is not JobState.RUNNING:
            log.debug("node %s: ignoring a report on job %d, not running", node, job_id)
            return
        now = self.clock()
        if now - self._foreign_logged.get(node, -math.inf) >= FOREIGN_LOG_INTERVAL:
            self._foreign_logged[node] = now
            log.warning(
                "node %s reported on job %d, which runs on node %s: ignored (such reports are "
                "logged once a minute per node)",
                node,
                job_id,
                job.node,
            )

    def _current(self, report: apb.JobReport) -> bool:
        """The report is about the job's current start (or it cannot tell: attempt 0, or a
        job that is no longer running, which the store decides on)."""
        job = self.jobs.jobs.get(report.job_id)
        if report.attempt == 0 or job is None or job.state is not JobState.RUNNING:
            return True
        return report.attempt == job.start_count

    # ---- reconciliation --------------------------------------------------------------------

    async def _reconcile(
        self, node: str, reports: Sequence[apb.JobReport], session: AgentSession
    ) -> None:
        """Make the agent's jobs and the store's agree after a (re)connection."""
        ours = {j.id: j for j in self.jobs.running_on(node)}
        # a report of another start of a job counts as a report of a job the coordinator
        # does not run here (attempt 0: an agent that cannot tell, taken as the current one)
        current = [r for r in reports if r.job_id in ours and self._current(r)]
        reported = {r.job_id for r in current}
        # a start the agent does not know of never reached it (the coordinator stopped before
        # the message left, or the agent lost its run folder): the job never ran here
        unknown = [job_id for job_id in ours if job_id not in reported]
        strays = self._strays(node, reports)
        if unknown:
            await self.endings.record(
                [
                    Ending(i, JobState.PENDING, NOT_RECEIVED, attempt=ours[i].start_count)
                    for i in unknown
                ],
                Cause.agent(node),
            )
        grace = self.settings.kill_grace
        stops = [
            StopOrder(j.id, j.stop[0], j.stop[1], grace)
            for j in ours.values()
            if j.stop is not None and j.id in reported
        ]
        stops += [
            StopOrder(
                r.job_id,
                JobState.CANCELLED,
                "the coordinator no longer runs this job",
                5.0,
                attempt=r.attempt,
            )
            for r in strays
        ]
        if stops:
            self.agents.send_stop_message(session, stops)
        ends = [r for r in reports if r.kind in _OVER]
        if ends:
            await self._record_ends(node, ends)

    async def _record_ends(self, node: str, reports: Sequence[apb.JobReport]) -> None:
        # kept with the ends, or before the late ones: a job's end is never seen without it
        evidence = [(r.job_id, end_evidence(node, r)) for r in reports if _has_evidence(r)]
        ends: list[Ending] = []
        late: list[Ending] = []  # perhaps of starts given up with this node: history
        for report in reports:
            if not self._dispatched_here(node, report) or not self._current(report):
                if report.kind == apb.JobReport.ENDED:
                    late.append(ending_from_report(report))
                else:  # a start handed back unstarted: nothing ran
                    self._ignored(node, report.job_id)
                continue  # acknowledged below, and forgotten by the agent
            ending = ending_from_report(report)
            job = self.jobs.jobs[report.job_id]
            if len(job.node_names) > 1:  # the job's figures: every node's GPUs
                figures = self.samples.telemetry.with_final(
                    job.id, job.start_count, node, ending.telemetry
                )
                ending = replace(ending, telemetry=figures)
            ends.append(ending)
        if ends:
            await self.endings.record(ends, Cause.agent(node), evidence=evidence)
        elif evidence:
            now = self.clock()
            await self.writer.write(lambda tx: tx.keep_evidence(evidence, now))
        if late:
            for job_id in await self.endings.record_late(node, late):
                self._ignored(node, job_id)
        session = self.nodes.session(node)
        if session is not None:
            session.ack(r.job_id for r in reports)


def ending_from_report(report: apb.JobReport) -> Ending:
    """An agent's report of a job that is over on its side, as an Ending: its end state (one
    an agent may report; anything else is a failure), reason, result, time and figures."""
    if report.kind == apb.JobReport.NOT_STARTED:
        why = clean_line(report.result.reason, MAX_END_REASON)
        reason = f"requeued: {why}" if why else NOT_RECEIVED
        return Ending(report.job_id, JobState.PENDING, reason, attempt=report.attempt)
    try:
        state = JobState(report.end_state)
    except ValueError:
        state = JobState.FAILED
    if state not in AGENT_ENDINGS:
        state = JobState.FAILED
    at = report.at if math.isfinite(report.at) and report.at > 0 else None
    result = result_from_proto(report.result)
    if result.reason:
        result = replace(result, reason=clean_line(result.reason, MAX_END_REASON))
    reason = result.reason or state.value
    measured = telemetry_from_proto(report.telemetry) if report.HasField("telemetry") else None
    return Ending(report.job_id, state, reason, result, at, report.attempt, measured)


def _has_evidence(report: apb.JobReport) -> bool:
    """An end with something to keep: its peak host memory (`gpuq eff`, any end), the tail of
    its output (`gpuq diagnose`: agents send one only with an end that did not complete)."""
    return report.kind == apb.JobReport.ENDED and bool(report.output_tail or report.peak_mem)


def end_evidence(node: str, report: apb.JobReport) -> EndEvidence:
    """What a node sent with a job's end, for `gpuq diagnose` (its output's tail as text)."""
    tail = report.output_tail[-MAX_OUTPUT_TAIL:].decode("utf-8", errors="replace")
    return EndEvidence(node, report.attempt, report.peak_mem, tail)


def _is_mark(value: float) -> bool:
    """A usable time mark or duration from an agent: a positive finite number."""
    return math.isfinite(value) and value > 0


def node_from_registration(message: apb.Register, now: float) -> Node:
    return Node(
        name=message.node,
        units=tuple(unit_from_proto(u) for u in message.gpus),
        cpus=message.cpus,
        mem=message.mem,
        state=NodeState.UP,
        fake=message.fake,
        topology=tuple(sorted((t.a, t.b, t.distance) for t in message.topology)),
        last_seen=now,
        isolation=one_line(message.isolation),
        driver=one_line(message.driver),
        gpu_problem=one_line(message.gpu_problem),
        features=tuple(dict.fromkeys(message.features)),
        fence_time=min(message.fence_time, MAX_FENCE_TIME) if _is_mark(message.fence_time) else 0,
    )
