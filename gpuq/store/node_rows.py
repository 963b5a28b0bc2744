"""Nodes, admin drains and GPU allocations: which units each job holds or held. The database
backs the one promise that matters here (a unit has at most one live allocation, a partial
unique index); `check_units_free` says which unit and job collide before it comes to that.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Engine, and_, bindparam, delete, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from gpuq.domain.model import Allocation, Drain, Node, NodeState
from gpuq.errors import DoubleBooking, NotFound
from gpuq.store.records import GivenUp, JobStart
from gpuq.store.row_mapping import node_from_row, node_row
from gpuq.store.tables import allocations, drains, given_up_starts, nodes

GIVEN_UP_KEEP = 30 * 86400.0  # seconds a given-up start waits for its node's late report


class NodeReads:
    """The node and allocation reads of `gpuq.store.api.Store`."""

    engine: Engine

    def live_allocations(self) -> list[Allocation]:
        stmt = (
            select(allocations.c.job_id, allocations.c.node, allocations.c.unit)
            .where(allocations.c.live)
            .order_by(allocations.c.job_id, allocations.c.id)
        )
        grouped: dict[int, tuple[str, list[str]]] = {}
        with self.engine.connect() as conn:
            for job_id, node, unit in conn.execute(stmt):
                grouped.setdefault(job_id, (node, []))[1].append(unit)
        return [Allocation(job_id, node, tuple(units)) for job_id, (node, units) in grouped.items()]

    def units_used_on(self, node: str, job_ids: Iterable[int]) -> dict[int, frozenset[str]]:
        """Every unit each job was ever given on `node` (released or not): what a job that
        still runs there, unknown to the coordinator, may hold."""
        wanted = sorted(set(job_ids))
        found: dict[int, set[str]] = {}
        if not wanted:
            return {}
        stmt = select(allocations.c.job_id, allocations.c.unit).where(
            and_(allocations.c.node == node, allocations.c.job_id.in_(wanted))
        )
        with self.engine.connect() as conn:
            for job_id, unit in conn.execute(stmt):
                found.setdefault(int(job_id), set()).add(unit)
        return {job_id: frozenset(units) for job_id, units in found.items()}

    def list_nodes(self) -> list[Node]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(nodes).order_by(nodes.c.name)).all()
        return [node_from_row(row) for row in rows]

    def given_up_starts(self) -> list[GivenUp]:
        """The starts given up with their node that may still be reported, oldest first."""
        stmt = select(given_up_starts).order_by(given_up_starts.c.at, given_up_starts.c.job_id)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        return [
            GivenUp(row.job_id, row.attempt, tuple(row.nodes.split(",")), row.first, row.at)
            for row in rows
        ]

    def drains(self) -> list[Drain]:
        """Every admin drain (gpuq drain), by node, the whole node's ("" unit) first."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(drains).order_by(drains.c.node, drains.c.unit)).all()
        return [Drain(row.node, row.unit, row.reason, row.by, row.at) for row in rows]


