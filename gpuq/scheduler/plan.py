"""One scheduling pass: a pure function of (nodes, running jobs, the queue, policy, now) that
returns what to start, whom to preempt, what to cancel, and why every other job waits.

Jobs are taken in queue order (priority, then submit order). A job starts on its best-fit
node (the fewest free GPUs that still fits: small jobs fill partly used nodes, whole nodes stay
whole) unless it would delay a reservation. The first job that cannot start gets a
reservation: the earliest time and the exact units it will start on (EASY backfill); a job of a
preemptible, lower tier is preempted instead when that lets it start sooner than waiting would.

A job's placement (--nodelist, --exclude, --constraint) limits every step to the nodes it
allows: placing, reserving, preempting and estimating; its GPU type limits the units (see
gpuq.scheduler.fitting). Jobs of several nodes, and whole-node (--exclusive, --mem=0) jobs,
are placed, reserved and preempt the gang way (gpuq.scheduler.gang): all nodes or none.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from gpuq.domain.model import Resources
from gpuq.domain.node_constraints import Placement
from gpuq.scheduler import gang
from gpuq.scheduler.eligibility import Usage, blockers, never_met
from gpuq.scheduler.fitting import (
    ANYWHERE,
    NodeView,
    ShareUse,
    allowed,
    choose_units,
    in_partition,
    misfit,
    never_fits,
    never_fits_reason,
    placement_reason,
    shortage,
)
from gpuq.scheduler.preempt import victims_on
from gpuq.scheduler.reserve import FreeNode, Release, Reservation, earliest, estimate_starts
from gpuq.scheduler.snapshot import (
    Cancellation,
    Decisions,
    PendingJob,
    Policy,
    Preemption,
    RunningJob,
    Start,
    Waiting,
)

NEVER_ON_UP = "no node that is up can ever run it"
FitKey = tuple[
    int,
    int | None,
    int,
    int | None,
    float | None,
    str,
    str | None,
    int | None,
    str,
    str | None,
    Placement,
    int,
    bool,
    bool,
]


def fit_key(
    need: Resources,
    time_limit: float | None,
    qos: str,
    user: str = "",
    placement: Placement = ANYWHERE,
) -> FitKey:
    """Jobs with the same key fit, or preempt, the same way during a pass (a share's fit
    depends on its user too: one user's shares at a time on a unit; a GPU type and a
    placement narrow where a job fits; so do the number of nodes and whole-node requests)."""
    return (
        need.gpus,
        need.gpu_mem,
        need.cpus,
        need.mem,
        time_limit,
        qos,
        need.mig,
        need.gpu_share,
        user if need.gpu_share is not None else "",
        need.gpu_type,
        placement,
        need.nodes,
        need.exclusive,
        need.mem_all,
    )


def plan(
    nodes: Iterable[NodeView],
    running: Iterable[RunningJob],
    queue: Iterable[PendingJob],
    policy: Policy,
    now: float,
    *,
    shapes: Mapping[FitKey, int] | None = None,
    explain: bool = False,
) -> Decisions:
    """Decide one pass. With `shapes` (how many queued jobs have each fit key) and no
    `explain`, the pass stops once nothing more can happen: a full cluster and a long queue
    cost a few steps. `explain` walks the whole queue and gives every job its reasons and,
    for the first `explain_limit` blocked ones, an estimated start."""
    return _Pass(list(nodes), list(running), policy, now, explain, shapes).run(queue)


@dataclass(slots=True)
class _Pass:
    views: list[NodeView]
    running: list[RunningJob]
    policy: Policy
    now: float
    explain: bool
    shapes: Mapping[FitKey, int] | None
    nodes: dict[str, FreeNode] = field(init=False)
    usage: Usage = field(init=False)
    running_on: dict[str, list[RunningJob]] = field(init=False)
    parts_of: dict[int, list[RunningJob]] = field(init=False)  # a running job's nodes, first first
    reservations: list[Reservation] = field(default_factory=list)
    top: Reservation | None = None
    starts: list[Start] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    cancellations: list[Cancellation] = field(default_factory=list)
    waiting: dict[int, Waiting] = field(default_factory=dict)
    unfit: dict[FitKey, str] = field(default_factory=dict)  # cannot start now: why
    settled: set[FitKey] = field(default_factory=set)  # cannot start nor preempt this pass
    remaining: dict[FitKey, int] = field(default_factory=dict)  # queued, not yet seen
    reserved_units: set[str] = field(default_factory=set)  # of every reservation
    changed: bool = True  # resources or victims changed since _settle_hopeless last ran
    preemptible: dict[tuple[str, str], list[RunningJob]] = field(default_factory=dict)
    unsettled: set[FitKey] = field(default_factory=set)  # in `remaining`, not in `settled`
    looked_ahead: bool = False  # the first blocked job has had its reservation decided
    victims: set[int] = field(default_factory=set)
    blocked_order: list[tuple[int, Resources, float | None, frozenset[str] | None]] = field(
        default_factory=list
    )
    # the nodes each placement allows (None: every node), for this pass
    allowed_nodes: dict[Placement, frozenset[str] | None] = field(default_factory=dict)
    # for the estimated starts (explain only): each node's releases at the jobs' expected
    # ends (measured run times where known), the jobs' expected run times, the reservations
    # that wait on a preemption, and whether any run time was measured at all
    expected_releases: dict[str, list[Release]] = field(default_factory=dict)
    expected_runs: dict[int, float | None] = field(default_factory=dict)
    claimed: set[int] = field(default_factory=set)
    measured: bool = False

    def __post_init__(self) -> None:
        # a unit that is not ok (unhealthy, dirty, drained) is not free for this pass
        self.nodes = {
            v.name: FreeNode(
                v,
                set(v.free_units - v.unhealthy.keys()),
                v.cpus_free,
                v.mem_free,
                shares={unit: list(uses) for unit, uses in v.shares.items()},
            )
            for v in self.views
        }
        for job in self.running:
            node = self.nodes.get(job.node)
            if node is not None:
                node.releases.append((job.end_estimate, job.gpus, job.cpus, job.mem))
                if self.explain:
                    end = job.end_estimate if job.expected_end is None else job.expected_end
                    self.measured = self.measured or job.expected_end is not None
                    self._expect(job.node, (end, job.gpus, job.cpus, job.mem))
            if job.stopping:
                self.victims.add(job.job_id)
        self.usage = Usage.of(self.running)
        self.running_on = {}
        self.parts_of = {}
        for job in self.running:
            self.running_on.setdefault(job.node, []).append(job)
            self.parts_of.setdefault(job.job_id, []).append(job)

    def run(self, queue: Iterable[PendingJob]) -> Decisions:
        early = self.shapes is not None and not self.explain
        self.remaining = {k: n for k, n in (self.shapes or {}).items() if n > 0} if early else {}
        self.unsettled = set(self.remaining)
        ahead = 0  # jobs of higher priority that wait for resources
        for job in queue:
            key = fit_key(job.need, job.time_limit, job.qos, job.user, job.placement)
            if self._consider(job, key, ahead):
                ahead += 1
            if early:
                left = self.remaining.get(key, 0) - 1
                if left > 0:
                    self.remaining[key] = left
                else:
                    self.remaining.pop(key, None)
                    self.unsettled.discard(key)
                if self.looked_ahead and self.unsettled and self.changed:
                    self._settle_hopeless()
                if self.looked_ahead and not self.unsettled:
                    break  # every job left can neither start nor preempt: nothing more to do
        if self.explain:
            self._estimate()
        return Decisions(
            tuple(self.starts), tuple(self.preemptions), tuple(self.cancellations), self.waiting
        )

    # ---- one job -------------------------------------------------------------------------

    def _allowed(self, placement: Placement) -> frozenset[str] | None:
        """The names of the nodes `placement` allows (None: all of them)."""
        if not placement:
            return None
        if placement not in self.allowed_nodes:
            self.allowed_nodes[placement] = frozenset(
                v.name for v in self.views if allowed(v, placement) is None
            )
        return self.allowed_nodes[placement]

    def _consider(self, job: PendingJob, key: FitKey, ahead: int) -> bool:
        """Start the job if it may; otherwise record why not. True when it is left waiting for
        resources (so it holds the jobs behind it back)."""
        impossible = never_met(job)
        if impossible is not None:
            if self.policy.settings.cancel_unsatisfiable:
                self.cancellations.append(Cancellation(job.job_id, impossible))
            else:
                self._wait(job, [impossible])
            return False
        eligibility = blockers(job, self.usage, self.policy.tiers.get(job.qos), self.now)
        if eligibility and not self.explain:
            self._wait(job, eligibility)
            return False
        placed = None if key in self.unfit else self._place(job)
        if placed is not None and not eligibility:
            self._start(job, placed)
            return False
        reasons = list(eligibility)
        if placed is None:
            reasons.append(self._why_not(job, key))
        if ahead:
            jobs = (
                "1 job of higher priority is"
                if ahead == 1
                else f"{ahead} jobs of higher priority are"
            )
            reasons.append(f"priority: {jobs} waiting")
        if not eligibility and placed is None and not (self.looked_ahead and key in self.settled):
            self._look_ahead(job, key)
        self._wait(job, reasons)
        return not eligibility

    def _place(self, job: PendingJob) -> list[gang.Part] | None:
        """Best fit among the nodes where the job fits now without delaying a reservation."""
        need = job.need
        end = self.now + job.time_limit if job.time_limit else math.inf
        only = self._allowed(job.placement)
        if gang.is_gang(need):
            return gang.place(self.nodes, self.reservations, only, need, end, job.user)
        best: tuple[tuple[int, int, int, str], str, list[str]] | None = None
        for name, node in self.nodes.items():
            if only is not None and name not in only:
                continue
            if (
                (len(node.units) < need.gpus and need.gpu_share is None)
                or node.cpus < need.cpus
                or node.mem < (need.mem or 0)
                or not node.view.up
            ):
                continue
            overlapping = [r for r in self.reservations if r.node == name and end > r.start]
            if any(not r.leaves_room(need) for r in overlapping):
                continue
            blocked = {u for r in overlapping for u in r.units}
            usable = node.usable(need, blocked, job.user)
            if len(usable) < need.gpus:
                continue
            rank = (len(usable), node.cpus, node.mem, name)
            if best is None or rank < best[0]:
                best = (rank, name, usable)
        if best is None:
            return None
        _, name, usable = best
        if need.gpu_share is not None:
            return [(name, (usable[0],), need)]  # usable puts units with the user's shares first
        return [(name, choose_units(_restricted(self.nodes[name], usable), need), need)]

    def _start(self, job: PendingJob, parts: list[gang.Part]) -> None:
        end = self.now + job.time_limit if job.time_limit else math.inf
        share = job.need.gpu_share
        for name, units, need in parts:
            node = self.nodes[name]
            node.units.difference_update(units)
            node.cpus -= need.cpus
            node.mem -= need.mem or 0
            node.releases.append((end, units, need.cpus, need.mem or 0))
            if self.explain:
                self._expect(
                    name, (self.now + self._run_time(job), units, need.cpus, need.mem or 0)
                )
            if share is not None:
                use = ShareUse(job.job_id, job.user, share, need.gpu_mem or 0)
                for unit in units:
                    node.shares.setdefault(unit, []).append(use)
            for reservation in self.reservations:
                reservation.take(name, end, need)
        gpus = sum(len(units) for _, units, _ in parts)
        self.usage.add(job.job_id, job.user, job.qos, gpus, job.name, job.array_job_id)
        (first, units, _), more = parts[0], tuple((n, u) for n, u, _ in parts[1:])
        self.starts.append(Start(job.job_id, first, units, shared=share is not None, more=more))
        self.changed = True

    def _why_not(self, job: PendingJob, key: FitKey) -> str:
        if key not in self.unfit and gang.is_gang(job.need):
            self.unfit[key] = in_partition(job.placement, self._why_not_gang(job))
        if key not in self.unfit:
            only = self._allowed(job.placement)
            ruled_out = placement_reason(self.views, job.placement) if self.views else None
            views = [v for v in self.views if only is None or v.name in only]
            free_now = [
                _free_view(n) for n in self.nodes.values() if only is None or n.view.name in only
            ]
            if ruled_out is not None:
                reason = ruled_out
            elif not any(n.up and not never_fits(n, job.need) for n in views):
                # name the nodes that could run it but take no work now (down, drained)
                down = [
                    f"node {n.name} {n.down_reason}"
                    for n in views
                    if not n.up and not never_fits(n, job.need)
                ]
                up = [n for n in views if n.up]
                reason = (
                    "; ".join(down[:3])
                    if down
                    else f"{NEVER_ON_UP} ({never_fits_reason(up, job.need, job.placement)})"
                    if up
                    else "no node is up"
                )
            elif self.top is not None and any(
                misfit(v, job.need, job.user) is None for v in free_now
            ):
                when = _clock(self.top.start)
                reason = f"resources reserved for job {self.top.job_id} (it starts by {when})"
            else:
                reason = shortage(free_now, job.need, job.user)
            self.unfit[key] = in_partition(job.placement, reason)
        return self.unfit[key]

    def _why_not_gang(self, job: PendingJob) -> str:
        ruled_out = placement_reason(self.views, job.placement) if self.views else None
        if ruled_out is not None:
            return ruled_out
        found = gang.capable(self.views, job.need, job.placement)
        never = gang.never_reason(job.need, job.placement, found)
        if never is not None:
            return never
        if self.top is not None:
            only = self._allowed(job.placement)
            ignoring = gang.place(self.nodes, [], only, job.need, 0, job.user)
            if ignoring is not None:
                when = _clock(self.top.start)
                return f"resources reserved for job {self.top.job_id} (it starts by {when})"
        return gang.waiting_reason(self.nodes, job.need, job.user, self.running_on, found)

    def _settle_hopeless(self) -> None:
        """Settle, without waiting to meet one, every kind of queued job that no node has room
        for now and that has nobody to preempt (free resources and victims only shrink)."""
        self.changed = False
        up = [n for n in self.nodes.values() if n.view.up]
        block = max((len(n.units) for n in up), default=0)
        cpus = max((n.cpus for n in up), default=0)
        targets = {r.qos for r in self.running if r.job_id not in self.victims}
        for key in list(self.unsettled):
            gpus, _, need_cpus, _, _, qos, _, share, *_ = key
            # a share may join a unit that is not free: only its CPUs can rule it out here
            no_room = (gpus > block and share is None) or need_cpus > cpus
            if no_room and not any(self.policy.can_preempt(qos, t) for t in targets):
                self.unsettled.discard(key)
                self.settled.add(key)

    # ---- looking ahead: reservations and preemption ------------------------------------------

    def _look_ahead(self, job: PendingJob, key: FitKey) -> None:
        """The first blocked job gets a reservation, or preempts when that is sooner than
        waiting; later blocked jobs may still preempt (never into a reservation)."""
        reserved = frozenset(self.reserved_units)
        soonest = None if self.looked_ahead else self._soonest(job, reserved)
        waiting_is_long = soonest is None or soonest[0] > self.now + self.policy.kill_grace
        preempted = key not in self.settled and waiting_is_long
        preempted = preempted and self._preempt_for(job, reserved)
        if not preempted:
            self.settled.add(key)
            self.unsettled.discard(key)
        if not self.looked_ahead:
            self.looked_ahead = True
            if not preempted and soonest is not None:
                start, held = soonest
                for name, units, spare_cpus, spare_mem in held:
                    part = Reservation(
                        job.job_id, name, start, frozenset(units), spare_cpus, spare_mem
                    )
                    self.top = self.top or part
                    self._reserve(part)

    def _preemptible(self, node: str, qos: str) -> list[RunningJob]:
        """Running jobs on `node` that a job of `qos` may preempt (victims included)."""
        key = (node, qos)
        if key not in self.preemptible:
            self.preemptible[key] = [
                r for r in self.running_on.get(node, ()) if self.policy.can_preempt(qos, r.qos)
            ]
        return self.preemptible[key]

    def _reserve(self, reservation: Reservation) -> None:
        self.reservations.append(reservation)
        self.reserved_units.update(reservation.units)

    def _soonest(
        self, job: PendingJob, reserved: frozenset[str]
    ) -> tuple[float, list[gang.Held]] | None:
        """When the job can start at the earliest, and what to reserve on each node."""
        only = self._allowed(job.placement)
        if gang.is_gang(job.need):
            return gang.soonest(self.nodes, only, job.need, self.now, reserved, job.user)
        best = None
        for name, node in self.nodes.items():
            if only is not None and name not in only:
                continue
            found = earliest(node, job.need, self.now, reserved, job.user)
            if found is not None and (best is None or (found[0], name) < (best[0], best[1])):
                best = (found[0], name, found[1], found[2], found[3])
        if best is None:
            return None
        return best[0], [(best[1], best[2], best[3], best[4])]

    def _preempt_gang(self, job: PendingJob, reserved: frozenset[str]) -> bool:
        """Preempt across nodes: each of the job's nodes freed by victims on it."""

        def candidates(name: str) -> list[RunningJob]:
            return [
                r
                for r in self._preemptible(name, job.qos)
                if r.job_id not in self.victims and not reserved.intersection(r.gpus)
            ]

        only = self._allowed(job.placement)
        found = gang.victims_across(
            self.nodes, only, job.need, self.now, reserved, job.user, candidates
        )
        if found is None:
            return False
        for name, need, chosen in found:
            self._claim(job, name, need, chosen, reserved)
        return True

    def _claim(
        self,
        job: PendingJob,
        name: str,
        need: Resources,
        chosen: list[RunningJob],
        reserved: frozenset[str],
    ) -> None:
        """Hold the units `chosen` free on `name` for `job` from the end of their kill grace,
        and stop each victim (every node of it) once."""
        node = self.nodes[name]
        eligible = {u.uuid for u in node.view.eligible(need)}
        freed = {u for v in chosen for u in v.gpus if u in eligible}
        units = tuple(u for u in node.usable(need, user=job.user) if u not in reserved)
        units = (units + tuple(u for u in _ordered(node, freed) if u not in units))[: need.gpus]
        grace = self.now + self.policy.kill_grace
        self._reserve(Reservation(job.job_id, name, grace, frozenset(units), 0, 0))
        self.claimed.add(job.job_id)
        self.changed = True
        for victim in chosen:
            if victim.job_id in self.victims:
                continue
            self.victims.add(victim.job_id)
            parts = self.parts_of.get(victim.job_id, [victim])
            self.preemptions.append(Preemption(victim.job_id, job.job_id, parts[0].node))
            if len(parts) > 1:  # its other nodes free up when it stops, too
                for part in parts:
                    self._releasing(part, grace)

    def _releasing(self, part: RunningJob, moment: float) -> None:
        node = self.nodes.get(part.node)
        if node is None:
            return
        for i, (end, units, cpus, mem) in enumerate(node.releases):
            if units == part.gpus and end == part.end_estimate:
                node.releases[i] = (min(end, moment), units, cpus, mem)
                return

    def _preempt_for(self, job: PendingJob, reserved: frozenset[str]) -> bool:
        if gang.is_gang(job.need):
            return self._preempt_gang(job, reserved)
        options = []
        only = self._allowed(job.placement)
        for name, node in self.nodes.items():
            if not node.view.up or (only is not None and name not in only):
                continue
            candidates = [
                r
                for r in self._preemptible(name, job.qos)
                if r.job_id not in self.victims and not reserved.intersection(r.gpus)
            ]
            if candidates and len(node.units) + sum(len(r.gpus) for r in candidates) >= (
                job.need.gpus
            ):
                youngest = min(self.now - r.start_time for r in candidates)
                options.append((youngest, name, candidates))
        best: tuple[float, int, str, list[RunningJob]] | None = None
        # nodes by the least work a victim there could lose: stop once no node can beat the best
        for youngest, name, candidates in sorted(options, key=lambda o: (o[0], o[1])):
            if best is not None and youngest > best[0]:
                break
            found = victims_on(self.nodes[name], job.need, candidates, self.now, reserved, job.user)
            if found is not None and (best is None or (found[0], len(found[1])) < best[:2]):
                best = (found[0], len(found[1]), name, found[1])
        if best is None:
            return False
        _, _, name, chosen = best
        self._claim(job, name, job.need, chosen, reserved)
        return True

    # ---- explaining ----------------------------------------------------------------------------

    def _wait(self, job: PendingJob, reasons: list[str]) -> None:
        self.waiting[job.job_id] = Waiting(tuple(reasons))
        self.blocked_order.append(
            (job.job_id, job.need, job.time_limit, self._allowed(job.placement))
        )
        if self.explain and job.expected_run is not None:
            self.expected_runs[job.job_id] = job.expected_run
            self.measured = True

    def _expect(self, node: str, release: Release) -> None:
        self.expected_releases.setdefault(node, []).append(release)

    def _run_time(self, job: PendingJob) -> float:
        """How long a job is expected to run: measured, else its limit (none: for good)."""
        if job.expected_run is not None:
            return job.expected_run
        return job.time_limit if job.time_limit else math.inf

    def _estimate(self) -> None:
        if self.measured:
            self._estimate_measured()
            return
        for reservation in self.reservations:
            found = self.waiting.get(reservation.job_id)
            if found is not None:
                self.waiting[reservation.job_id] = Waiting(found.reasons, reservation.start)
        limit = self.policy.settings.explain_limit
        todo = [b for b in self.blocked_order if b[0] not in {r.job_id for r in self.reservations}]
        held = {b[0]: b[2] for b in self.blocked_order}  # a reserved job's time limit
        estimates = estimate_starts(
            list(self.nodes.values()), todo[:limit], self.reservations, self.now, held
        )
        for job_id, moment in estimates.items():
            self.waiting[job_id] = Waiting(self.waiting[job_id].reasons, moment)

    def _estimate_measured(self) -> None:
        """The estimated starts where some jobs' run times were measured (jobs without
        --time whose user ran jobs of that name before): the blocked jobs in queue order over
        the units' expected free times, each expected to run its measured time (else its
        limit). A job waiting on a preemption starts when its victims' grace ends; a reserved
        job no later than its reservation (which keeps to the limits)."""
        claims = [r for r in self.reservations if r.job_id in self.claimed]
        by_limits: dict[int, float] = {}
        for reservation in self.reservations:
            if reservation.job_id not in self.claimed:
                known = by_limits.get(reservation.job_id, -math.inf)
                by_limits[reservation.job_id] = max(known, reservation.start)
        blocked = [b for b in self.blocked_order if b[0] not in self.claimed]
        runs = {b[0]: self.expected_runs.get(b[0], b[2]) for b in blocked}
        todo = [(job_id, need, runs[job_id], only) for job_id, need, _, only in blocked]
        nodes = [
            FreeNode(n.view, n.units, n.cpus, n.mem, self.expected_releases.get(name, []))
            for name, n in self.nodes.items()
        ]
        limit = self.policy.settings.explain_limit
        estimates = estimate_starts(nodes, todo[:limit], claims, self.now, runs)
        for reservation in claims:
            estimates[reservation.job_id] = reservation.start
        for job_id, start in by_limits.items():
            estimates[job_id] = min(estimates.get(job_id, start), start)
        for job_id, moment in estimates.items():
            self.waiting[job_id] = Waiting(self.waiting[job_id].reasons, moment)


def _free_view(node: FreeNode) -> NodeView:
    return replace(
        node.view,
        free_units=frozenset(node.units),
        cpus_free=node.cpus,
        mem_free=node.mem,
        shares={unit: tuple(uses) for unit, uses in node.shares.items()},
    )


def _restricted(node: FreeNode, usable: list[str]) -> NodeView:
    return replace(_free_view(node), free_units=frozenset(usable))


def _ordered(node: FreeNode, units: set[str]) -> list[str]:
    return [u.uuid for u in node.view.units if u.uuid in units]


def _clock(moment: float) -> str:
    if math.isinf(moment):
        return "an unknown time"
    return dt.datetime.fromtimestamp(moment).isoformat(sep=" ", timespec="seconds")
