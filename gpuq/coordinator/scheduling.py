"""The coordinator's side of scheduling: turns live jobs into the pure scheduler's snapshot,
and keeps what priorities need beyond live jobs (fair-share usage, finished jobs' states for
dependencies, the fair-share factors of the last recalculation).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from gpuq.config import CoordinatorSettings
from gpuq.domain.model import Job
from gpuq.domain.states import JobState
from gpuq.scheduler.plan import FitKey, fit_key
from gpuq.scheduler.priority import Factors, decayed, factors, fairshare_factors
from gpuq.scheduler.snapshot import Dependency, PendingJob, Policy, RunningJob


class SchedulingState:
    def __init__(self, settings: CoordinatorSettings) -> None:
        self.policy = Policy(settings.qos, settings.scheduler, settings.kill_grace)
        self.half_life = settings.scheduler.fairshare_half_life
        self.usage: dict[str, tuple[float, float]] = {}  # user -> (GPU-seconds, as of)
        self.finished: dict[int, JobState] = {}  # ended jobs that live jobs may depend on
        self.shares: dict[str, float] = {}  # fair-share factors as of the last recalculation

    # ---- per job -------------------------------------------------------------------------

    def time_limit(self, job: Job) -> float | None:
        return self.policy.time_limit(job.qos, job.spec.resources.time_limit)

    def key(self, job: Job) -> FitKey:
        return fit_key(job.spec.resources, self.time_limit(job), job.qos)

    def factors(self, job: Job, now: float) -> Factors:
        tier = self.policy.tiers.get(job.qos)
        share = self.shares.get(job.user, 1.0)
        weight = tier.priority if tier else 0
        return factors(weight, job.submit_time, share, job.spec.nice, now, self.policy.settings)

    def priority(self, job: Job, now: float) -> float:
        return self.factors(job, now).total

    def pending(self, job: Job, live: Mapping[int, Job]) -> PendingJob:
        spec = job.spec
        return PendingJob(
            job_id=job.id,
            user=job.user,
            qos=job.qos,
            need=spec.resources,
            submit_time=job.submit_time,
            time_limit=self.time_limit(job),
            nice=spec.nice,
            name=spec.name,
            begin_time=spec.begin_time,
            dependencies=tuple(
                Dependency(d.job_id, d.kind, self._state_of(d.job_id, live))
                for d in spec.dependencies
            ),
            array_job_id=job.array_job_id,
            array_max_running=spec.array.max_running if spec.array else None,
            singleton=spec.singleton,
        )

    def running(self, job: Job, now: float) -> RunningJob:
        assert job.node is not None and job.start_time is not None
        limit = self.time_limit(job)
        end = job.start_time + limit if limit else math.inf
        if job.stop is not None:
            end = min(end, now + self.policy.kill_grace)
        res = job.spec.resources
        return RunningJob(
            job_id=job.id,
            user=job.user,
            qos=job.qos,
            node=job.node,
            gpus=job.gpus,
            cpus=res.cpus,
            mem=res.mem or 0,
            start_time=job.start_time,
            end_estimate=end,
            name=job.name,
            array_job_id=job.array_job_id,
            stopping=job.stop is not None,
        )

    def _state_of(self, job_id: int, live: Mapping[int, Job]) -> JobState | None:
        job = live.get(job_id)
        return job.state if job is not None else self.finished.get(job_id)

    # ---- fair share ------------------------------------------------------------------------

    def current_usage(self, now: float) -> dict[str, float]:
        return {u: decayed(v, at, now, self.half_life) for u, (v, at) in self.usage.items()}

    def charge(self, user: str, gpu_seconds: float, now: float) -> float:
        """The user's usage with `gpu_seconds` more, decayed to now (not yet recorded)."""
        value, at = self.usage.get(user, (0.0, now))
        return decayed(value, at, now, self.half_life) + gpu_seconds

    def refresh_shares(self, users: Iterable[str], now: float) -> None:
        self.shares = fairshare_factors(self.current_usage(now), users)
