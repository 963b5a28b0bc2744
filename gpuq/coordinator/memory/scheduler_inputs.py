"""What the pure scheduler needs beyond live jobs, kept by the coordinator: turns live jobs
into the scheduler's snapshot, and keeps what priorities need beyond live jobs (fair-share
usage, finished jobs' states for dependencies, the fair-share factors of the last recalculation)
and what estimated starts need (how long each user's jobs of a name ran: `run_times`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.domain.dependencies import Dependency as DomainDependency
from gpuq.domain.model import Job
from gpuq.domain.right_sizing import measured_run
from gpuq.domain.states import JobState
from gpuq.scheduler.fit_keys import FitKey, fit_key
from gpuq.scheduler.priority import Factors, decayed, factors, fairshare_factors
from gpuq.scheduler.snapshot import Dependency, PendingJob, Policy, RunningJob

DepKey = tuple[int, int | None]
RunKey = tuple[str, str]  # (user, job name)
RUN_TIMES_EVERY = 300.0  # seconds: the measured run times are read again at most this often...
RUN_TIMES_NEW = 2.0  # ...or this soon after a job of a (user, name) not read yet is seen


class SchedulerInputs:
    def __init__(self, settings: CoordinatorSettings) -> None:
        self.policy = Policy(settings.qos, settings.scheduler, settings.kill_grace)
        self.half_life = settings.scheduler.fairshare_half_life
        self.usage: dict[str, tuple[float, float]] = {}  # user -> (GPU-seconds, as of)
        # ended jobs that live jobs may depend on, by (job id, None), (array id, None) for a
        # whole array (its worst ending) or (array id, task) for one task
        self.finished: dict[DepKey, JobState] = {}
        # arrays with live tasks: the first ending of one of their tasks other than completed
        # (an array ended "ok" only when every task completed, as SLURM's afterok reads it)
        self.array_worst: dict[int, JobState] = {}
        self.shares: dict[str, float] = {}  # fair-share factors as of the last recalculation
        self.ranked_at = 0.0  # the moment every queued job's priority is computed for
        # the estimated start of a job without --time: (user, name) -> the p90 of their last
        # completed runs (gpuq.domain.right_sizing), read from the store by MemoryLoader for the
        # live jobs' (user, name)s; `run_times_read`: those read (with or without runs)
        self.run_times: dict[RunKey, float] = {}
        self.run_times_read: set[RunKey] = set()
        self.run_times_at = -math.inf
        self.run_times_missing = False  # a live job's (user, name) has not been read

    # ---- per job -------------------------------------------------------------------------

    def time_limit(self, job: Job) -> float | None:
        return self.policy.time_limit(job.qos, job.spec.resources.time_limit)

    def time_limit_seconds(self, job: Job) -> int | None:
        """The job's effective time limit in whole seconds (its QOS's may be lower); None:
        none."""
        limit = self.time_limit(job)
        return int(limit) if limit else None

    def expected_run(self, job: Job) -> float | None:
        """How long a job without --time is expected to run: its user's jobs of its name ran
        this long (p90, never over its limit); None: it has a --time, or no runs measured.
        The estimated starts use it; the limit enforced stays the limit."""
        if job.spec.resources.time_limit is not None:
            return None
        key = (job.user, job.spec.name)
        if key not in self.run_times_read:
            self.run_times_missing = True
        seconds = self.run_times.get(key)
        return None if seconds is None else measured_run([seconds], self.time_limit(job))

    def run_times_due(self, now: float) -> bool:
        return now - self.run_times_at >= (
            RUN_TIMES_NEW if self.run_times_missing else RUN_TIMES_EVERY
        )

    def key(self, job: Job) -> FitKey:
        spec = job.spec
        return fit_key(spec.resources, self.time_limit(job), job.qos, job.user, spec.placement)

    def factors(self, job: Job, now: float) -> Factors:
        tier = self.policy.tiers.get(job.qos)
        share = self.shares.get(job.user, 1.0)
        weight = tier.priority if tier else 0
        return factors(weight, job.submit_time, share, job.spec.nice, now, self.policy.settings)

    def priority(self, job: Job, now: float) -> float:
        return self.factors(job, now).total

    def pending(self, job: Job, jobs: LiveJobs) -> PendingJob:
        """The job as a pass sees it, with the fit key it was queued with: none for an
        array's record (never queued) or a version of the job memory no longer holds (a
        snapshot taken in slices); a pass makes those."""
        spec = job.spec
        queued = jobs.jobs.get(job.id) is job
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
                Dependency(d.job_id, d.kind, self.state_of(d, jobs), d.task)
                for d in spec.dependencies
            ),
            array_job_id=job.array_job_id,
            array_max_running=spec.array.max_running if spec.array else None,
            singleton=spec.singleton,
            placement=spec.placement,
            expected_run=self.expected_run(job),
            fit=jobs.keys.get(job.id) if queued else None,
        )

    def running(
        self, job: Job, now: float, unit_nodes: Mapping[str, str] | None = None
    ) -> list[RunningJob]:
        """The job as the scheduler sees it: one RunningJob per node it runs on, each with
        that node's units (`unit_nodes`: each unit's node, needed for a multi-node job)."""
        assert job.node is not None and job.start_time is not None
        limit = self.time_limit(job)
        end = job.start_time + limit if limit else math.inf
        if job.stop is not None:
            end = min(end, now + self.policy.kill_grace)
        usual = self.expected_run(job)
        expected = job.start_time + usual if usual is not None else None
        if expected is not None and (expected <= now or expected >= end):
            expected = None  # past its usual run time: only its limit bounds it
        res = job.spec.resources
        nodes = job.node_names
        return [
            RunningJob(
                job_id=job.id,
                user=job.user,
                qos=job.qos,
                node=node,
                gpus=job.gpus
                if len(nodes) == 1
                else tuple(u for u in job.gpus if (unit_nodes or {}).get(u) == node),
                cpus=res.cpus,
                mem=res.mem or 0,
                start_time=job.start_time,
                end_estimate=end,
                name=job.name,
                array_job_id=job.array_job_id,
                stopping=job.stop is not None,
                expected_end=expected,
            )
            for node in nodes
        ]

    def state_of(self, dep: DomainDependency, jobs: LiveJobs) -> JobState | None:
        """What a dependency waits on is in: a live state (not yet), an ending, or None (no
        such job). A whole array is live while any task is, then its worst ending."""
        if dep.task is None:
            if jobs.array_live.get(dep.job_id):
                return JobState.PENDING
            job = jobs.jobs.get(dep.job_id)
            if job is not None:
                return job.state
            return self.finished.get((dep.job_id, None))
        task_job = jobs.task_jobs.get((dep.job_id, dep.task))
        if task_job is not None:
            return jobs.jobs[task_job].state
        record = jobs.records.get(dep.job_id)
        if record is not None and dep.task in record.tasks:
            return record.state
        return self.finished.get((dep.job_id, dep.task))

    def job_ended(self, job: Job, state: JobState, jobs: LiveJobs) -> None:
        """Remember how a job ended, for jobs that depend on it (call after `LiveJobs.put`);
        a completed run makes its (user, name)'s run times due to be read again."""
        if state is JobState.COMPLETED:
            self.run_times_read.discard((job.user, job.spec.name))
        array = job.array_job_id
        if array is None:
            self.finished[(job.id, None)] = state
            return
        if state is not JobState.COMPLETED:
            self.array_worst.setdefault(array, state)
        for task in job.tasks or (job.array_task_id,):
            if task is not None:
                self.finished[(array, task)] = state
        if job.id != array:  # a task split off: `--after ID` names it alone too
            self.finished[(job.id, None)] = state
        if not jobs.array_live.get(array):
            self.finished[(array, None)] = self.array_worst.pop(array, JobState.COMPLETED)

    # ---- fair share ------------------------------------------------------------------------

    def current_usage(self, now: float) -> dict[str, float]:
        return {u: decayed(v, at, now, self.half_life) for u, (v, at) in self.usage.items()}

    def charge(self, user: str, gpu_seconds: float, now: float) -> float:
        """The user's usage with `gpu_seconds` more, decayed to now (not yet recorded)."""
        value, at = self.usage.get(user, (0.0, now))
        return decayed(value, at, now, self.half_life) + gpu_seconds

    def refresh_shares(self, users: Iterable[str], now: float) -> None:
        """New fair-share factors, and the moment priorities are computed for until the next
        refresh (one moment for every queued job, so equal jobs rank in submission order)."""
        self.shares = fairshare_factors(self.current_usage(now), users)
        self.ranked_at = now
