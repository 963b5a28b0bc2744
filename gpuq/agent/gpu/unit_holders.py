"""Which running job holds which of the node's units and CPUs, and a share job's VRAM limit.

The launch path notes what it gives a job (place, set_share); a job started before this agent
did is read back from its launch spec the first time it is asked about. A failed launch and a
job's end forget it; an end also starts the hand-over check of its units (gpu.handover_watch).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from gpuq.agent.gpu.handover_watch import UnitWatch
from gpuq.agent.jobs.isolation import choose_cpus, parse_cpulist
from gpuq.agent.jobs.launch_spec import LaunchSpec
from gpuq.domain.states import JobState

# how the GPU room ends a job: (job id, the state it ends in, the reason, seconds between
# SIGTERM and SIGKILL)
StopJob = Callable[[int, JobState, str, float], Awaitable[object]]


class RunningJobs(Protocol):
    """What the GPU room asks of the node's jobs (gpuq.agent.jobs.supervisors.Supervisors)."""

    def running_jobs(self) -> list[int]: ...

    def launch_spec_of(self, job_id: int) -> LaunchSpec | None: ...

    def supervisor_pids(self) -> dict[int, int]: ...


class UnitHolders:
    def __init__(self, jobs: RunningJobs, watch: UnitWatch) -> None:
        self.jobs = jobs
        self.watch = watch
        self.job_units: dict[int, tuple[str, ...]] = {}  # running job -> the units it holds
        self.job_cpus: dict[int, tuple[int, ...]] = {}  # running job -> the CPUs it is bound to
        # MPS share jobs: their VRAM limit in bytes (gpu.share_guard enforces it by measure)
        self.share_limits: dict[int, int] = {}

    def place(
        self,
        job_id: int,
        gpus: tuple[str, ...],
        cpus: int,
        local_cpus: Mapping[str, Sequence[int]],
        online: Sequence[int],
    ) -> tuple[int, ...]:
        """Note the units a job is given; the CPUs to bind it to (free ones near its GPUs
        first; none when it asks for every online CPU of the node)."""
        near = sorted({cpu for uuid in gpus for cpu in local_cpus.get(uuid, ())})
        load = Counter(cpu for held in self.job_cpus.values() for cpu in held)
        chosen = choose_cpus(cpus, online, set(load), near, load) if cpus < len(online) else ()
        self.job_units[job_id] = gpus
        self.job_cpus[job_id] = tuple(chosen)
        return tuple(chosen)

    def set_share(self, job_id: int, mem_limit: int) -> None:
        """The job is an MPS share with this VRAM limit (bytes), enforced by measure."""
        self.share_limits[job_id] = mem_limit

    def launch_failed(self, job_id: int) -> None:
        self.job_units.pop(job_id, None)
        self.job_cpus.pop(job_id, None)
        self.share_limits.pop(job_id, None)

    def job_ended(self, job_id: int) -> tuple[str, ...]:
        """Forget what the job held; the units it held, which are then checked (the next
        heartbeat, sent with the end report, says whether they are clean)."""
        units = self.holders_of(job_id)
        self.job_units.pop(job_id, None)
        self.job_cpus.pop(job_id, None)
        self.share_limits.pop(job_id, None)
        if units:
            self.watch.job_ended(job_id, units)
        return units

    def holders_of(self, job_id: int) -> tuple[str, ...]:
        if job_id not in self.job_units:
            self._adopt(job_id)
        return self.job_units.get(job_id, ())

    def _adopt(self, job_id: int) -> None:
        """A job started before this agent did: its units, CPUs and share limit from its
        launch spec."""
        spec = self.jobs.launch_spec_of(job_id)
        if spec is None:  # its folder is gone or unreadable: no units known (not read again)
            self.job_units[job_id] = ()
            self.job_cpus[job_id] = ()
            return
        self.job_units[job_id] = spec.gpus
        if spec.share_mem is not None:
            self.share_limits[job_id] = spec.share_mem
        self.job_cpus[job_id] = tuple(parse_cpulist(spec.cpuset)) if spec.cpuset else ()

    def holders(self) -> dict[str, int]:
        """unit uuid -> the running job holding it."""
        held: dict[str, int] = {}
        for job_id in self.jobs.running_jobs():
            for uuid in self.holders_of(job_id):
                held[uuid] = job_id
        return held

    def sharers(self) -> dict[str, set[int]]:
        """unit uuid -> the share jobs on it."""
        found: dict[str, set[int]] = {}
        for job_id in self.share_limits:
            for uuid in self.job_units.get(job_id, ()):
                found.setdefault(uuid, set()).add(job_id)
        return found
