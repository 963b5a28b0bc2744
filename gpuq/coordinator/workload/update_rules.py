"""Changing jobs after submission: the rules of `gpuq update` and `gpuq requeue`.

The rules are pure functions of (job, request, who asks, policy) so they are tested without a
server; gpuq.coordinator.workload.job_actions resolves the jobs, calls them, and writes what
they decide in one store transaction per request.

Who may change what (SLURM's `scontrol update`): owners may only lower what admins limit. An
owner may shorten a time limit but not lengthen it, raise nice but not lower it (negative nice
is for admins), and move to a QOS they could submit to; the QOS maximum time binds admins too.
A change is validated as a whole: the new spec is built with dataclasses.replace, so the
domain's own checks (Resources, Placement, JobSpec) apply exactly as at submit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gpuq.coordinator.access.permissions import check_lowers_nice, check_raises_time_limit
from gpuq.domain.dependencies import Dependency
from gpuq.domain.limits import check_qos, name_in_text
from gpuq.domain.model import Job, JobSpec, Resources
from gpuq.domain.node_constraints import Placement
from gpuq.domain.policy import QosTier
from gpuq.domain.states import JobState
from gpuq.domain.units import format_duration, format_size
from gpuq.errors import InvalidInput, Unsatisfiable

WAITING = frozenset({JobState.PENDING, JobState.HELD})


@dataclass(frozen=True, slots=True)
class Update:
    """What `gpuq update` changes; None (or a False `set_*`): unchanged."""

    time_limit: int | None = None
    qos: str | None = None
    nice: int | None = None
    set_dependencies: bool = False
    dependencies: tuple[Dependency, ...] = ()
    hold: bool | None = None
    name: str | None = None
    set_begin_time: bool = False
    begin_time: float | None = None
    gpus: int | None = None
    gpu_type: str | None = None  # "": clear
    cpus: int | None = None
    mem: int | None = None
    gpu_mem: int | None = None
    set_nodelist: bool = False
    nodelist: tuple[str, ...] = ()
    set_exclude: bool = False
    exclude: tuple[str, ...] = ()
    constraint: str | None = None  # "": clear

    def __bool__(self) -> bool:
        return any(
            (
                self.time_limit is not None,
                self.qos is not None,
                self.nice is not None,
                self.set_dependencies,
                self.hold is not None,
                self.name is not None,
                self.set_begin_time,
                self.gpus is not None,
                self.gpu_type is not None,
                self.cpus is not None,
                self.mem is not None,
                self.gpu_mem is not None,
                self.set_nodelist,
                self.set_exclude,
                self.constraint is not None,
            )
        )


@dataclass(frozen=True, slots=True)
class Edit:
    """What an update decided for one job: its new spec, qos and stored priority, the new
    state when --hold/--release moves it, and the changes in words (its event's reason)."""

    job: Job
    spec: JobSpec
    qos: str
    priority: int
    to_state: JobState | None
    changes: tuple[str, ...]


def _time(seconds: float | None) -> str:
    return format_duration(seconds) if seconds else "none"


def plan_update(
    job: Job,
    update: Update,
    by: str,
    admin: bool,
    tiers: Mapping[str, QosTier],
) -> Edit:
    """The job as `update` leaves it, or InvalidInput / PermissionDenied (nothing changes).

    Only pending or held jobs change; the whole new spec is validated by constructing it."""
    if job.state not in WAITING:
        raise Unsatisfiable(
            f"job {job.display_id} is {job.state.value}: only pending or held jobs can be updated"
        )
    old = job.spec
    res = old.resources
    changes: list[str] = []
    qos = job.qos
    if update.qos is not None and update.qos != job.qos:
        check_qos(update.qos)
        if update.qos not in tiers:
            known = ", ".join(sorted(tiers))
            raise InvalidInput("--qos", update.qos, f"no such qos; known: {known}")
        changes.append(f"qos {job.qos} -> {update.qos}")
        qos = update.qos
    tier = tiers.get(qos)
    default = tier.default_time if tier is not None else None
    resources = res
    if update.time_limit is not None and update.time_limit != res.time_limit:
        current = res.time_limit or (tiers[job.qos].default_time if job.qos in tiers else None)
        if current is not None and update.time_limit > current:
            check_raises_time_limit(admin, job.display_id, _time(current), _time(update.time_limit))
        changes.append(f"time {_time(current)} -> {_time(update.time_limit)}")
        resources = replace(resources, time_limit=update.time_limit)
    limit = resources.time_limit or default
    if (
        tier is not None
        and tier.max_time is not None
        and limit is not None
        and limit > tier.max_time
    ):
        raise InvalidInput(
            "--time",
            format_duration(limit),
            f"qos {qos} allows at most {format_duration(tier.max_time)}",
        )
    sized: dict[str, int | None] = {
        "gpus": update.gpus,
        "cpus": update.cpus,
        "mem": update.mem,
        "gpu_mem": update.gpu_mem,
    }
    for field_name, value in sized.items():
        if value is not None and value != getattr(res, field_name):
            resources = replace(resources, **{field_name: value})  # type: ignore[arg-type]
            shown = format_size if field_name in ("mem", "gpu_mem") else str
            before = getattr(res, field_name)
            was = "none" if before is None else shown(before)
            changes.append(f"{field_name.replace('_', '-')} {was} -> {shown(value)}")
    if update.gpu_type is not None and (update.gpu_type or None) != res.gpu_type:
        resources = replace(resources, gpu_type=update.gpu_type or None)
        changes.append(f"gpu type {res.gpu_type or 'any'} -> {update.gpu_type or 'any'}")
    if resources is not res:
        resources = Resources(  # validated as a whole, as at submit
            gpus=resources.gpus,
            gpu_mem=resources.gpu_mem,
            cpus=resources.cpus,
            mem=resources.mem,
            time_limit=resources.time_limit,
            mig=resources.mig,
            gpu_share=resources.gpu_share,
            gpu_type=resources.gpu_type,
        )
    nice = old.nice
    if update.nice is not None and update.nice != old.nice:
        if update.nice < old.nice:
            check_lowers_nice(admin, job.display_id, old.nice, update.nice)
        changes.append(f"nice {old.nice} -> {update.nice}")
        nice = update.nice
    placement = old.placement
    if update.set_nodelist and update.nodelist != placement.nodelist:
        placement = replace(placement, nodelist=update.nodelist)
        changes.append(f"nodelist {_list(old.placement.nodelist)} -> {_list(update.nodelist)}")
    if update.set_exclude and update.exclude != placement.exclude:
        placement = replace(placement, exclude=update.exclude)
        changes.append(f"exclude {_list(old.placement.exclude)} -> {_list(update.exclude)}")
    if update.constraint is not None and (update.constraint or None) != placement.constraint:
        placement = replace(placement, constraint=update.constraint or None)
        was, now = old.placement.constraint or "none", update.constraint or "none"
        changes.append(f"constraint {was} -> {now}")
    if placement is not old.placement:
        placement = Placement(
            placement.nodelist, placement.exclude, placement.constraint, placement.partitions
        )
    name = old.name
    if update.name is not None and update.name != old.name:
        changes.append(f"name {name_in_text(old.name)} -> {name_in_text(update.name)}")
        name = update.name
    dependencies = old.dependencies
    if update.set_dependencies and update.dependencies != old.dependencies:
        for dep in update.dependencies:
            if dep.job_id in (job.id, job.array_job_id):
                raise InvalidInput("--after", dep.display, "a job cannot wait for itself")
        changes.append(f"after {_deps(old.dependencies)} -> {_deps(update.dependencies)}")
        dependencies = update.dependencies
    begin = old.begin_time
    if update.set_begin_time and update.begin_time != old.begin_time:
        changes.append("begin " + ("cleared" if update.begin_time is None else "changed"))
        begin = update.begin_time
    spec = JobSpec(  # validated as a whole, as at submit
        **{
            **{f: getattr(old, f) for f in JobSpec.__dataclass_fields__},
            "name": name,
            "resources": resources,
            "qos": qos if (update.qos is not None or old.qos is not None) else None,
            "nice": nice,
            "placement": placement,
            "dependencies": dependencies,
            "begin_time": begin,
        }
    )
    to_state: JobState | None = None
    if update.hold is True and job.state is JobState.PENDING:
        to_state = JobState.HELD
    elif update.hold is False and job.state is JobState.HELD:
        to_state = JobState.PENDING
    priority = (tier.priority if tier is not None else 0) - spec.nice
    return Edit(job, spec, qos, priority, to_state, tuple(changes))


def dependency_cycle(
    job_id: int, deps: Iterable[Dependency], waits_on: Mapping[int, Iterable[int]]
) -> int | None:
    """A job among `deps` (or what they wait for, transitively) that waits for `job_id`:
    depending on it would never start either. `waits_on`: live jobs' dependencies (ids)."""
    seen: set[int] = set()
    stack = [d.job_id for d in deps]
    while stack:
        current = stack.pop()
        if current == job_id:
            return current
        if current in seen:
            continue
        seen.add(current)
        stack.extend(waits_on.get(current, ()))
    return None


def check_requeue(job: Job) -> None:
    """SLURM's `scontrol requeue`: running or ended jobs go back to the queue, except those
    submitted with --no-requeue (SLURM refuses them too). Waiting jobs are already queued."""
    if not job.spec.requeue:
        raise Unsatisfiable(
            f"job {job.display_id} was submitted with --no-requeue: it is never requeued"
        )
    if job.tasks:
        raise Unsatisfiable(f"job {job.display_id}: unstarted array tasks are queued already")
    if job.state in WAITING:
        raise Unsatisfiable(f"job {job.display_id} is {job.state.value}: it is queued already")


def _list(items: tuple[str, ...]) -> str:
    return ",".join(items) or "none"


def _deps(deps: tuple[Dependency, ...]) -> str:
    return ",".join(f"{d.kind.value}:{d.display}" for d in deps) or "none"
