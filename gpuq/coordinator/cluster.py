"""The coordinator's memory of the cluster: live jobs and nodes, as the store last committed.

The store is the truth; this is the cache the scheduler and the listings read without a
database round trip. It changes only after a write committed, in commit order.
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from gpuq.domain.limits import MAX_AGENT_MESSAGE_BYTES
from gpuq.domain.model import Drain, Health, Job, JobSpec, Node, NodeState
from gpuq.domain.states import JobState
from gpuq.scheduler.fitting import NodeView, ShareUse
from gpuq.scheduler.plan import FitKey
from gpuq.v1 import agent_pb2
from gpuq.v1 import types_pb2 as pb

LIVE = (JobState.PENDING, JobState.HELD, JobState.RUNNING)
ACK_DELAY = 0.05  # seconds an acknowledgement may wait for a command to travel with


class AgentSession:
    """One connected agent stream. Commands accumulate here and leave as one message when the
    stream's writer next runs: under load, one message per scheduling pass, not per job.
    A message stays within `max_bytes` (the agent's receive limit): launches beyond it start
    the next message, which follows at once (a launch of the largest valid job fits alone).

    Acknowledgements are not urgent (they only let the agent forget a recorded end), so they
    wait up to ACK_DELAY for the next command instead of costing a message of their own: a
    job's end is then acknowledged by the message that starts the job after it."""

    def __init__(self, node: str, max_bytes: int = MAX_AGENT_MESSAGE_BYTES) -> None:
        self.node = node
        self.closed = False
        self.max_bytes = max_bytes
        self._full: deque[agent_pb2.CoordinatorMessage] = deque()  # filled, to leave first
        self._pending = agent_pb2.CoordinatorMessage()
        self._size = 0  # about what _pending takes on the wire (never less)
        self._ready = asyncio.Event()
        self._ack_timer: asyncio.TimerHandle | None = None

    def registered(self, heartbeat_interval: float, node_timeout: float = 0.0) -> None:
        self._pending.registered.heartbeat_interval = heartbeat_interval
        self._pending.registered.node_timeout = node_timeout
        self._size += 32
        self._ready.set()

    def start(self, launches: Iterable[agent_pb2.JobLaunch]) -> None:
        for launch in launches:
            self._room(launch.ByteSize() + _FRAMING)
            self._pending.start.append(launch)
        self._ready.set()

    def stop(self, stops: Iterable[agent_pb2.StopJob]) -> None:
        for stop in stops:
            self._room(stop.ByteSize() + _FRAMING)
            self._pending.stop.append(stop)
        self._ready.set()

    def pty(self, inputs: Iterable[agent_pb2.PtyInput]) -> None:
        """Interactive jobs' terminal traffic (gpuq.coordinator.terminals)."""
        for entry in inputs:
            self._room(entry.ByteSize() + _FRAMING)
            self._pending.pty.append(entry)
        self._ready.set()

    def signal(self, signals: Iterable[agent_pb2.SignalJob]) -> None:
        for entry in signals:
            self._room(entry.ByteSize() + _FRAMING)
            self._pending.signal.append(entry)
        self._ready.set()

    def backlog(self) -> int:
        """About how many bytes wait to leave (an agent that reads slowly has many)."""
        return self._size + len(self._full) * self.max_bytes

    def ack(self, job_ids: Iterable[int]) -> None:
        for job_id in job_ids:
            self._room(_FRAMING)
            self._pending.ack.append(job_id)
        if self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(ACK_DELAY, self._ready.set)

    def _room(self, size: int) -> None:
        """Make room for an entry of `size` bytes: a message that would outgrow max_bytes is
        finished and queued, and the entry starts the next one."""
        if self._size and self._size + size > self.max_bytes:
            self._full.append(self._pending)
            self._pending = agent_pb2.CoordinatorMessage()
            self._size = 0
        self._size += size

    async def next_message(self) -> agent_pb2.CoordinatorMessage | None:
        """What accumulated, once there is something; None when the session closed."""
        await self._ready.wait()
        self._ready.clear()
        self._cancel_ack_timer()  # the acks leave with this message
        if self.closed:
            return None
        if self._full:  # a batch too large for one message: the rest follow at once
            message = self._full.popleft()
            if self._full or self._size:
                self._ready.set()
            return message
        message, self._pending = self._pending, agent_pb2.CoordinatorMessage()
        self._size = 0
        return message

    def close(self) -> None:
        self.closed = True
        self._cancel_ack_timer()
        self._ready.set()

    def _cancel_ack_timer(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None


_FRAMING = 11  # bytes a repeated entry may add to its own size: a tag and a length (or a varint)


@dataclass(slots=True)
class NodeEntry:
    node: Node
    last_seen: float
    session: AgentSession | None = None
    usage: tuple[pb.GpuUsage, ...] = ()
    distances: dict[tuple[str, str], int] = field(default_factory=dict)
    # jobs the node still runs that the coordinator gave up on (it reported them when it came
    # back; they are being stopped): their units are not offered until the agent says they
    # are gone, so a GPU is never held by two jobs
    held: dict[int, frozenset[str]] = field(default_factory=dict)
    # why its agent says it cannot start jobs ("": it can): it is given no work meanwhile
    drained: str = ""
    # a heartbeat (with the units' health) came since the agent registered: until then a unit
    # an ended job left dirty must not look free (the agent sends one right after registering)
    heard: bool = False
    # its agent registered since this coordinator started: its features (memory only) are
    # known; until then a --constraint may match it (a restart must not refuse submissions)
    registered: bool = False

    def __post_init__(self) -> None:
        self.distances = {(a, b): d for a, b, d in self.node.topology}

    @property
    def connected(self) -> bool:
        return self.session is not None and not self.session.closed

    @property
    def drained_by_agent(self) -> bool:
        """Up and connected, but its agent says it cannot start jobs."""
        return self.node.state is NodeState.UP and self.connected and bool(self.drained)

    def down_reason(self, admin: Drain | None = None) -> str | None:
        """Why the node takes no work now (None: it takes work); `admin`: an admin's drain
        of the whole node."""
        if self.node.state is not NodeState.UP:
            return "is down"
        if not self.connected:
            return "has no agent connected"
        if admin is not None:
            return drained_text(admin)
        if self.drained:
            return f"drained by its agent: {self.drained}"
        return None

    def agent_health(self) -> dict[str, tuple[Health, str]]:
        """Units its agent's last heartbeat said are not ok: uuid -> (health, reason)."""
        found: dict[str, tuple[Health, str]] = {}
        for usage in self.usage:
            value = usage.health.strip().lower()
            if value in ("", Health.OK):
                continue
            health = Health.DIRTY if value == Health.DIRTY else Health.UNHEALTHY
            reason = " ".join(usage.health_reason.split())[:MAX_HEALTH_REASON]
            found[usage.uuid] = (health, reason or health.value)
        return found


MAX_HEALTH_REASON = 500  # characters of an agent's health reason kept and shown


def drained_text(drain: Drain) -> str:
    """`drained by admin: fan` (who and when are shown apart, in gpuq nodes)."""
    return f"drained by admin: {drain.reason}" if drain.reason else "drained by admin"


@dataclass(frozen=True, slots=True)
class UnitState:
    """A unit's health as the coordinator sees it: an admin's drain first, then the agent's."""

    health: Health
    reason: str  # every reason that applies, joined by "; " ("" when ok)
    drain: Drain | None = None


def unit_states(entry: NodeEntry, drains: dict[tuple[str, str], Drain]) -> dict[str, UnitState]:
    """Every unit of the node: ok, or drained / unhealthy / dirty with the reasons."""
    agent = entry.agent_health()
    states: dict[str, UnitState] = {}
    for unit in entry.node.units:
        drain = drains.get((entry.node.name, unit.uuid))
        texts = [drained_text(drain)] if drain is not None else []
        reported = agent.get(unit.uuid)
        if reported is not None:
            health, why = reported
            texts.append(f"{health.value}: {why}" if why != health.value else health.value)
        if drain is not None:
            states[unit.uuid] = UnitState(Health.DRAINED, "; ".join(texts), drain)
        elif reported is not None:
            states[unit.uuid] = UnitState(reported[0], "; ".join(texts))
        else:
            states[unit.uuid] = UnitState(Health.OK, "")
    return states


QueueKey = tuple[int, int, int, int]


def queue_key(job: Job, priority: float) -> QueueKey:
    """Higher priority first; among equals, submission order: the job id, or for an array
    task its array's id, then the task index (SLURM's order). Priorities rank as whole
    numbers, as SLURM's do, so float noise never reorders equal jobs."""
    order = job.array_job_id if job.array_job_id is not None else job.id
    return (-math.floor(priority), order, job.array_task_id or 0, job.id)


class ClusterState:
    """Live jobs, indexed by state; pending ones also in queue order, kept sorted as they
    come and go (a scheduling pass then walks the queue without sorting it). A job's place in
    the queue is its priority when it was queued or last re-ranked (`rerank`).

    An array's record (a Job with `tasks`) is live but never queued: the passes split tasks
    off it as they can run (gpuq.coordinator.passes), so a held or waiting array of 100,000
    tasks costs one entry."""

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
        self._queue: list[QueueKey] = []  # of pending jobs, sorted
        self.records: dict[int, Job] = {}  # arrays' records with tasks not yet split off
        self.array_live: Counter[int] = Counter()  # live rows per array
        self.array_pending: Counter[int] = Counter()  # queued (split) tasks per array
        self.array_running: Counter[int] = Counter()
        self.task_jobs: dict[tuple[int, int], int] = {}  # live (array, task) -> job id
        self.user_tasks: Counter[str] = Counter()  # live jobs per user, a record its tasks
        # what each user's live jobs hold in this process (scripts, environments, arguments)
        self.user_bytes: Counter[str] = Counter()
        # admins' drains (gpuq drain), as the store has them: (node, unit uuid or "") -> drain
        self.drains: dict[tuple[str, str], Drain] = {}

    def put(self, job: Job) -> None:
        """Record a job's new version; finished jobs leave memory."""
        old = self.jobs.pop(job.id, None)
        if old is not None:
            self._forget(old)
        if job.state.is_live:
            self.jobs[job.id] = job
            self._by_state[job.state][job.id] = job
            self.user_tasks[job.user] += len(job.tasks) or 1
            self.user_bytes[job.user] += spec_size(job.spec)
            array = job.array_job_id
            if job.tasks:
                self.records[job.id] = job
            elif job.state is JobState.PENDING:
                self._enqueue(job)
            if array is not None:
                self.array_live[array] += 1
                if job.array_task_id is not None:
                    self.task_jobs[(array, job.array_task_id)] = job.id
                if job.state is JobState.PENDING and not job.tasks:
                    self.array_pending[array] += 1
                elif job.state is JobState.RUNNING:
                    self.array_running[array] += 1

    def _forget(self, old: Job) -> None:
        del self._by_state[old.state][old.id]
        self.records.pop(old.id, None)
        self.user_tasks[old.user] -= len(old.tasks) or 1
        if self.user_tasks[old.user] <= 0:
            del self.user_tasks[old.user]
        self.user_bytes[old.user] -= spec_size(old.spec)
        if self.user_bytes[old.user] <= 0:
            del self.user_bytes[old.user]
        if old.state is JobState.PENDING and not old.tasks:
            self._dequeue(old)
        array = old.array_job_id
        if array is not None:
            _decrement(self.array_live, array)
            if old.array_task_id is not None:
                self.task_jobs.pop((array, old.array_task_id), None)
            if old.state is JobState.PENDING and not old.tasks:
                _decrement(self.array_pending, array)
            elif old.state is JobState.RUNNING:
                _decrement(self.array_running, array)

    def _enqueue(self, job: Job) -> None:
        priority = self.priority_of(job)
        self.priority[job.id] = priority
        bisect.insort(self._queue, queue_key(job, priority))
        self.shapes[self.key_of(job)] += 1

    def _dequeue(self, job: Job) -> None:
        index = bisect.bisect_left(self._queue, queue_key(job, self.priority.pop(job.id)))
        del self._queue[index]
        key = self.key_of(job)
        self.shapes[key] -= 1
        if not self.shapes[key]:
            del self.shapes[key]

    def rerank(self) -> None:
        """Recompute every pending job's priority (age and fair share move)."""
        pending = [j for j in self._by_state[JobState.PENDING].values() if not j.tasks]
        self.priority = {job.id: self.priority_of(job) for job in pending}
        self._queue = sorted(queue_key(job, self.priority[job.id]) for job in pending)

    def reset(self, jobs: Iterable[Job]) -> None:
        self.jobs.clear()
        self._queue.clear()
        self.priority.clear()
        self.shapes.clear()
        for by_id in self._by_state.values():
            by_id.clear()
        for counter in (self.array_live, self.array_pending, self.array_running):
            counter.clear()
        self.user_tasks.clear()
        self.user_bytes.clear()
        self.records.clear()
        self.task_jobs.clear()
        for job in jobs:
            self.put(job)

    def queue(self) -> Iterator[Job]:
        """Pending jobs by priority, then submit order."""
        pending = self._by_state[JobState.PENDING]
        return (pending[key[-1]] for key in list(self._queue))

    def running_on(self, node: str) -> list[Job]:
        return [j for j in self.in_state(JobState.RUNNING) if j.node == node]

    def in_state(self, state: JobState) -> Iterable[Job]:
        return self._by_state[state].values()

    def node_views(self) -> list[NodeView]:
        used_units: dict[str, set[str]] = {name: set() for name in self.nodes}
        used_cpus = dict.fromkeys(self.nodes, 0)
        used_mem = dict.fromkeys(self.nodes, 0)
        # live MPS shares per node and unit (such a unit is used: no whole job gets it)
        shares: dict[str, dict[str, list[ShareUse]]] = {name: {} for name in self.nodes}
        for job in self.in_state(JobState.RUNNING):
            if job.node in used_units:
                res = job.spec.resources
                used_units[job.node].update(job.gpus)
                used_cpus[job.node] += res.cpus
                used_mem[job.node] += res.mem or 0
                if res.gpu_share is not None:
                    use = ShareUse(job.id, job.user, res.gpu_share, res.gpu_mem or 0)
                    for unit in job.gpus:
                        shares[job.node].setdefault(unit, []).append(use)
        for name, entry in self.nodes.items():
            for units in entry.held.values():
                used_units[name].update(units)
                for unit in units:  # a job being stopped holds it: no share joins it either
                    shares[name].pop(unit, None)
        views = []
        for name, entry in sorted(self.nodes.items()):
            down = entry.down_reason(self.drains.get((name, "")))
            states = unit_states(entry, self.drains)
            views.append(
                NodeView(
                    name=name,
                    up=down is None,
                    down_reason=down or "is down",
                    units=entry.node.units,
                    free_units=frozenset(u.uuid for u in entry.node.units) - used_units[name],
                    cpus=entry.node.cpus,
                    cpus_free=entry.node.cpus - used_cpus[name],
                    mem=entry.node.mem,
                    mem_free=entry.node.mem - used_mem[name],
                    distances=entry.distances,
                    shares={unit: tuple(uses) for unit, uses in shares[name].items()},
                    features=frozenset(entry.node.features) if entry.registered else None,
                    unhealthy={
                        uuid: state.reason
                        for uuid, state in states.items()
                        if state.health is not Health.OK
                    }
                    if entry.heard or not entry.connected
                    else dict.fromkeys(
                        (u.uuid for u in entry.node.units), "its agent has not reported it yet"
                    ),
                )
            )
        return views


def _decrement(counter: Counter[int], key: int) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


def spec_size(spec: JobSpec) -> int:
    """About what a job's spec holds in memory: its script, environment and arguments (the
    parts a user sizes; characters, which is cheap: the script is not encoded again)."""
    env = sum(len(k) + len(v) for k, v in spec.env.items())
    return len(spec.script) + env + sum(len(a) for a in spec.args)
