"""What the scheduler is given and what it returns: plain, immutable data.

The coordinator builds a snapshot from memory; `plan` returns Decisions; the coordinator applies
them in one store transaction. Tests build snapshots by hand (no server, a fake clock).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from gpuq.domain.dependencies import DependencyKind
from gpuq.domain.model import Resources
from gpuq.domain.node_constraints import Placement
from gpuq.domain.policy import QosTier, SchedulerSettings
from gpuq.domain.states import JobState
from gpuq.scheduler.fit_keys import FitKey


@dataclass(frozen=True, slots=True)
class Policy:
    tiers: Mapping[str, QosTier]
    settings: SchedulerSettings = field(default_factory=SchedulerSettings)
    kill_grace: float = 30.0  # a preempted job's warning signal to SIGKILL

    def time_limit(self, qos: str, requested: int | None) -> float | None:
        tier = self.tiers.get(qos)
        limit = requested or (tier.default_time if tier else None)
        return float(limit) if limit else None

    def can_preempt(self, preemptor_qos: str, victim_qos: str) -> bool:
        """Only preemptible tiers, and only by a tier of higher priority weight."""
        mine, theirs = self.tiers.get(preemptor_qos), self.tiers.get(victim_qos)
        return (
            mine is not None
            and theirs is not None
            and theirs.preemptible
            and theirs.priority < mine.priority
        )


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A running job on one node. A job that spans nodes is given as one RunningJob per node
    (same job_id; that node's units, CPUs and memory; its first node first): releases and
    per-node views stay per node, and whatever counts jobs counts it once."""

    job_id: int
    user: str
    qos: str
    node: str
    gpus: tuple[str, ...]
    cpus: int
    mem: int
    start_time: float
    end_estimate: float  # start + time limit, or when a requested stop turns into SIGKILL
    name: str = ""
    array_job_id: int | None = None
    stopping: bool = False  # a stop (cancel, preemption, timeout) was requested
    nodes: int = 1  # how many nodes (parts) the whole job has
    # when it is expected to end: start + the measured run time of its user's jobs of its
    # name, for a job without --time (gpuq.domain.right_sizing); None: end_estimate. Only
    # the estimated starts use it: starts, backfill and reservations keep to the limits
    expected_end: float | None = None


@dataclass(frozen=True, slots=True)
class Dependency:
    """A dependency with the state its job has now (None: no such job)."""

    job_id: int
    kind: DependencyKind
    state: JobState | None  # a whole array's: live while any task is, then its worst ending
    task: int | None = None  # one task of array job_id

    @property
    def display(self) -> str:
        return f"{self.job_id}_{self.task}" if self.task is not None else str(self.job_id)


@dataclass(frozen=True, slots=True)
class PendingJob:
    job_id: int
    user: str
    qos: str
    need: Resources
    submit_time: float
    priority: float = 0.0  # computed by gpuq.scheduler.priority
    time_limit: float | None = None  # effective (QOS default filled in)
    nice: int = 0
    name: str = ""
    begin_time: float | None = None
    dependencies: tuple[Dependency, ...] = ()
    array_job_id: int | None = None
    array_max_running: int | None = None
    singleton: bool = False
    placement: Placement = field(default_factory=Placement)  # --nodelist, --exclude, --constraint
    # how long it is expected to run: the measured run time of its user's jobs of its name,
    # for a job without --time (never over time_limit); None: time_limit. As expected_end
    expected_run: float | None = None
    # its fit_key, made once per queued job by whoever keeps the queue (the coordinator's
    # LiveJobs), where a pass would make it again for every job it looks at; None: the pass
    # makes it
    fit: FitKey | None = None


@dataclass(frozen=True, slots=True)
class Start:
    """Start a job: on `node` with units `gpus`, and for a job of several nodes also on each
    of `more` (node, units), all at once. The first node runs the batch script.

    Per node the job gets its need's cpus and mem, except: --exclusive takes every CPU and
    byte of the node (and every unit: they are in `gpus`), --mem=0 every byte."""

    job_id: int
    node: str
    gpus: tuple[str, ...]
    shared: bool = False  # an MPS share of gpus[0], beside other shares of its user
    more: tuple[tuple[str, tuple[str, ...]], ...] = ()  # the other nodes and their units

    @property
    def parts(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(node, units) of every node, the first node first."""
        return ((self.node, self.gpus), *self.more)


@dataclass(frozen=True, slots=True)
class Preemption:
    """Stop job `victim` (all its nodes; `node` is its first) for job `preemptor`."""

    victim: int
    preemptor: int
    node: str


@dataclass(frozen=True, slots=True)
class Cancellation:
    job_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Waiting:
    """Why a pending job is not starting, all reasons at once, and when it may start."""

    reasons: tuple[str, ...]
    estimated_start: float | None = None


def behind(ahead: int) -> str:
    """The reason of a job with `ahead` jobs of higher priority waiting for resources."""
    if ahead == 1:
        return "priority: 1 job of higher priority is waiting"
    return f"priority: {ahead} jobs of higher priority are waiting"


class WaitingJobs(Mapping[int, Waiting]):
    """Why each pending job waits, as a pass found it, by job id. A long queue's explanation
    holds 100,000s of jobs and a listing reads a few, so it keeps each job's own reasons (for
    most jobs one tuple that its whole kind shares), how many jobs of higher priority wait
    ahead of it (the last reason, `behind`) and its estimated start, and makes a job's
    Waiting when it is read: no object per job to build, nor for the garbage collector to
    walk again and again."""

    __slots__ = ("_ahead", "_reasons", "_starts")

    def __init__(self) -> None:
        self._reasons: dict[int, tuple[str, ...]] = {}
        self._ahead: dict[int, int] = {}
        self._starts: dict[int, float] = {}

    def wait(self, job_id: int, reasons: tuple[str, ...], ahead: int = 0) -> None:
        """The job waits for `reasons` behind `ahead` jobs of higher priority."""
        self._reasons[job_id] = reasons
        if ahead:
            self._ahead[job_id] = ahead
        elif self._ahead:
            self._ahead.pop(job_id, None)
        if self._starts:  # (none while a pass explains: it estimates at its end)
            self._starts.pop(job_id, None)

    def estimate(self, job_id: int, start: float) -> None:
        """The job (waiting already) may start at `start`."""
        if job_id not in self._reasons:
            raise KeyError(job_id)
        self._starts[job_id] = start

    def __getitem__(self, job_id: int) -> Waiting:
        reasons = self._reasons[job_id]
        ahead = self._ahead.get(job_id)
        if ahead:
            reasons = (*reasons, behind(ahead))
        return Waiting(reasons, self._starts.get(job_id))

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._reasons

    def __iter__(self) -> Iterator[int]:
        return iter(self._reasons)

    def __len__(self) -> int:
        return len(self._reasons)


@dataclass(frozen=True, slots=True)
class Decisions:
    starts: tuple[Start, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    cancellations: tuple[Cancellation, ...] = ()
    waiting: Mapping[int, Waiting] = field(default_factory=dict)
