"""May a pending job start at all right now, apart from resources? Each rule returns a named
reason; a dependency that can never be met is told apart, so the job can be cancelled.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, field

from gpuq.domain.dependencies import DependencyKind
from gpuq.domain.limits import name_in_text
from gpuq.domain.policy import QosTier
from gpuq.domain.states import JobState
from gpuq.scheduler.snapshot import Dependency, PendingJob, RunningJob


@dataclass(slots=True)
class Usage:
    """What is running, counted the ways the rules need; grows as a pass starts jobs."""

    gpus: Counter[tuple[str, str]] = field(default_factory=Counter)  # (user, qos)
    jobs: Counter[tuple[str, str]] = field(default_factory=Counter)
    array_tasks: Counter[int] = field(default_factory=Counter)
    singletons: dict[tuple[str, str], int] = field(default_factory=dict)  # (user, name) -> job

    def add(
        self, job_id: int, user: str, qos: str, gpus: int, name: str, array_job_id: int | None
    ) -> None:
        self.gpus[(user, qos)] += gpus
        self.jobs[(user, qos)] += 1
        if array_job_id is not None:
            self.array_tasks[array_job_id] += 1
        self.singletons.setdefault((user, name), job_id)

    @classmethod
    def of(cls, running: list[RunningJob]) -> Usage:
        """A job on several nodes (one RunningJob per node) counts once, with the GPUs of
        all its nodes."""
        usage = cls()
        seen: set[int] = set()
        for job in running:
            if job.job_id in seen:
                usage.gpus[(job.user, job.qos)] += len(job.gpus)
                continue
            seen.add(job.job_id)
            usage.add(job.job_id, job.user, job.qos, len(job.gpus), job.name, job.array_job_id)
        return usage


def dependency_status(dep: Dependency) -> bool | None:
    """True: met; False: can never be met; None: not yet."""
    state = dep.state
    if state is None:
        return False
    if state.is_live:
        return None
    completed = state is JobState.COMPLETED
    if dep.kind is DependencyKind.OK:
        return completed
    if dep.kind is DependencyKind.NOTOK:
        return not completed
    return True


_KIND_WORD = {
    DependencyKind.OK: "afterok",
    DependencyKind.ANY: "afterany",
    DependencyKind.NOTOK: "afternotok",
}


def never_met(job: PendingJob) -> str | None:
    """Why one of the job's dependencies can never be met (None: all still can)."""
    for dep in job.dependencies:
        if dependency_status(dep) is False:
            what = f"job {dep.display} " + (dep.state.value if dep.state else "does not exist")
            return f"dependency can never be met: {what} ({_KIND_WORD[dep.kind]})"
    return None


def unrestricted(job: PendingJob, tier: QosTier | None) -> bool:
    """True when neither `never_met` nor `blockers` can find anything against the job,
    whatever runs: no begin time, dependency, limit of its tier, array limit or singleton (a
    quick test: a long queue is mostly such jobs)."""
    return (
        job.begin_time is None
        and not job.dependencies
        and job.array_max_running is None
        and not job.singleton
        and (tier is None or (tier.max_running_jobs is None and tier.max_running_gpus is None))
    )


def blockers(job: PendingJob, usage: Usage, tier: QosTier | None, now: float) -> list[str]:
    """Every reason, other than resources, that keeps the job from starting now."""
    reasons: list[str] = []
    if job.begin_time is not None and job.begin_time > now:
        when = dt.datetime.fromtimestamp(job.begin_time).isoformat(sep=" ", timespec="seconds")
        reasons.append(f"begin time {when} not reached")
    waiting = [d for d in job.dependencies if dependency_status(d) is None]
    if waiting:
        listed = ", ".join(f"{d.display} ({_KIND_WORD[d.kind]})" for d in waiting)
        reasons.append(f"dependency: waiting for job {listed}")
    if tier is not None:
        reasons += _limit_reasons(job, usage, tier)
    limit, array = job.array_max_running, job.array_job_id
    if limit is not None and array is not None and usage.array_tasks[array] >= limit:
        reasons.append(f"array limit: at most {limit} tasks of array {array} run at once")
    if job.singleton and (job.user, job.name) in usage.singletons:
        other = usage.singletons[(job.user, job.name)]
        reasons.append(f"singleton: job {other} named {name_in_text(job.name)} is running")
    return reasons


def _limit_reasons(job: PendingJob, usage: Usage, tier: QosTier) -> list[str]:
    key = (job.user, job.qos)
    reasons = []
    if tier.max_running_jobs is not None and usage.jobs[key] >= tier.max_running_jobs:
        reasons.append(
            f"qos {tier.name} limit: at most {tier.max_running_jobs} running jobs per user "
            f"({job.user} runs {usage.jobs[key]})"
        )
    if (
        tier.max_running_gpus is not None
        and usage.gpus[key] + job.need.total_gpus > tier.max_running_gpus
    ):
        reasons.append(
            f"qos {tier.name} limit: at most {tier.max_running_gpus} running GPUs per user "
            f"({job.user} runs {usage.gpus[key]})"
        )
    return reasons
