"""The coordinator's side of the agent streams: registration and reconciliation, job reports,
heartbeats, and the two chores that watch agents (heartbeat timeouts, time-limit backstop).
"""

from __future__ import annotations

import logging
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from gpuq.convert import result_from_proto, spec_to_proto, telemetry_from_proto, unit_from_proto
from gpuq.coordinator import idle
from gpuq.coordinator.background import Background
from gpuq.coordinator.cluster import AgentSession, NodeEntry
from gpuq.coordinator.core import Coordinator, Ending, StopOrder
from gpuq.domain.limits import (
    CONTROL_RE,
    MAX_JOB_ID,
    MAX_NODE_TEXT,
    MAX_NODE_UNITS,
    MAX_TOPOLOGY_LINKS,
    MAX_UNIT_ID,
    check_range,
    check_text,
    clean_line,
    shown,
)
from gpuq.domain.model import Job, Node, NodeState, is_advisory
from gpuq.domain.node_constraints import check_node_features
from gpuq.domain.states import TRANSITIONS, JobState
from gpuq.errors import Conflict, IllegalTransition, InvalidInput, NotFound
from gpuq.store.api import StoreTx
from gpuq.v1 import agent_pb2 as apb
from gpuq.v1 import types_pb2 as pb

log = logging.getLogger(__name__)

# how a job's processes can end, as an agent sees it (node_fail: an agent cut off from the
# coordinator stopped it, "fenced"; back to pending is a start that never reached the agent,
# reported as NOT_STARTED, not an ending)
AGENT_ENDINGS = TRANSITIONS[JobState.RUNNING] - {JobState.PENDING}
TIME_LIMIT_SLACK = 10.0  # seconds past limit + grace before the coordinator steps in
NOT_RECEIVED = "requeued: the agent never received the start"
# what an agent reports about a job that is over on its side (ended, or handed back unstarted)
_OVER = (apb.JobReport.ENDED, apb.JobReport.NOT_STARTED)