class NodeWrites:
    """The node and drain writes of `gpuq.store.api.StoreTx`, within its transaction."""

    conn: Connection

    def set_drain(self, drain: Drain) -> None:
        """Drain a node (unit "") or a unit; a repeat replaces the reason, who and when."""
        values = {"reason": drain.reason, "by": drain.by, "at": drain.at}
        where = and_(drains.c.node == drain.node, drains.c.unit == drain.unit)
        if self.conn.execute(update(drains).where(where).values(values)).rowcount == 0:
            self.conn.execute(insert(drains).values(node=drain.node, unit=drain.unit, **values))

    def clear_drain(self, node: str, unit: str) -> bool:
        """Resume: False if there was no such drain."""
        where = and_(drains.c.node == node, drains.c.unit == unit)
        return bool(self.conn.execute(delete(drains).where(where)).rowcount)

    def save_given_up(self, items: Sequence[GivenUp], now: float) -> None:
        """Record given-up starts, or what is left of one once a node reported (one with no
        node left is forgotten); those older than GIVEN_UP_KEEP go too."""
        if not items:
            return
        latest = {(item.job_id, item.attempt): item for item in items}
        table = given_up_starts.c
        for job_id, attempt in latest:
            where = and_(table.job_id == job_id, table.attempt == attempt)
            self.conn.execute(delete(given_up_starts).where(where))
        self.conn.execute(delete(given_up_starts).where(table.at < now - GIVEN_UP_KEEP))
        rows = [
            {"job_id": i.job_id, "attempt": i.attempt, "nodes": ",".join(i.nodes), "first": i.first}
            | {"at": i.at}
            for i in latest.values()
            if i.nodes
        ]
        if rows:
            self.conn.execute(insert(given_up_starts), rows)

    def save_node(self, node: Node) -> None:
        """Insert or replace a node's description and state."""
        values = node_row(node)
        result = self.conn.execute(update(nodes).where(nodes.c.name == node.name).values(values))
        if result.rowcount == 0:
            self.conn.execute(insert(nodes).values(name=node.name, **values))

    def set_node_state(
        self, name: str, state: NodeState, reason: str, last_seen: float | None = None
    ) -> None:
        values: dict[str, Any] = {"state": state.value, "reason": reason}
        if last_seen is not None:
            values["last_seen"] = last_seen
        result = self.conn.execute(update(nodes).where(nodes.c.name == name).values(values))
        if result.rowcount != 1:
            raise NotFound(f"no node {name}")


def check_units_free(conn: Connection, units: list[str], shared: Sequence[str] = ()) -> None:
    """`units` go to one job each and must be free; `shared` go to MPS shares, which
    may share a unit with other shares but never with a job that holds it whole."""
    if len(set(units)) != len(units):
        twice = sorted({u for u in units if units.count(u) > 1})
        raise DoubleBooking(f"one plan gives {', '.join(twice)} to two jobs")
    both = sorted(set(units) & set(shared))
    if both:
        raise DoubleBooking(f"one plan gives {', '.join(both)} whole and as a share")
    if units:
        taken = conn.execute(_LIVE_UNITS, {"units": units}).first()
        if taken is not None:
            raise DoubleBooking(f"GPU {taken.unit} is already allocated to job {taken.job_id}")
    if shared:
        for taken in conn.execute(_LIVE_UNITS, {"units": sorted(set(shared))}):
            if not taken.shared:
                raise DoubleBooking(
                    f"GPU {taken.unit} is held whole by job {taken.job_id}, not shared"
                )


def allocate_units(conn: Connection, starts: Sequence[JobStart], now: float) -> None:
    """Live allocations of the starting jobs' units (a unit live twice raises DoubleBooking)."""
    units = [
        {
            "job_id": s.job_id,
            "node": node,
            "unit": u,
            "live": True,
            "started_at": now,
            "shared": s.shared,
        }
        for s in starts
        for node, node_units in s.node_parts
        for u in node_units
    ]
    if units:
        try:
            conn.execute(_INSERT_ALLOCATION, units)
        except IntegrityError as exc:
            raise DoubleBooking(f"a GPU unit was already allocated: {exc.orig}") from exc


def release_units(conn: Connection, job_ids: list[int], now: float) -> None:
    """The jobs' live allocations end (they left running)."""
    conn.execute(_RELEASE, {"ids": job_ids, "now": now})


# statements built once: building them per call costs more than running them
_RELEASE = (
    update(allocations)
    .where(and_(allocations.c.live, allocations.c.job_id.in_(bindparam("ids", expanding=True))))
    .values(live=False, released_at=bindparam("now"))
)
_INSERT_ALLOCATION = insert(allocations)
_LIVE_UNITS = select(allocations.c.unit, allocations.c.job_id, allocations.c.shared).where(
    and_(allocations.c.live, allocations.c.unit.in_(bindparam("units", expanding=True)))
)
