"""Right-sizing answers (issue 26), in the Report call: one job's efficiency (`gpuq eff`, as
SLURM's seff) and a user's advice per job name with the users whose GPUs sat idle
(`gpuq report --advice`). The coordinator gathers the rows (the store's past runs, bounded;
its node inventory: cards' memory, the MIG profiles and shared GPUs the cluster offers) and
the pure rules of gpuq.domain.right_sizing decide.

Privacy: the one rule (permissions.sees). Usage figures are everyone's to see, as `gpuq
report` and `gpuq show` show them, unless `[coordinator] private_data` holds "usage": then
another user's only for admins; a hidden job name stays hidden in advice too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.access.permissions import hides_name, sees
from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.front.job_messages import HIDDEN, JobMessages
from gpuq.coordinator.memory.node_table import NodeTable
from gpuq.coordinator.memory.scheduler_inputs import SchedulerInputs
from gpuq.domain.model import Job
from gpuq.domain.right_sizing import (
    ADVICE_DAYS,
    ADVICE_JOBS_PER_USER,
    Offer,
    PastRun,
    SizingAdvice,
    advise,
    idle_holders,
    verdicts,
)
from gpuq.domain.states import JobState
from gpuq.errors import PermissionDenied
from gpuq.identity import Caller
from gpuq.store.records import JobQuery
from gpuq.v1 import queue_pb2

ENDED = frozenset(s for s in JobState if not s.is_live)


class SizingQueries:
    def __init__(
        self,
        settings: CoordinatorSettings,
        writer: StoreWriter,
        nodes: NodeTable,
        inputs: SchedulerInputs,
        messages: JobMessages,
        job_detail: Callable[[int], Awaitable[tuple[Job, object, object]]],
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.writer = writer
        self.nodes = nodes
        self.inputs = inputs
        self.messages = messages
        self.job_detail = job_detail  # a job with its running figures so far
        self.clock = clock

    async def efficiency(self, caller: Caller, job_id: int) -> queue_pb2.JobEfficiency:
        """What job `job_id` asked for against what it used (NotFound: no such job)."""
        job, _, _ = await self.job_detail(job_id)
        self._check_sees(caller, job.user, f"job {job.display_id}")
        ends = await self.writer.read(lambda s: s.end_evidence(job.id))
        peaks = [e.peak_mem for e in ends if e.peak_mem > 0 and e.attempt in (0, job.start_count)]
        run = self.past_run(job, self.card_memory())
        if run is not None and peaks:
            run = replace(run, mem_peak=max(peaks))
        return queue_pb2.JobEfficiency(
            job=self.messages.full(job, caller),
            time_limit=int(self.inputs.time_limit(job) or 0),
            card_mem=(run.card_mem or 0) if run is not None else 0,
            verdicts=verdicts(run, self.offer()) if run is not None else [],
            mem_peak=max(peaks) if peaks else None,
        )

    async def advice(
        self, caller: Caller, user: str, since: float | None
    ) -> tuple[list[queue_pb2.SizingAdvice], list[queue_pb2.IdleHolder]]:
        """`user`'s advice per job name over their latest ended jobs (at most
        ADVICE_JOBS_PER_USER, since `since` or the last ADVICE_DAYS), and the users whose GPUs
        sat idle over the same time (those whose usage the caller may see)."""
        self._check_sees(caller, user, f"{user}'s jobs")
        since = since if since is not None else self.clock() - ADVICE_DAYS * 86400
        query = JobQuery(
            states=ENDED,
            user=user,
            since=since,
            by_end=True,
            newest_first=True,
            limit=ADVICE_JOBS_PER_USER,
        )
        jobs, usage = await self.writer.read(
            lambda s: (s.list_jobs(query), s.usage_report(None, since))
        )
        memory = self.card_memory()
        runs = [run for job in jobs if (run := self.past_run(job, memory)) is not None]
        hidden = hides_name(caller, user, self.settings.private_data)
        advice = [_advice_message(a, hidden) for a in advise(runs, self.offer())]
        idle = [
            queue_pb2.IdleHolder(user=h.user, gpu_seconds=h.gpu_seconds, util_mean=h.util_mean)
            for h in idle_holders(usage)
            if sees(caller, h.user, "usage", self.settings.private_data)
        ]
        return advice, idle

    def _check_sees(self, caller: Caller, owner: str, what: str) -> None:
        if not sees(caller, owner, "usage", self.settings.private_data):
            raise PermissionDenied(
                f"{what}: usage is private here to its owner and admins ({owner})"
            )

    def offer(self) -> Offer:
        """The MIG profiles the cluster's nodes have (each at its smallest memory) and
        whether any GPU is shared (MPS)."""
        profiles: dict[str, int] = {}
        shares = False
        for entry in self.nodes.nodes.values():
            for unit in entry.node.units:
                shares = shares or unit.shared
                if unit.mig_profile:
                    known = profiles.get(unit.mig_profile, unit.memory)
                    profiles[unit.mig_profile] = min(known, unit.memory)
        return Offer(mig=tuple(sorted(profiles.items())), shares=shares)

    def card_memory(self) -> dict[str, int]:
        """Each unit's memory (bytes), by UUID, over the nodes the coordinator knows."""
        return {u.uuid: u.memory for e in self.nodes.nodes.values() for u in e.node.units}

    def past_run(self, job: Job, memory: dict[str, int]) -> PastRun | None:
        """A job that started as right-sizing reads it (None: it never started); `memory`:
        card_memory's."""
        if job.start_time is None:
            return None
        res = job.spec.resources
        measured = job.telemetry
        peak: int | None = None
        if measured is not None:
            peaks = [u.peak_mem for u in measured.units]
            peak = max(peaks) if peaks else measured.peak_gpu_mem // max(1, len(job.gpus))
        cards = [memory[u] for u in job.gpus if u in memory]
        end = job.end_time if job.end_time is not None else self.clock()
        return PastRun(
            user=job.user,
            name=job.spec.name,
            state=job.state,
            gpus=res.gpus,
            nodes=res.nodes,
            asked_gpu_mem=res.gpu_mem,
            mig=res.mig,
            gpu_share=res.gpu_share,
            time_limit=self.inputs.time_limit(job),
            elapsed=max(0.0, end - job.start_time),
            peak_unit_mem=peak,
            card_mem=min(cards) if cards else None,
            util_mean=measured.util_mean if measured is not None else None,
            util_p95=measured.util_p95 if measured is not None else None,
            units=measured.units if measured is not None else (),
            asked_mem=res.mem,
        )


def _advice_message(advice: SizingAdvice, hidden: bool) -> queue_pb2.SizingAdvice:
    return queue_pb2.SizingAdvice(
        user=advice.user,
        name=HIDDEN if hidden else advice.name,
        jobs=advice.jobs,
        measured=advice.measured,
        asked_gpu_mem=advice.asked_gpu_mem or 0,
        peak_gpu_mem=advice.peak_gpu_mem,
        peak_gpu_mem_p95=advice.peak_gpu_mem_p95,
        card_mem=advice.card_mem or 0,
        util_p95=advice.util_p95,
        asked_time=int(advice.asked_time or 0),
        completed=advice.completed,
        run_p95=advice.run_p95,
        timeouts=advice.timeouts,
        gpu_mem=advice.gpu_mem or 0,
        mig=advice.mig or "",
        gpu_share=advice.gpu_share or 0,
        time=advice.time or 0,
        suggestions=advice.suggestions,
    )
