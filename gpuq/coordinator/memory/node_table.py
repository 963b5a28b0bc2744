"""The coordinator's memory of nodes: each node's entry (its agent's stream, what its last
heartbeat said, jobs it still runs that were given up on), admins' drains, and the view of
every node the pure scheduler takes.

The store is the truth for nodes and drains; this is the cache that scheduling passes and
listings read. It changes only after a write committed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuq.coordinator.nodes.agent_session import AgentSession
from gpuq.domain.model import Drain, Health, Job, Node, NodeState
from gpuq.domain.partitions import Partition, node_partitions
from gpuq.scheduler.fitting import NodeView, ShareUse
from gpuq.v1 import types_pb2 as pb


@dataclass(slots=True)
class NodeEntry:
    node: Node
    last_seen: float  # wall clock: when the node last gave a sign of life, as listings show it
    # the same moment on the coordinator's steady clock (monotonic), which its silence is
    # measured by: a wall clock stepped forward (NTP, an admin's `date`) must not give a node
    # up before its supervisors, counting on their host's monotonic clock, have fenced its jobs
    heard_at: float = field(kw_only=True)
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
    # where other nodes reach its jobs (MASTER_ADDR, step workers): its [agent] address, else
    # the address its connection came from (memory only, as it registered)
    address: str = ""

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


class NodeTable:
    """Every node the coordinator knows, and admins' drains (gpuq drain) as the store has
    them: (node, unit uuid or "") -> drain."""

    def __init__(self, partitions: Mapping[str, Partition] | None = None) -> None:
        self.nodes: dict[str, NodeEntry] = {}
        self.drains: dict[tuple[str, str], Drain] = {}
        # `[partitions.NAME]`, and each node's partitions as computed from them (the config
        # is fixed while the coordinator runs)
        self.partitions: Mapping[str, Partition] = partitions or {}
        self._in_partitions: dict[str, frozenset[str]] = {}

    def partitions_of(self, name: str) -> frozenset[str]:
        """The partitions node `name` is in (none configured: none)."""
        found = self._in_partitions.get(name)
        if found is None:
            found = frozenset(node_partitions(self.partitions, name))
            self._in_partitions[name] = found
        return found

    def get(self, name: str) -> NodeEntry | None:
        return self.nodes.get(name)

    def session(self, name: str) -> AgentSession | None:
        """The node's connected agent stream, or None."""
        entry = self.nodes.get(name)
        if entry is None or entry.session is None or entry.session.closed:
            return None
        return entry.session

    def unit_nodes(self) -> dict[str, str]:
        """Each known unit's node (UUIDs are unique across nodes)."""
        return {u.uuid: name for name, entry in self.nodes.items() for u in entry.node.units}

    def views(self, running: Iterable[Job]) -> list[NodeView]:
        """Each node as the scheduler sees it, given the jobs running now."""
        nodes = self.nodes
        used_units: dict[str, set[str]] = {name: set() for name in nodes}
        used_cpus = dict.fromkeys(nodes, 0)
        used_mem = dict.fromkeys(nodes, 0)
        # live MPS shares per node and unit (such a unit is used: no whole job gets it)
        shares: dict[str, dict[str, list[ShareUse]]] = {name: {} for name in nodes}
        for job in running:
            res = job.spec.resources
            for node in job.node_names:
                if node not in used_units:
                    continue
                # units are named by UUID, unique across nodes: a node's own are its part
                used_units[node].update(job.gpus)
                # an --exclusive job holds all of the node's CPUs and memory, --mem=0 its memory
                whole = nodes[node].node
                used_cpus[node] += whole.cpus if res.exclusive else res.cpus
                used_mem[node] += whole.mem if res.exclusive or res.mem_all else res.mem or 0
                if res.gpu_share is not None:
                    use = ShareUse(job.id, job.user, res.gpu_share, res.gpu_mem or 0)
                    for unit in job.gpus:
                        shares[node].setdefault(unit, []).append(use)
        for name, entry in nodes.items():
            for units in entry.held.values():
                used_units[name].update(units)
                for unit in units:  # a job being stopped holds it: no share joins it either
                    shares[name].pop(unit, None)
        views = []
        for name, entry in sorted(nodes.items()):
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
                    partitions=self.partitions_of(name),
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
