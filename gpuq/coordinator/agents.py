"""The coordinator's side of the agent streams: registration and reconciliation, job reports,
heartbeats, and the two chores that watch agents (heartbeat timeouts, time-limit backstop).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import defaultdict
from collections.abc import Coroutine, Sequence
from functools import partial
from typing import Any

from gpuq.convert import result_from_proto, spec_to_proto, unit_from_proto
from gpuq.coordinator.cluster import AgentSession, NodeEntry
from gpuq.coordinator.core import Coordinator, Ending, StopOrder
from gpuq.domain.model import Job, JobResult, Node, NodeState
from gpuq.domain.states import TRANSITIONS, JobState
from gpuq.errors import Conflict, IllegalTransition, NotFound
from gpuq.store.api import StoreTx
from gpuq.v1 import agent_pb2 as apb

log = logging.getLogger(__name__)

# how a job's processes can end, as an agent sees it (node_fail is the coordinator's verdict)
AGENT_ENDINGS = TRANSITIONS[JobState.RUNNING] - {JobState.NODE_FAIL}
TIME_LIMIT_SLACK = 10.0  # seconds past limit + grace before the coordinator steps in


class AgentLink:
    def __init__(self, coordinator: Coordinator) -> None:
        self.co = coordinator
        self._tasks: set[asyncio.Task[None]] = set()
        coordinator.send_starts = self.send_starts
        coordinator.send_stops = self.send_stops

    # ---- stream lifecycle ------------------------------------------------------------------

    async def register(self, message: apb.Register, session: AgentSession) -> None:
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
        )
        await co.save_node(node)
        session.registered(co.settings.heartbeat_interval)
        co.cluster.nodes[name] = NodeEntry(node, last_seen=now, session=session)
        try:
            await self._reconcile(name, message.jobs, session)
        except BaseException:
            self.disconnected(name, session)  # a later registration must not be refused
            raise
        log.info(
            "node %s registered: %d GPUs%s", name, len(node.units), " (FAKE)" if node.fake else ""
        )
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
            entry.usage = tuple(message.usage)

    def reports(self, node: str, reports: Sequence[apb.JobReport]) -> None:
        """Handle reports without holding up the stream: ends commit in the writer's batches."""
        entry = self.co.cluster.nodes.get(node)
        if entry is not None:
            entry.last_seen = self.co.clock()
        ends = [r for r in reports if r.kind == apb.JobReport.ENDED]
        if ends:
            self._spawn(self._record_ends(node, ends))

    # ---- reconciliation --------------------------------------------------------------------

    async def _reconcile(
        self, node: str, reports: Sequence[apb.JobReport], session: AgentSession
    ) -> None:
        """Make the agent's jobs and the store's agree after a (re)connection."""
        co = self.co
        reported = {r.job_id for r in reports}
        ours = {j.id: j for j in co.cluster.running_on(node)}
        lost = [job_id for job_id in ours if job_id not in reported]
        if lost:
            await self._fail_lost(lost)
        strays = [
            r.job_id for r in reports if r.kind == apb.JobReport.RUNNING and r.job_id not in ours
        ]
        stops = [
            StopOrder(j.id, j.stop[0], j.stop[1], co.settings.kill_grace)
            for j in ours.values()
            if j.stop is not None and j.id in reported
        ]
        stops += [
            StopOrder(i, JobState.CANCELLED, "the coordinator no longer runs this job", 5.0)
            for i in strays
        ]
        if stops:
            self._send_stop_message(session, stops)
        ends = [r for r in reports if r.kind == apb.JobReport.ENDED]
        if ends:
            await self._record_ends(node, ends)

    async def _fail_lost(self, job_ids: list[int]) -> None:
        reason = "lost: the agent came back without the job"
        await self.co.end_jobs([Ending(i, JobState.NODE_FAIL, reason) for i in job_ids])

    async def _record_ends(self, node: str, reports: Sequence[apb.JobReport]) -> None:
        ends: list[tuple[int, JobState, JobResult, float | None]] = []
        for report in reports:
            try:
                state = JobState(report.end_state)
            except ValueError:
                state = JobState.FAILED
            if state not in AGENT_ENDINGS:
                state = JobState.FAILED
            at = report.at if math.isfinite(report.at) and report.at > 0 else None
            ends.append((report.job_id, state, result_from_proto(report.result), at))
        await self.co.record_ends(node, ends)
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
            )
            for o in orders
        )

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

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("handling agent reports failed", exc_info=task.exception())


def _request_stop(tx: StoreTx, order: StopOrder) -> None:
    tx.request_stop(order.job_id, order.end_state, order.reason)