class AgentLink:
    def __init__(self, coordinator: Coordinator) -> None:
        self.co = coordinator
        self._background = Background("handling agent reports")
        self._foreign_logged: dict[str, float] = {}  # node -> when its last was logged
        coordinator.send_starts = self.send_starts
        coordinator.send_stops = self.send_stops
        coordinator.terminals.session_of = self._session  # interactive jobs' terminals

    # ---- stream lifecycle ------------------------------------------------------------------

    async def register(self, message: apb.Register, session: AgentSession) -> None:
        check_registration(message)  # InvalidInput: the stream ends INVALID_ARGUMENT
        co = self.co
        name = message.node
        entry = co.cluster.nodes.get(name)
        if entry is not None and entry.session is not None and not entry.session.closed:
            raise Conflict(f"node {name} is already connected to another agent")
        now = co.clock()
        node = Node(
            name=name,
            units=tuple(unit_from_proto(u) for u in message.gpus),
            cpus=message.cpus,
            mem=message.mem,
            state=NodeState.UP,
            fake=message.fake,
            topology=tuple(sorted((t.a, t.b, t.distance) for t in message.topology)),
            last_seen=now,
            isolation=_line(message.isolation),
            driver=_line(message.driver),
            gpu_problem=_line(message.gpu_problem),
            features=tuple(dict.fromkeys(message.features)),
        )
        # what it runs that the coordinator does not (found before the node is offered again)
        strays = [r.job_id for r in self._strays(name, message.jobs)]
        held = await co.writer.read(lambda s: s.units_used_on(name, strays)) if strays else {}
        await co.save_node(node)
        session.registered(co.settings.heartbeat_interval, co.settings.heartbeat_timeout)
        co.cluster.nodes[name] = NodeEntry(
            node, last_seen=now, session=session, held=held, registered=True
        )
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
        co.terminals.agent_connected(name)  # its interactive jobs' window sizes, pauses
        log.info(
            "node %s registered: %d GPUs%s", name, len(node.units), " (FAKE)" if node.fake else ""
        )
        if node.gpu_problem:
            log.warning("node %s offers no GPUs: %s", name, node.gpu_problem)
        if is_advisory(node.isolation):
            log.warning("node %s: GPU isolation is %s", name, node.isolation)
        co.wake()

    def disconnected(self, node: str, session: AgentSession) -> None:
        """The stream ended; the node stays up until its heartbeat timeout (a restarting
        agent re-adopts its jobs within it)."""
        entry = self.co.cluster.nodes.get(node)
        if entry is not None and entry.session is session:
            entry.session = None
        session.close()

    def heartbeat(self, node: str, message: apb.Heartbeat) -> None:
        entry = self.co.cluster.nodes.get(node)
        if entry is not None:
            entry.last_seen = self.co.clock()
            first = not entry.heard
            entry.heard = True
            # applied before the reports of the same message (the servicer's order): a unit
            # its ended job left dirty is dirty before that job's end frees it, so the pass
            # that follows the end never gives it out
            before = entry.agent_health()
            entry.usage = clean_usage(message.usage)
            after = entry.agent_health()
            if first:
                self.co.wake()  # its units may be given out now
            if after != before:
                for uuid in sorted(after.keys() - before.keys()):
                    log.warning("node %s: unit %s %s: %s", node, uuid, *after[uuid])
                for uuid in sorted(before.keys() - after.keys()):
                    log.info("node %s: unit %s is ok again", node, uuid)
                self.co.wake()  # a unit that is ok again may start a job
            # an agent that cannot start jobs (its fork server cannot be restarted, launches
            # keep failing) is sent none until it says it can again; its running jobs stay
            drained = clean_line(message.not_accepting_reason, MAX_NODE_TEXT)
            drained = drained or "it cannot start jobs"
            drained = drained if message.not_accepting else ""
            if drained != entry.drained:
                if drained and not entry.drained:
                    log.warning("node %s takes no work: its agent says %s", node, drained)
                elif not drained:
                    log.info("node %s takes work again: its agent can start jobs", node)
                entry.drained = drained
                self.co.wake()
            self._samples(node, message.jobs)
            self.co.telemetry.running(node, message.jobs)  # GPU telemetry so far

    def _samples(self, node: str, samples: Sequence[apb.JobSample]) -> None:
        """Feed the samples of jobs running here (and not being stopped) to the idle and hung
        rules (gpuq.coordinator.idle), and act on what they decide; others are ignored."""
        co = self.co
        now = co.clock()
        for message in samples[:MAX_JOB_SAMPLES]:
            job = co.cluster.jobs.get(message.job_id)
            if job is None or job.state is not JobState.RUNNING or job.node != node:
                continue
            tier = co.settings.qos.get(job.qos)
            if tier is None or job.stop is not None:
                continue
            sample = sample_from_proto(message, job.gpus, now)
            decisions = co.idle.observe(sample, job.start_count, tier)
            if decisions:
                self._background.spawn(self._act_on(job, decisions))
        if co.idle.tracks:
            jobs = co.cluster.jobs
            co.idle.prune(lambda i: i in jobs and jobs[i].state is JobState.RUNNING)

    async def _act_on(self, job: Job, decisions: Sequence[idle.Decision]) -> None:
        """Log a flag set or cleared and note it in the job's events; cancel the job where its
        QOS says so (the normal cancel path, as the admin "gpuq")."""
        co = self.co
        for d in decisions:
            if d.action == "cancel":
                log.warning("job %d: %s", job.id, d.text)
                await co.cancel([str(job.id)], "gpuq", d.text, admin=True)
                continue
            note = d.text if d.action == "flag" else f"flag cleared: {d.text}"
            if d.action == "flag":
                log.warning("job %d of %s on node %s: %s", job.id, job.user, job.node, d.text)
            else:
                log.info("job %d: %s", job.id, note)
            await co.writer.write(partial(_note, job_id=job.id, at=co.clock(), text=note))

    def reports(self, node: str, reports: Sequence[apb.JobReport]) -> None:
        """Handle reports without holding up the stream: ends commit in the writer's batches."""
        entry = self.co.cluster.nodes.get(node)
        if entry is not None:
            entry.last_seen = self.co.clock()
        ends = [r for r in reports if r.kind in _OVER and sane_report(r)]
        if ends:
            if entry is not None and entry.held:
                gone = [r.job_id for r in ends if entry.held.pop(r.job_id, None) is not None]
                if gone:
                    log.info("node %s: stopped jobs %s are gone; their GPUs are free", node, gone)
                    self.co.wake()
            self._background.spawn(self._record_ends(node, ends))

    def pty(self, node: str, entries: Sequence[apb.PtyOutput]) -> None:
        """Interactive jobs' terminal output (gpuq.coordinator.terminals), taken before the
        reports of the same message: a job's output arrives before its end."""
        self.co.terminals.output(node, entries)

    def _strays(self, node: str, reports: Sequence[apb.JobReport]) -> list[apb.JobReport]:
        """Jobs the agent says run there that the coordinator does not run there (not at
        all, or another start of them): they are to be stopped."""
        ours = {j.id for j in self.co.cluster.running_on(node)}
        return [
            r
            for r in reports
            if r.kind == apb.JobReport.RUNNING and (r.job_id not in ours or not self._current(r))
        ]

    def _dispatched_here(self, node: str, report: apb.JobReport) -> bool:
        """A node reports only on jobs dispatched to it: a report on a job that runs elsewhere
        (or on nothing the coordinator runs) changes nothing. A job no longer running (ended,
        requeued after its node was given up) is normal after a reconnection; one running on
        another node is not, and is logged (at most once a minute per node)."""
        job = self.co.cluster.jobs.get(report.job_id)
        if job is not None and job.state is JobState.RUNNING and job.node == node:
            return True
        if job is not None and job.state is JobState.RUNNING:
            now = self.co.clock()
            if now - self._foreign_logged.get(node, -math.inf) >= FOREIGN_LOG_INTERVAL:
                self._foreign_logged[node] = now
                log.warning(
                    "node %s reported on job %d, which runs on node %s: ignored (such reports "
                    "are logged once a minute per node)",
                    node,
                    report.job_id,
                    job.node,
                )
        else:
            log.debug("node %s: ignoring a report on job %d, not running", node, report.job_id)
        return False

    def _current(self, report: apb.JobReport) -> bool:
        """The report is about the job's current start (or it cannot tell: attempt 0, or a
        job that is no longer running, which the store decides on)."""
        job = self.co.cluster.jobs.get(report.job_id)
        if report.attempt == 0 or job is None or job.state is not JobState.RUNNING:
            return True
        return report.attempt == job.start_count

    # ---- reconciliation --------------------------------------------------------------------

    async def _reconcile(
        self, node: str, reports: Sequence[apb.JobReport], session: AgentSession
    ) -> None:
        """Make the agent's jobs and the store's agree after a (re)connection."""
        co = self.co
        ours = {j.id: j for j in co.cluster.running_on(node)}
        # a report of another start of a job counts as a report of a job the coordinator
        # does not run here (attempt 0: an agent that cannot tell, taken as the current one)
        current = [r for r in reports if r.job_id in ours and self._current(r)]
        reported = {r.job_id for r in current}
        # a start the agent does not know of never reached it (the coordinator stopped before
        # the message left, or the agent lost its run folder): the job never ran here
        unknown = [job_id for job_id in ours if job_id not in reported]
        strays = self._strays(node, reports)
        if unknown:
            await self._requeue_not_received(unknown)
        stops = [
            StopOrder(j.id, j.stop[0], j.stop[1], co.settings.kill_grace)
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
            self._send_stop_message(session, stops)
        ends = [r for r in reports if r.kind in _OVER]
        if ends:
            await self._record_ends(node, ends)

    async def _requeue_not_received(self, job_ids: list[int]) -> None:
        jobs = self.co.cluster.jobs
        await self.co.end_jobs(
            [
                Ending(i, JobState.PENDING, NOT_RECEIVED, attempt=jobs[i].start_count)
                for i in job_ids
            ]
        )

    async def _record_ends(self, node: str, reports: Sequence[apb.JobReport]) -> None:
        ends: list[Ending] = []
        for report in reports:
            if not self._dispatched_here(node, report):
                continue  # acknowledged below, and forgotten by the agent
            if not self._current(report):
                log.info(
                    "node %s: ignoring a report on job %d's start %d (it is at start %d)",
                    node,
                    report.job_id,
                    report.attempt,
                    self.co.cluster.jobs[report.job_id].start_count,
                )
                continue  # an earlier start's end: acknowledged below, and forgotten
            if report.kind == apb.JobReport.NOT_STARTED:
                why = clean_line(report.result.reason, MAX_END_REASON)
                reason = f"requeued: {why}" if why else NOT_RECEIVED
                ends.append(Ending(report.job_id, JobState.PENDING, reason, attempt=report.attempt))
                continue
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
            measured = (
                telemetry_from_proto(report.telemetry) if report.HasField("telemetry") else None
            )
            ends.append(Ending(report.job_id, state, reason, result, at, report.attempt, measured))
        if ends:
            await self.co.end_jobs(ends)
        session = self._session(node)
        if session is not None:
            session.ack(r.job_id for r in reports)

    # ---- commands to agents ----------------------------------------------------------------

    def send_starts(self, jobs: Sequence[Job]) -> None:
        by_node: dict[str, list[apb.JobLaunch]] = defaultdict(list)
        for job in jobs:
            assert job.node is not None
            by_node[job.node].append(self._launch(job))
        for node, launches in by_node.items():
            session = self._session(node)
            if session is None:
                log.warning(
                    "node %s has no agent connected; %d starts wait for it", node, len(launches)
                )
                continue
            session.start(launches)

    def _launch(self, job: Job) -> apb.JobLaunch:
        return apb.JobLaunch(
            job_id=job.id,
            spec=spec_to_proto(job.spec),
            gpus=list(job.gpus),
            user=job.user,
            array_job_id=job.array_job_id,
            array_task_id=job.array_task_id,
            time_limit=self.co.effective_time_limit(job) or 0,
            kill_grace=self.co.settings.kill_grace,
            requeue_count=job.requeue_count,
            attempt=job.start_count,
        )

    def send_stops(self, orders: Sequence[StopOrder]) -> None:
        by_node: dict[str, list[StopOrder]] = defaultdict(list)
        for order in orders:
            job = self.co.cluster.jobs.get(order.job_id)
            if job is not None and job.node is not None:
                by_node[job.node].append(order)
        for node, node_orders in by_node.items():
            session = self._session(node)
            if session is not None:
                self._send_stop_message(session, node_orders)
            # otherwise the stop is in the store and is sent when the agent reconnects

    def _send_stop_message(self, session: AgentSession, orders: Sequence[StopOrder]) -> None:
        session.stop(
            apb.StopJob(
                job_id=o.job_id,
                end_state=o.end_state.value,
                reason=o.reason,
                grace=o.grace,
                signal=o.signal,
                attempt=o.attempt or self._attempt(o.job_id),
            )
            for o in orders
        )

    def _attempt(self, job_id: int) -> int:
        job = self.co.cluster.jobs.get(job_id)
        return job.start_count if job is not None else 0

    def _session(self, node: str) -> AgentSession | None:
        entry = self.co.cluster.nodes.get(node)
        if entry is None or entry.session is None or entry.session.closed:
            return None
        return entry.session

    # ---- chores ------------------------------------------------------------------------------

    async def check_heartbeats(self) -> None:
        co = self.co
        now = co.clock()
        timeout = co.settings.heartbeat_timeout
        for name, entry in list(co.cluster.nodes.items()):
            if entry.node.state is NodeState.DOWN or now - entry.last_seen <= timeout:
                continue
            if entry.session is not None:
                entry.session.close()
                entry.session = None
            await co.fail_node_jobs(name, f"no word from its agent for {timeout:g} s")

    async def check_time_limits(self) -> None:
        """A backstop: supervisors enforce time limits; this catches one that could not."""
        co = self.co
        now = co.clock()
        overdue: list[StopOrder] = []
        for job in list(co.cluster.in_state(JobState.RUNNING)):
            limit = co.effective_time_limit(job)
            if limit is None or job.start_time is None or job.stop is not None:
                continue
            if now > job.start_time + limit + co.settings.kill_grace + TIME_LIMIT_SLACK:
                overdue.append(StopOrder(job.id, JobState.TIMEOUT, "time limit reached", 0.0))
        stopping: list[StopOrder] = []
        for order in overdue:
            try:
                await co.writer.write(partial(_request_stop, order=order))
            except (NotFound, IllegalTransition):
                continue  # it ended meanwhile
            co._stop_requested(order.job_id, order.end_state, order.reason)
            stopping.append(order)
        if stopping:
            self.send_stops(stopping)


def _note(tx: StoreTx, job_id: int, at: float, text: str) -> None:
    tx.add_event(job_id, at, JobState.RUNNING, text)


def _request_stop(tx: StoreTx, order: StopOrder) -> None:
    tx.request_stop(order.job_id, order.end_state, order.reason)


FOREIGN_LOG_INTERVAL = 60.0  # seconds between warnings of one node's reports on others' jobs
MAX_END_REASON = 1000  # characters of an agent's reason for a job's end
MAX_NOTES = 16  # notes an agent may attach to one unit
# a node's name, as gpuq.config takes it ([agent] node_name)
NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
# a unit's UUID (GPU-..., MIG-..., the older MIG-GPU-.../1/0) or PCI bus id (00000000:17:00.0)
UNIT_ID_RE = re.compile(r"[A-Za-z0-9_.:/+-]{1,96}")


MAX_JOB_SAMPLES = 4096  # job samples of one heartbeat looked at


def sample_from_proto(message: apb.JobSample, gpus: Sequence[str], now: float) -> idle.Sample:
    """A job's sample as the idle rules take it: one reading per unit the job holds (a unit
    the agent did not report on, or whose figure is not a number, is "unknown"); its time the
    agent's, or now where that is not a time."""
    given: dict[str, apb.UnitSample] = {u.uuid: u for u in message.units[:MAX_NODE_UNITS]}
    units: list[idle.UnitReading] = []
    for uuid in gpus:
        unit = given.get(uuid)
        util: float | None = None
        if unit is not None and unit.HasField("util") and math.isfinite(unit.util):
            util = min(100.0, max(0.0, unit.util))
        units.append(idle.UnitReading(uuid, util, unit.memory if unit is not None else 0))
    at = message.at if math.isfinite(message.at) and message.at > 0 else now
    return idle.Sample(message.job_id, at, tuple(units), message.output_bytes)


def _line(text: str) -> str:
    """An agent's free text as one bounded line."""
    return " ".join(text.split())[:MAX_NODE_TEXT]


def check_registration(message: apb.Register) -> None:
    """What an agent registers is bounded and holds no control characters (it is shown in
    gpuq nodes, status and job listings): InvalidInput naming the field otherwise."""
    if not NODE_NAME_RE.fullmatch(message.node):
        raise InvalidInput(
            "registration: node",
            shown(message.node),
            "use 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    check_range("registration: cpus", message.cpus, 0, MAX_NODE_CPUS)
    check_range("registration: mem", message.mem, 0, MAX_NODE_BYTES)
    if len(message.gpus) > MAX_NODE_UNITS:
        raise InvalidInput("registration: gpus", len(message.gpus), f"more than {MAX_NODE_UNITS}")
    for report in message.jobs:
        if not sane_report(report):
            raise InvalidInput(
                "registration: job", report.job_id, f"job ids go from 1 to {MAX_JOB_ID}"
            )
    for unit in message.gpus:
        _check_unit_id("registration: GPU uuid", unit.uuid)
        where = f"registration: GPU {brief_id(unit.uuid)}"
        check_range(f"{where} index", unit.index, 0, MAX_NODE_UNITS)
        check_range(f"{where} memory", unit.memory, 0, MAX_NODE_BYTES)
        check_text(f"{where} name", unit.name, MAX_NODE_TEXT)
        for field_name, value in (
            ("pci_bus_id", unit.pci_bus_id),
            ("parent_uuid", unit.parent_uuid),
            ("mig_profile", unit.mig_profile),
        ):
            if value:
                _check_unit_id(f"{where} {field_name}", value)
    check_node_features(list(message.features), "registration: features")
    if len(message.topology) > MAX_TOPOLOGY_LINKS:
        raise InvalidInput(
            "registration: topology", len(message.topology), f"more than {MAX_TOPOLOGY_LINKS} links"
        )
    for link in message.topology:
        _check_unit_id("registration: topology", link.a)
        _check_unit_id("registration: topology", link.b)
    for field_name, value in (
        ("driver", message.driver),
        ("isolation", message.isolation),
        ("gpu_problem", message.gpu_problem),
        ("version", message.version),
    ):
        # whitespace (a newline in an error text) is folded into spaces by _line; any other
        # control character (a terminal escape) is refused
        check_text(f"registration: {field_name}", _line(value), MAX_NODE_TEXT)


MAX_NODE_CPUS = 1 << 20
MAX_NODE_BYTES = 1 << 60  # host memory or one GPU's: far beyond any machine, inside the store's
MAX_ATTEMPT = 2**31 - 1


def sane_report(report: apb.JobReport) -> bool:
    """A report whose numbers the store can hold (anything else names no job of ours)."""
    return 1 <= report.job_id <= MAX_JOB_ID and report.attempt <= MAX_ATTEMPT


def _check_unit_id(field_name: str, value: str) -> None:
    if not UNIT_ID_RE.fullmatch(value):
        raise InvalidInput(field_name, shown(value), "use 1 to 96 letters, digits or _ . : / + -")


def brief_id(value: str) -> str:
    """A unit id as an error may name it (printable, short)."""
    return CONTROL_RE.sub("?", value[:MAX_UNIT_ID])


def clean_usage(usage: Sequence[pb.GpuUsage]) -> tuple[pb.GpuUsage, ...]:
    """A heartbeat's units as shown in gpuq nodes: at most MAX_NODE_UNITS, each text one
    bounded line without control characters (a heartbeat is never refused for its text)."""
    kept: list[pb.GpuUsage] = []
    for unit in usage[:MAX_NODE_UNITS]:
        texts = (unit.uuid, unit.health, unit.health_reason, *unit.notes)
        if len(unit.notes) > MAX_NOTES or any(
            len(t) > MAX_NODE_TEXT or CONTROL_RE.search(t) for t in texts
        ):
            clean = pb.GpuUsage()
            clean.CopyFrom(unit)
            clean.uuid = clean_line(unit.uuid, MAX_UNIT_ID)
            clean.health = clean_line(unit.health, 32)
            clean.health_reason = clean_line(unit.health_reason, MAX_NODE_TEXT)
            clean.notes[:] = [clean_line(n, MAX_NODE_TEXT) for n in unit.notes[:MAX_NOTES]]
            unit = clean
        kept.append(unit)
    return tuple(kept)
