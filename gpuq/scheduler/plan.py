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

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from gpuq.domain.model import Resources
from gpuq.domain.node_constraints import Placement
from gpuq.scheduler import fit_keys, gang
from gpuq.scheduler.eligibility import Usage, blockers, never_met, unrestricted
from gpuq.scheduler.fit_keys import FitKey, fit_key
from gpuq.scheduler.fitting import (
    NodeView,
    ShareUse,
    allowed,
    choose_units,
    in_partition,
)
from gpuq.scheduler.preempt import VictimSearch
from gpuq.scheduler.reserve import (
    Blocked,
    FreeNode,
    Release,
    Reservation,
    explained_starts,
)
from gpuq.scheduler.snapshot import (
    Cancellation,
    Decisions,
    PendingJob,
    Policy,
    Preemption,
    RunningJob,
    Start,
    WaitingJobs,
)
from gpuq.scheduler.waiting_reasons import KindReasons, free_view

QUIET_JOBS = 64  # jobs in a row that changed nothing: then look closer at what is left


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
    `explain`, the pass stops once nothing more can happen (a full cluster and a long queue
    cost a few steps) and only decides: its `waiting` is empty (the coordinator's pass; the
    explaining one says why). `explain` walks the whole queue and gives every job its reasons
    and, for the first `explain_limit` blocked ones, an estimated start. Without either,
    every job is looked at in full (what the shortcuts are tested against)."""
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
    targets: Counter[str] = field(init=False)  # running jobs (parts) by tier, victims aside
    # each node's count of changes this pass (`_touch`): what is kept of a node (its free
    # view, its candidates and victims) is good while the count stays
    touched: Counter[str] = field(default_factory=Counter)
    touch_log: list[str] = field(default_factory=list)  # each change's node, in order
    search: VictimSearch = field(init=False)  # what preempting may take, kept per node
    reservations: list[Reservation] = field(default_factory=list)
    reserved_on: dict[str, list[Reservation]] = field(default_factory=dict)  # by node
    top: Reservation | None = None
    starts: list[Start] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    cancellations: list[Cancellation] = field(default_factory=list)
    waiting: WaitingJobs = field(default_factory=WaitingJobs)
    unfit: dict[FitKey, str] = field(default_factory=dict)  # cannot start now: why
    # (unfit[key],) of the kinds settled and unfit once the first blocked job looked ahead
    whys: dict[FitKey, tuple[str]] = field(default_factory=dict)
    settled: set[FitKey] = field(default_factory=set)  # cannot start nor preempt this pass
    remaining: dict[FitKey, int] = field(default_factory=dict)  # queued, not yet seen
    reserved_units: set[str] = field(default_factory=set)  # of every reservation
    changed: bool = True  # resources or victims changed since _settle last ran
    room: tuple[int, int] | None = None  # fit_keys.most_room now (None: a start since)
    hopeless_at: tuple[object, ...] | None = None  # (room, tiers with targets) _settle last saw
    unsettled: set[FitKey] = field(default_factory=set)  # in `remaining`, not in `settled`
    looked_ahead: bool = False  # the first blocked job has had its reservation decided
    victims: set[int] = field(default_factory=set)
    blocked_order: list[Blocked] = field(default_factory=list)
    # the nodes each placement allows (None: every node), for this pass
    allowed_nodes: dict[Placement, frozenset[str] | None] = field(default_factory=dict)
    # for the estimated starts (explain only): each node's releases at the jobs' expected
    # ends (measured run times where known), the jobs' expected run times, the reservations
    # that wait on a preemption, and whether any run time was measured at all
    expected_releases: dict[str, list[Release]] = field(default_factory=dict)
    expected_runs: dict[int, float | None] = field(default_factory=dict)
    claimed: set[int] = field(default_factory=set)
    measured: bool = False
    reasons: bool = True  # say why each job waits (not in an early-stopping pass)
    reserved_jobs: set[int] = field(default_factory=set)  # jobs that hold a reservation
    open_blocked: int = 0  # jobs in blocked_order that hold none
    # starts, reservations and preemptions so far: what a kind's reason depends on changes
    # only with them
    epoch: int = 0
    kind_reasons: KindReasons = field(init=False)

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
        self.targets = Counter(r.qos for r in self.running if r.job_id not in self.victims)
        self.touched.update(dict.fromkeys(self.nodes, 0))  # every node: no __missing__ calls
        self.kind_reasons = KindReasons(self.views, self.nodes, self.running_on, self.touched)
        self.search = VictimSearch(
            self.nodes,
            self.running_on,
            self.victims,
            self.policy.can_preempt,
            self.now,
            self.touched,
            self.touch_log,
        )

    def run(self, queue: Iterable[PendingJob]) -> Decisions:
        early = self.shapes is not None and not self.explain
        self.reasons = not early
        self.remaining = {k: n for k, n in (self.shapes or {}).items() if n > 0} if early else {}
        self.unsettled = set(self.remaining)
        settled, unfit = self.settled, self.unfit
        remaining, unsettled = self.remaining, self.unsettled
        cancel = self.policy.settings.cancel_unsatisfiable
        tiers = self.policy.tiers
        limit = self.policy.settings.explain_limit
        whys, explain, wait = self.whys, self.explain, self.waiting.wait
        ahead = 0  # jobs of higher priority that wait for resources
        quiet = 0  # jobs looked at since resources last changed
        for job in queue:
            key = job.fit or fit_key(job.need, job.time_limit, job.qos, job.user, job.placement)
            # (the reasons of a kind that can neither start nor preempt any more)
            why = whys.get(key)
            if why is not None and early:
                # only a dependency never met matters
                if job.dependencies and cancel and (impossible := never_met(job)) is not None:
                    self.cancellations.append(Cancellation(job.job_id, impossible))
            elif why is not None and explain and unrestricted(job, tiers.get(job.qos)):
                # as _consider would find: it waits for what its kind waits for, and its turn
                if self.open_blocked < limit:
                    self._wait(job, why, ahead)
                else:  # as _wait, of a job the estimates do not reach
                    wait(job.job_id, why, ahead)
                    if job.expected_run is not None:
                        self.measured = True
                ahead += 1
            else:
                if self._consider(job, key, ahead):
                    ahead += 1
                if why is None and self.looked_ahead and key in settled and key in unfit:
                    whys[key] = (unfit[key],)
            if early:
                left = remaining.get(key, 0) - 1
                if left > 0:
                    remaining[key] = left
                else:
                    remaining.pop(key, None)
                    unsettled.discard(key)
                if self.looked_ahead and unsettled:
                    if self.changed:
                        self._settle()
                        quiet = 0
                    else:
                        quiet += 1
                        if quiet == QUIET_JOBS:
                            self._settle(closer=True)
                if self.looked_ahead and not unsettled:
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
            elif self.reasons:
                self._wait(job, (impossible,))
            return False
        eligibility = blockers(job, self.usage, self.policy.tiers.get(job.qos), self.now)
        if eligibility and not self.explain:
            if self.reasons:
                self._wait(job, tuple(eligibility))
            return False
        placed = None if key in self.unfit else self._place(job)
        if placed is not None and not eligibility:
            self._start(job, placed)
            return False
        if not self.reasons:  # an early-stopping pass decides; the explaining one says why
            if placed is None:
                self.unfit.setdefault(key, "")
            if (
                not eligibility
                and placed is None
                and not (self.looked_ahead and key in self.settled)
            ):
                self._look_ahead(job, key)
            return not eligibility
        reasons = list(eligibility)
        if placed is None:
            reasons.append(self._why_not(job, key))
        if not eligibility and placed is None and not (self.looked_ahead and key in self.settled):
            self._look_ahead(job, key)
        self._wait(job, tuple(reasons), ahead)
        return not eligibility

    def _place(self, job: PendingJob) -> list[gang.Part] | None:
        """Best fit among the nodes where the job fits now without delaying a reservation."""
        need = job.need
        end = self.now + job.time_limit if job.time_limit else math.inf
        only = self._allowed(job.placement)
        if gang.is_gang(need):
            return gang.place(self.nodes, self.reserved_on, only, need, end, job.user)
        best: tuple[tuple[int, int, int, str], str, list[str]] | None = None
        for name, node in self.nodes.items():
            if only is not None and name not in only:
                continue
            if (
                not node.may_hold(need)
                or node.cpus < need.cpus
                or node.mem < (need.mem or 0)
                or not node.view.up
            ):
                continue
            # a node ranks no better than if every unit it needs were usable: skip the units'
            # look when even that would not beat the best so far
            if best is not None and (need.gpus, node.cpus, node.mem, name) >= best[0]:
                continue
            overlapping = [r for r in self.reserved_on.get(name, ()) if end > r.start]
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
            self._touch(name)
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
            for reservation in self.reserved_on.get(name, ()):
                reservation.take(name, end, need)
        gpus = sum(len(units) for _, units, _ in parts)
        self.usage.add(job.job_id, job.user, job.qos, gpus, job.name, job.array_job_id)
        (first, units, _), more = parts[0], tuple((n, u) for n, u, _ in parts[1:])
        self.starts.append(Start(job.job_id, first, units, shared=share is not None, more=more))
        self.changed = True
        self.room = None
        self.epoch += 1

    def _why_not(self, job: PendingJob, key: FitKey) -> str:
        """Why a job of kind `key` cannot start now: found once per kind and pass."""
        known = self.unfit.get(key)
        if known is None:
            why = self.kind_reasons.why(job, self._allowed(job.placement), self.top, self.epoch)
            known = self.unfit[key] = in_partition(job.placement, why)
        return known

    def _settle(self, closer: bool = False) -> None:
        """Settle the kinds of queued jobs that can neither start nor preempt any more: those
        `fit_keys.hopeless` finds after every change, and with a `closer` look those
        `fit_keys.blocked` finds (taken once the queue has gone quiet for a while)."""
        targets = [qos for qos, count in self.targets.items() if count > 0]
        answers: dict[str, bool] = {}  # by tier: asked for every kind left

        def may_preempt(qos: str) -> bool:
            known = answers.get(qos)
            if known is None:
                known = answers[qos] = any(self.policy.can_preempt(qos, t) for t in targets)
            return known

        if closer:
            found = fit_keys.blocked(
                self.unsettled,
                self.nodes,
                self.reservations,
                self.now,
                self._allowed,
                may_preempt,
            )
        else:
            self.changed = False
            if self.room is None:
                self.room = fit_keys.most_room(self.nodes.values())
            # what hopeless answers depends on these only: the same, it finds nothing new
            # (what it found before is settled already, and unsettled kinds only go)
            looked_at = (self.room, tuple(targets))
            if looked_at == self.hopeless_at:
                return
            self.hopeless_at = looked_at
            found = fit_keys.hopeless(self.unsettled, self.room, may_preempt)
        self.unsettled.difference_update(found)
        self.settled.update(found)

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

    def _reserve(self, reservation: Reservation) -> None:
        self._touch(reservation.node)
        self.epoch += 1
        self.reservations.append(reservation)
        self.reserved_on.setdefault(reservation.node, []).append(reservation)
        self.reserved_jobs.add(reservation.job_id)
        self.reserved_units.update(reservation.units)

    def _soonest(
        self, job: PendingJob, reserved: frozenset[str]
    ) -> tuple[float, list[gang.Held]] | None:
        """When the job can start at the earliest, and what to reserve on each node (one node
        is the gang way's case of N = 1: the earliest node, then the first by name)."""
        only = self._allowed(job.placement)
        return gang.soonest(self.nodes, only, job.need, self.now, reserved, job.user)

    def _preempt_gang(self, job: PendingJob, reserved: frozenset[str]) -> bool:
        """Preempt across nodes: each of the job's nodes freed by victims on it."""
        only = self._allowed(job.placement)
        found = gang.victims_across(
            self.nodes,
            only,
            job.need,
            self.now,
            reserved,
            job.user,
            lambda name, need: self.search.on(name, job.qos, need, reserved, job.user),
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
        self.epoch += 1
        for victim in chosen:
            if victim.job_id in self.victims:
                continue
            self.victims.add(victim.job_id)
            parts = self.parts_of.get(victim.job_id, [victim])
            self.targets.subtract(part.qos for part in parts)
            for part in parts:
                self._touch(part.node)
            self.preemptions.append(Preemption(victim.job_id, job.job_id, parts[0].node))
            if len(parts) > 1:  # its other nodes free up when it stops, too
                for part in parts:
                    if (holder := self.nodes.get(part.node)) is not None:
                        holder.release_early(part.gpus, part.end_estimate, grace)

    def _preempt_for(self, job: PendingJob, reserved: frozenset[str]) -> bool:
        if gang.is_gang(job.need):
            return self._preempt_gang(job, reserved)
        only = self._allowed(job.placement)
        gpus, nodes = job.need.gpus, self.nodes
        best: tuple[float, int, str, list[RunningJob]] | None = None
        # nodes by the least work a victim there could lose: stop once no node can beat the best
        for youngest, name, units in self.search.by_loss(job.qos, reserved):
            if best is not None and youngest > best[0]:
                break
            node = nodes[name]
            if (
                not node.view.up
                or (only is not None and name not in only)
                or len(node.units) + units < gpus
            ):
                continue
            found = self.search.on(name, job.qos, job.need, reserved, job.user)
            if found is not None and (best is None or (found[0], len(found[1])) < best[:2]):
                best = (found[0], len(found[1]), name, found[1])
        if best is None:
            return False
        _, _, name, chosen = best
        self._claim(job, name, job.need, chosen, reserved)
        return True

    def _touch(self, name: str) -> None:
        """Node `name` changed: what was kept of it is stale."""
        self.touched[name] += 1
        self.touch_log.append(name)

    # ---- explaining ----------------------------------------------------------------------------

    def _wait(self, job: PendingJob, reasons: tuple[str, ...], ahead: int = 0) -> None:
        """The job waits for `reasons`, behind `ahead` jobs of higher priority that wait
        for resources."""
        self.waiting.wait(job.job_id, reasons, ahead)
        if not self.explain:
            return
        # the estimated starts take the first explain_limit blocked jobs that hold no
        # reservation, and the reserved ones' time limits: only those are kept
        if job.job_id in self.reserved_jobs:
            self.blocked_order.append(
                (job.job_id, job.need, job.time_limit, self._allowed(job.placement))
            )
        elif self.open_blocked < self.policy.settings.explain_limit:
            self.open_blocked += 1
            self.blocked_order.append(
                (job.job_id, job.need, job.time_limit, self._allowed(job.placement))
            )
        if job.expected_run is not None:
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
        """Each blocked job's estimated start (of the first explain_limit of them)."""
        found = explained_starts(
            self.nodes,
            self.reservations,
            self.claimed,
            self.blocked_order,
            self.policy.settings.explain_limit,
            self.now,
            self.expected_runs if self.measured else None,
            self.expected_releases,
        )
        for job_id, moment in found.items():
            if job_id in self.waiting:
                self.waiting.estimate(job_id, moment)


def _restricted(node: FreeNode, usable: list[str]) -> NodeView:
    return replace(free_view(node), free_units=frozenset(usable))


def _ordered(node: FreeNode, units: set[str]) -> list[str]:
    return [u.uuid for u in node.view.units if u.uuid in units]
