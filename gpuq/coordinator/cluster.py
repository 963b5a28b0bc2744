"""The coordinator's memory of the cluster: live jobs and nodes, as the store last committed.

The store is the truth; this is the cache the scheduler and the listings read without a
database round trip. It changes only after a write committed, in commit order.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from gpuq.domain.model import Job, Node, NodeState
from gpuq.domain.states import JobState
from gpuq.scheduler.placement import NodeView
from gpuq.scheduler.plan import FitKey
from gpuq.v1 import agent_pb2
from gpuq.v1 import types_pb2 as pb

LIVE = (JobState.PENDING, JobState.HELD, JobState.RUNNING)
ACK_DELAY = 0.05  # seconds an acknowledgement may wait for a command to travel with


class AgentSession:
    """One connected agent stream. Commands accumulate here and leave as one message when the
    stream's writer next runs: under load, one message per scheduling pass, not per job.

    Acknowledgements are not urgent (they only let the agent forget a recorded end), so they
    wait up to ACK_DELAY for the next command instead of costing a message of their own: a
    job's end is then acknowledged by the message that starts the job after it."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.closed = False
        self._pending = agent_pb2.CoordinatorMessage()
        self._ready = asyncio.Event()
        self._ack_timer: asyncio.TimerHandle | None = None

    def registered(self, heartbeat_interval: float) -> None:
        self._pending.registered.heartbeat_interval = heartbeat_interval
        self._ready.set()

    def start(self, launches: Iterable[agent_pb2.JobLaunch]) -> None:
        self._pending.start.extend(launches)
        self._ready.set()

    def stop(self, stops: Iterable[agent_pb2.StopJob]) -> None:
        self._pending.stop.extend(stops)
        self._ready.set()

    def ack(self, job_ids: Iterable[int]) -> None:
        self._pending.ack.extend(job_ids)
        if self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(ACK_DELAY, self._ready.set)

    async def next_message(self) -> agent_pb2.CoordinatorMessage | None:
        """What accumulated, once there is something; None when the session closed."""
        await self._ready.wait()
        self._ready.clear()
        self._cancel_ack_timer()  # the acks leave with this message
        if self.closed:
            return None
        message, self._pending = self._pending, agent_pb2.CoordinatorMessage()
        return message

    def close(self) -> None:
        self.closed = True
        self._cancel_ack_timer()
        self._ready.set()

    def _cancel_ack_timer(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None


@dataclass(slots=True)
class NodeEntry:
    node: Node
    last_seen: float
    session: AgentSession | None = None
    usage: tuple[pb.GpuUsage, ...] = ()
    distances: dict[tuple[str, str], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.distances = {(a, b): d for a, b, d in self.node.topology}

    @property
    def connected(self) -> bool:
        return self.session is not None and not self.session.closed


class ClusterState:
    """Live jobs, indexed by state; pending ones also in queue order, kept sorted as they
    come and go (a scheduling pass then walks the queue without sorting it). A job's place in
    the queue is its priority when it was queued or last re-ranked (`rerank`)."""

    def __init__(
        self, key_of: Callable[[Job], FitKey], priority_of: Callable[[Job], float]
    ) -> None:
        self.jobs: dict[int, Job] = {}  # pending, held and running jobs
        self.nodes: dict[str, NodeEntry] = {}
        self.key_of = key_of
        self.priority_of = priority_of
        self.priority: dict[int, float] = {}  # of pending jobs, as ranked
        self.shapes: Counter[FitKey] = Counter()  # how many pending jobs have each fit key
        self._by_state: dict[JobState, dict[int, Job]] = {s: {} for s in LIVE}
        self._queue: list[tuple[float, int]] = []  # (-priority, id) of pending jobs, sorted

    def put(self, job: Job) -> None:
        """Record a job's new version; finished jobs leave memory."""
        old = self.jobs.pop(job.id, None)
        if old is not None:
            del self._by_state[old.state][job.id]
            if old.state is JobState.PENDING:
                self._dequeue(old)
        if job.state.is_live:
            self.jobs[job.id] = job
            self._by_state[job.state][job.id] = job
            if job.state is JobState.PENDING:
                self._enqueue(job)

    def _enqueue(self, job: Job) -> None:
        priority = self.priority_of(job)
        self.priority[job.id] = priority
        bisect.insort(self._queue, (-priority, job.id))
        self.shapes[self.key_of(job)] += 1

    def _dequeue(self, job: Job) -> None:
        index = bisect.bisect_left(self._queue, (-self.priority.pop(job.id), job.id))
        del self._queue[index]
        key = self.key_of(job)
        self.shapes[key] -= 1
        if not self.shapes[key]:
            del self.shapes[key]

    def rerank(self) -> None:
        """Recompute every pending job's priority (age and fair share move)."""
        pending = list(self._by_state[JobState.PENDING].values())
        self.priority = {job.id: self.priority_of(job) for job in pending}
        self._queue = sorted((-p, job_id) for job_id, p in self.priority.items())

    def reset(self, jobs: Iterable[Job]) -> None:
        self.jobs.clear()
        self._queue.clear()
        self.priority.clear()
        self.shapes.clear()
        for by_id in self._by_state.values():
            by_id.clear()
        for job in jobs:
            self.put(job)

    def queue(self) -> Iterator[Job]:
        """Pending jobs by priority, then submit order."""
        pending = self._by_state[JobState.PENDING]
        return (pending[job_id] for _, job_id in list(self._queue))

    def running_on(self, node: str) -> list[Job]:
        return [j for j in self.in_state(JobState.RUNNING) if j.node == node]

    def in_state(self, state: JobState) -> Iterable[Job]:
        return self._by_state[state].values()

    def node_views(self) -> list[NodeView]:
        used_units: dict[str, set[str]] = {name: set() for name in self.nodes}
        used_cpus = dict.fromkeys(self.nodes, 0)
        used_mem = dict.fromkeys(self.nodes, 0)
        for job in self.in_state(JobState.RUNNING):
            if job.node in used_units:
                used_units[job.node].update(job.gpus)
                used_cpus[job.node] += job.spec.resources.cpus
                used_mem[job.node] += job.spec.resources.mem or 0
        return [
            NodeView(
                name=name,
                up=entry.node.state is NodeState.UP and entry.connected,
                down_reason="is down"
                if entry.node.state is not NodeState.UP
                else "has no agent connected",
                units=entry.node.units,
                free_units=frozenset(u.uuid for u in entry.node.units) - used_units[name],
                cpus=entry.node.cpus,
                cpus_free=entry.node.cpus - used_cpus[name],
                mem=entry.node.mem,
                mem_free=entry.node.mem - used_mem[name],
                distances=entry.distances,
            )
            for name, entry in sorted(self.nodes.items())
        ]
