"""What the coordinator tells agents: starts and stops, each to the node's connected stream.

A node without a connected agent misses nothing: a start waits in the store (the agent's
reconnection reconciles it) and a stop is recorded with the job and sent when it reconnects.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence

from gpuq.convert import spec_to_proto
from gpuq.coordinator.changes.effects import StopOrder
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.node_table import NodeTable
from gpuq.coordinator.nodes.agent_input import LOOPBACK
from gpuq.coordinator.nodes.agent_session import AgentSession
from gpuq.domain.model import Job
from gpuq.v1 import agent_pb2 as apb

log = logging.getLogger(__name__)


class AgentCommands:
    def __init__(
        self,
        jobs: LiveJobs,
        nodes: NodeTable,
        time_limit: Callable[[Job], int | None],
        kill_grace: float,
        max_output: Callable[[Job], int | None] = lambda job: None,
    ) -> None:
        self.jobs = jobs
        self.nodes = nodes
        self.time_limit = time_limit  # a job's effective limit (its QOS's may be lower)
        self.kill_grace = kill_grace
        self.max_output = max_output  # its QOS's max_output (None: the agent's own applies)

    def send_starts(self, jobs: Sequence[Job]) -> None:
        """A launch to every node of each job: the first runs its script, the others a step
        worker each (gpuq.steps), all told every node and its address."""
        by_node: dict[str, list[apb.JobLaunch]] = defaultdict(list)
        # which node each unit is on: only a multi-node job's units need splitting
        on = self.nodes.unit_nodes() if any(j.nodes for j in jobs) else {}
        for job in jobs:
            assert job.node is not None
            nodes = job.node_names
            addresses = distinct_loopbacks([self._address(n) for n in nodes])
            for index, node in enumerate(nodes):
                # each node is given its own units
                units = [u for u in job.gpus if on.get(u) == node] if job.nodes else job.gpus
                launch = self._launch(job, units)
                launch.nodes.extend(nodes)
                launch.node_addrs.extend(addresses)
                launch.node_index = index
                by_node[node].append(launch)
        for node, launches in by_node.items():
            session = self.nodes.session(node)
            if session is None:
                log.warning(
                    "node %s has no agent connected; %d starts wait for it", node, len(launches)
                )
                continue
            session.start(launches)

    def _launch(self, job: Job, units: Sequence[str]) -> apb.JobLaunch:
        return apb.JobLaunch(
            job_id=job.id,
            spec=spec_to_proto(job.spec),
            gpus=list(units),
            user=job.user,
            array_job_id=job.array_job_id,
            array_task_id=job.array_task_id,
            time_limit=self.time_limit(job) or 0,
            kill_grace=self.kill_grace,
            requeue_count=job.requeue_count,
            attempt=job.start_count,
            master_port=job.master_port or 0,
            step_key=job.step_key or "",
            max_output=self.max_output(job) or 0,
        )

    def _address(self, node: str) -> str:
        entry = self.nodes.get(node)
        return entry.address if entry is not None and entry.address else LOOPBACK

    def send_stops(self, orders: Sequence[StopOrder]) -> None:
        by_node: dict[str, list[StopOrder]] = defaultdict(list)
        for order in orders:
            job = self.jobs.jobs.get(order.job_id)
            if job is not None:
                for node in job.node_names:
                    by_node[node].append(order)
        self._send_by_node(by_node)

    def stop_left_behind(self, jobs: Sequence[tuple[Job, StopOrder]], skip: str | None) -> None:
        """Jobs that stopped running in the coordinator's eyes (ended, requeued, their node
        lost) while other nodes of theirs may still run them: each of those nodes is told to
        stop its part now. `skip`: the node whose report ended them (its part is gone)."""
        by_node: dict[str, list[StopOrder]] = defaultdict(list)
        for job, order in jobs:
            for node in job.node_names:
                if node != skip:
                    by_node[node].append(order)
        self._send_by_node(by_node)

    def _send_by_node(self, by_node: dict[str, list[StopOrder]]) -> None:
        for node, node_orders in by_node.items():
            session = self.nodes.session(node)
            if session is not None:
                self.send_stop_message(session, node_orders)
            # otherwise the stop is in the store and is sent when the agent reconnects

    def send_stop_message(self, session: AgentSession, orders: Sequence[StopOrder]) -> None:
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
        job = self.jobs.jobs.get(job_id)
        return job.start_count if job is not None else 0


def distinct_loopbacks(addresses: list[str]) -> list[str]:
    """Nodes of one job that share a loopback address (agents on one machine, over its Unix
    socket) get one each, 127.0.0.<i+1>: every step worker binds its own address at the
    job's one step port. Linux routes all of 127/8 to the loopback device."""
    seen: set[str] = set()
    distinct = []
    for index, address in enumerate(addresses):
        if address in seen and address.startswith("127.") and index < 254:
            address = f"127.0.0.{index + 1}"
        seen.add(address)
        distinct.append(address)
    return distinct
