"""Why a kind of job cannot start now, during one pass (gpuq.scheduler.plan asks once per fit
key; an explanation of a long queue has dozens of kinds).

The text depends on the job's need, placement and (for an MPS share) user, the nodes' free
resources and the top reservation: not on its time limit or tier, which split fit keys. So
kinds that differ only there share one answer while nothing changed (`epoch`: the pass counts
every start, reservation and preemption), and each node's free view is kept until that node
changes (its count in `touched`): building 128 of them per kind was most of the cost.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import replace

from gpuq.domain.model import Resources
from gpuq.domain.node_constraints import Placement
from gpuq.scheduler import gang
from gpuq.scheduler.fitting import (
    NodeView,
    misfit,
    never_fits,
    never_fits_reason,
    placement_reason,
    shortage,
)
from gpuq.scheduler.reserve import FreeNode, Reservation
from gpuq.scheduler.snapshot import PendingJob, RunningJob

NEVER_ON_UP = "no node that is up can ever run it"


class KindReasons:
    """Why jobs cannot start now, kept while nothing they depend on changed."""

    __slots__ = ("_capable", "_free", "_known", "nodes", "running_on", "touched", "views")

    def __init__(
        self,
        views: list[NodeView],
        nodes: Mapping[str, FreeNode],
        running_on: Mapping[str, list[RunningJob]],
        touched: Mapping[str, int],
    ) -> None:
        self.views = views
        self.nodes = nodes
        self.running_on = running_on
        self.touched = touched  # the pass's count of changes per node (it only grows)
        self._known: dict[tuple[object, ...], str] = {}
        self._free: dict[str, tuple[int, NodeView]] = {}
        self._capable: dict[tuple[Resources, Placement], tuple[str, list[NodeView]]] = {}

    def why(
        self,
        job: PendingJob,
        only: frozenset[str] | None,
        top: Reservation | None,
        epoch: int,
    ) -> str:
        """Why `job` cannot start now, on the nodes `only` (None: all) allows; `epoch`
        changes whenever the nodes' free resources or the reservations do."""
        need = job.need
        user = job.user if need.gpu_share is not None else ""
        key = (need, user, job.placement, epoch)
        known = self._known.get(key)
        if known is None:
            known = self._known[key] = self.fresh(job, only, top)
        return known

    def fresh(self, job: PendingJob, only: frozenset[str] | None, top: Reservation | None) -> str:
        """`why`, found anew."""
        if gang.is_gang(job.need):
            return self._gang(job, only, top)
        return self._one_node(job, only, top)

    def free_view(self, node: FreeNode) -> NodeView:
        """The node's view with what is free now, kept until the node changes."""
        name = node.view.name
        version = self.touched.get(name, 0)
        known = self._free.get(name)
        if known is None or known[0] != version:
            known = self._free[name] = (version, free_view(node))
        return known[1]

    def _one_node(
        self, job: PendingJob, only: frozenset[str] | None, top: Reservation | None
    ) -> str:
        """Why a one-node job cannot start now."""
        views = self.views
        ruled_out = placement_reason(views, job.placement) if views else None
        if ruled_out is not None:
            return ruled_out
        allowed = [v for v in views if only is None or v.name in only]
        if not any(n.up and not never_fits(n, job.need) for n in allowed):
            # name the nodes that could run it but take no work now (down, drained)
            down = [
                f"node {n.name} {n.down_reason}"
                for n in allowed
                if not n.up and not never_fits(n, job.need)
            ]
            up = [n for n in allowed if n.up]
            if down:
                return "; ".join(down[:3])
            if up:
                return f"{NEVER_ON_UP} ({never_fits_reason(up, job.need, job.placement)})"
            return "no node is up"
        free_now = [
            self.free_view(n) for n in self.nodes.values() if only is None or n.view.name in only
        ]
        if top is not None and any(misfit(v, job.need, job.user) is None for v in free_now):
            return reserved_for(top)
        return shortage(free_now, job.need, job.user)

    def _gang(self, job: PendingJob, only: frozenset[str] | None, top: Reservation | None) -> str:
        """Why a job of several nodes, or of whole nodes, cannot start now."""
        ruled_out = placement_reason(self.views, job.placement) if self.views else None
        if ruled_out is not None:
            return ruled_out
        found = self._capable.get((job.need, job.placement))
        if found is None:
            found = gang.capable(self.views, job.need, job.placement)
            self._capable[(job.need, job.placement)] = found
        never = gang.never_reason(job.need, job.placement, found)
        if never is not None:
            return never
        if top is not None and gang.place(self.nodes, {}, only, job.need, 0, job.user) is not None:
            return reserved_for(top)
        return gang.waiting_reason(self.nodes, job.need, job.user, self.running_on, found)


def reserved_for(top: Reservation) -> str:
    return f"resources reserved for job {top.job_id} (it starts by {_clock(top.start)})"


def free_view(node: FreeNode) -> NodeView:
    """The node's view with its free units, CPUs, memory and shares as they are now."""
    return replace(
        node.view,
        free_units=frozenset(node.units),
        cpus_free=node.cpus,
        mem_free=node.mem,
        shares={unit: tuple(uses) for unit, uses in node.shares.items()},
    )


def _clock(moment: float) -> str:
    if math.isinf(moment):
        return "an unknown time"
    return dt.datetime.fromtimestamp(moment).isoformat(sep=" ", timespec="seconds")
