"""The plain data gpuq is about: what a user asks for, what a job is, what a node offers.

All frozen dataclasses, validated on construction so that an invalid value cannot travel far:
the CLI parses strings into these, the servicers convert protos into these, and both get the
same InvalidInput for the same mistake. The bounds and text checks they use are in
gpuq.domain.limits; arrays and dependencies, with their notations, in .array_specs and
.dependencies; where a job may run in .node_constraints, GPU types in .gpu_types.
"""

from __future__ import annotations

import re
import signal as signal_module
from dataclasses import dataclass, field
from enum import StrEnum

from gpuq.domain.array_specs import ArraySpec, format_indices
from gpuq.domain.dependencies import Dependency
from gpuq.domain.file_patterns import Fields
from gpuq.domain.file_patterns import expand as expand_pattern
from gpuq.domain.gpu_types import check_gpu_type
from gpuq.domain.interactive_jobs import Terminal
from gpuq.domain.limits import (
    DIGITS_RE,
    MAX_BEGIN_TIME,
    MAX_DEPENDENCIES,
    MAX_GPU_MEM,
    MAX_MEM,
    MAX_NICE,
    MAX_PATH_BYTES,
    MAX_TIME_LIMIT,
    bounded_number,
    check_args,
    check_env,
    check_name,
    check_qos,
    check_range,
    check_script,
    check_text,
    shown,
)
from gpuq.domain.node_constraints import Placement
from gpuq.domain.notify import check_mail_types, check_mail_user, check_notify_url
from gpuq.domain.states import JobState
from gpuq.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class Resources:
    """What one job (or one array task) needs; sizes in bytes, time in seconds."""

    gpus: int = 0
    gpu_mem: int | None = None  # per GPU: the least memory a GPU must have for this job
    cpus: int = 1
    mem: int | None = None  # host RAM for the whole job (SLURM's --mem)
    time_limit: int | None = None  # None: the default applies (partition's, else QOS's)
    # one MIG slice of this profile (e.g. "3g.71gb") instead of whole GPUs; gpus is then 1
    mig: str | None = None
    # an MPS share of one shared GPU: percent of its compute (1-100); gpu_mem is then the
    # share's VRAM limit (required) and gpus is 1. None: whole GPUs (or a MIG slice)
    gpu_share: int | None = None
    # a GPU model ("a100"; gpuq.domain.gpu_types): only GPUs of this type. None: any
    gpu_type: str | None = None
    # ---- jobs that span nodes and tasks (SLURM's --nodes, --ntasks...). gpus, cpus and mem
    # above are per node; for one node (the default) that is the whole job.
    nodes: int = 1  # --nodes N: N distinct nodes, started together or not at all
    tasks_per_node: int = 1  # tasks a step runs on each node by default (srun's size)
    gpus_per_task: int | None = None  # --gpus-per-task: each task is bound to this many
    exclusive: bool = False  # --exclusive: whole nodes (every unit, CPU and byte of each)
    mem_all: bool = False  # --mem=0: all of each node's memory
    # the user asked for tasks (--ntasks, --ntasks-per-node): SLURM sets SLURM_NTASKS (which
    # Lightning reads as "launched by srun") only then, and so does gpuq
    explicit_tasks: bool = False

    def __post_init__(self) -> None:
        check_range("--gpus", self.gpus, 0, 1024)
        self._check_layout()
        if self.gpu_type is not None:
            check_gpu_type(self.gpu_type)
            if self.gpus == 0:
                raise InvalidInput("--gpus", f"{self.gpu_type}:0", "a GPU type needs a GPU count")
        if self.gpu_share is not None:
            self._check_share(self.gpu_share)
        if self.mig is not None:
            if not isinstance(self.mig, str) or not MIG_PROFILE_RE.fullmatch(self.mig):
                raise InvalidInput(
                    "--mig", shown(self.mig), "expected a MIG profile such as 1g.10gb or 3g.71gb"
                )
            if self.gpus == 0:
                object.__setattr__(self, "gpus", 1)  # --mig implies one unit
            elif self.gpus != 1:
                raise InvalidInput("--mig", f"{self.mig} with --gpus {self.gpus}", ONE_MIG_SLICE)
        check_range("--cpus", self.cpus, 1, 65536)
        if self.gpu_mem is not None:
            check_range("--gpu-mem", self.gpu_mem, 1, MAX_GPU_MEM, "must be from 1 byte to 1P")
            if self.gpus == 0:
                raise InvalidInput("--gpu-mem", self.gpu_mem, "needs --gpus of at least 1")
        if self.mem is not None:
            check_range("--mem", self.mem, 1, MAX_MEM, "must be from 1 byte to 1024P")
        if self.time_limit is not None:
            check_range(
                "--time", self.time_limit, 1, MAX_TIME_LIMIT, "must be from 1 second to 366 days"
            )

    def _check_layout(self) -> None:
        check_range("--nodes", self.nodes, 1, MAX_NODES)
        check_range("--ntasks-per-node", self.tasks_per_node, 1, MAX_TASKS_PER_NODE)
        if self.nodes > 1 and (self.mig is not None or self.gpu_share is not None):
            raise InvalidInput(
                "--nodes", self.nodes, "a MIG slice or an MPS share is of one GPU on one node"
            )
        if self.gpus_per_task is not None:
            check_range("--gpus-per-task", self.gpus_per_task, 1, 1024)
            if self.gpus_per_task * self.tasks_per_node != self.gpus:
                raise InvalidInput(
                    "--gpus-per-task",
                    self.gpus_per_task,
                    f"{self.tasks_per_node} tasks per node need "
                    f"{self.gpus_per_task * self.tasks_per_node} GPUs per node, not {self.gpus}",
                )
        if self.cpus % self.tasks_per_node:
            raise InvalidInput(
                "--cpus-per-task",
                f"{self.cpus} CPUs for {self.tasks_per_node} tasks",
                "a node's CPUs are split evenly among its tasks",
            )
        if self.mem_all and self.mem is not None:
            raise InvalidInput("--mem", 0, "--mem=0 (all of each node's memory) with a size")
        if self.exclusive and (self.mig is not None or self.gpu_share is not None):
            raise InvalidInput("--exclusive", "with --mig or --gpu-share", "whole nodes only")

    @property
    def total_gpus(self) -> int:
        """GPUs over all the job's nodes: what QOS limits count and fair share charges."""
        return self.gpus * self.nodes

    @property
    def ntasks(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def cpus_per_task(self) -> int:
        return self.cpus // self.tasks_per_node

    def _check_share(self, share: int) -> None:
        check_range("--gpu-share", share, 1, 100, "must be a percentage from 1 to 100")
        if self.mig is not None:
            raise InvalidInput(
                "--gpu-share", f"{share} with --mig {shown(self.mig)}", "ask for a share or a slice"
            )
        if self.gpus == 0:
            object.__setattr__(self, "gpus", 1)  # a share is of one GPU
        elif self.gpus != 1:
            raise InvalidInput(
                "--gpu-share", f"{share} with --gpus {self.gpus}", "a share is of one GPU"
            )
        if self.gpu_mem is None:
            raise InvalidInput(
                "--gpu-share", share, "needs --gpu-mem SIZE: the share's VRAM limit (e.g. 20G)"
            )

    @property
    def enforcement(self) -> str:
        """How a job's GPUs are kept to it: "exclusive" (whole GPUs), "MIG (hardware)" (a
        slice), "MPS (limits)" (a share), "" without GPUs."""
        if not self.gpus:
            return ""
        if self.gpu_share is not None:
            return ENFORCEMENT_MPS
        return ENFORCEMENT_MIG if self.mig is not None else ENFORCEMENT_EXCLUSIVE


MAX_NODES = 1024  # --nodes
MAX_TASKS_PER_NODE = 4096  # --ntasks-per-node

ENFORCEMENT_EXCLUSIVE = "exclusive"
ENFORCEMENT_MIG = "MIG (hardware)"
ENFORCEMENT_MPS = "MPS (limits)"


# NVIDIA's MIG profile names: GPU instances "3g.71gb", "1g.10gb+me", compute instances "1c.3g.40gb"
MIG_PROFILE_RE = re.compile(r"(?:[1-8]c\.)?[1-8]g\.[0-9]{1,4}gb(?:\+[a-z]{1,8}){0,3}")
ONE_MIG_SLICE = (
    "a job sees one MIG slice (CUDA enumerates one per process); "
    "ask for --gpus N whole GPUs or one --mig slice"
)

# NVML reports less memory than a card's marketed size (the driver keeps some): H100 "80GB"
# 81,559 MiB (-0.4 %), H200 "141GB" 143,771 MiB (-0.4 %), L4 "24GB" 23,034 MiB (-6.3 %),
# L40S "48GB" 46,068 MiB (-6.3 %), A100 "40GB" 40,960 MiB. A unit fits `--gpu-mem X` when its
# NVML total is at least X * (1 - GPU_MEM_TOLERANCE), so the marketed size fits its own card
# (the largest gap is ~6.3 %, on 24 GB and 48 GB cards) and never a smaller card
# (80G asks for at least 74.4 GiB: an A100 40GB does not fit).
GPU_MEM_TOLERANCE = 0.07


def gpu_mem_fits(total: int, asked: int | None) -> bool:
    """Does a unit with `total` bytes (NVML's figure) meet `--gpu-mem asked`? The one
    comparison for placement, never-fits checks, array splitting and shortage texts."""
    return asked is None or total >= asked * (1 - GPU_MEM_TOLERANCE)


@dataclass(frozen=True, slots=True)
class WarningSignal:
    """`--signal SIG@SECONDS`: sent that long before a time limit or a preemption's kill."""

    signal: int = int(signal_module.SIGTERM)
    seconds: int = 0

    def __post_init__(self) -> None:
        check_range("--signal", self.signal, 1, 64, "signal numbers go from 1 to 64")
        if self.signal not in _SIGNALS:
            raise InvalidInput("--signal", self.signal, "not a signal number")
        if self.signal in _NO_WARNING:
            raise InvalidInput("--signal", self.signal, _NO_WARNING[self.signal])
        check_range(
            "--signal",
            self.seconds,
            0,
            MAX_TIME_LIMIT,
            f"the warning time must be from 0 to {MAX_TIME_LIMIT} seconds (366 days)",
        )

    @classmethod
    def parse(cls, text: str) -> WarningSignal:
        """`USR1`, `SIGUSR1@60`, `10@90`: the signal, and how many seconds before the end."""
        raw = text.strip() if isinstance(text, str) else ""
        name, at, seconds = raw.partition("@")
        sig = parse_signal(name, "--signal")
        if at and not DIGITS_RE.fullmatch(seconds):
            raise InvalidInput("--signal", shown(text), "expected SIG or SIG@SECONDS")
        number = bounded_number(seconds, MAX_TIME_LIMIT) if at else 0
        if number is None:
            raise InvalidInput(
                "--signal",
                shown(text),
                f"the warning time must be from 0 to {MAX_TIME_LIMIT} seconds (366 days)",
            )
        if sig in _NO_WARNING:
            raise InvalidInput("--signal", shown(text), _NO_WARNING[sig])
        return cls(sig, number)


# real signals only: 32 and 33 are the C library's own, and Linux stops at 64
_SIGNALS = frozenset(int(s) for s in signal_module.valid_signals() if 1 <= int(s) <= 64)
_NO_WARNING = {
    int(signal_module.SIGKILL): "SIGKILL cannot be caught, so it cannot warn a job "
    "(the job gets SIGKILL after the grace period anyway); use e.g. USR1 or TERM",
    int(signal_module.SIGSTOP): "SIGSTOP would freeze the job, which keeps its GPUs; "
    "use a signal the job can trap, e.g. USR1 or TERM",
}
_SIGNAL_NAME_RE = re.compile(r"(?:SIG)?[A-Z][A-Z0-9]{0,15}")


def parse_signal(text: str, field_name: str = "signal") -> int:
    """`TERM`, `SIGTERM`, `usr1` or `15` (a real signal: 1 to 64)."""
    raw = text.strip().upper() if isinstance(text, str) else ""
    if DIGITS_RE.fullmatch(raw):
        number = bounded_number(raw, 64)
        if number is None or number not in _SIGNALS:
            raise InvalidInput(field_name, shown(text), "not a signal number (1 to 64)")
        return number
    if not _SIGNAL_NAME_RE.fullmatch(raw):
        raise InvalidInput(field_name, shown(text), "not a signal name, e.g. USR1 or TERM")
    name = raw if raw.startswith("SIG") else f"SIG{raw}"
    try:
        return int(signal_module.Signals[name])
    except KeyError:
        raise InvalidInput(field_name, text, "not a signal name, e.g. USR1 or TERM") from None


@dataclass(frozen=True, slots=True)
class JobSpec:
    """Everything a submission says. The script is copied at submit time, as sbatch does."""

    name: str
    script: str
    workdir: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    resources: Resources = field(default_factory=Resources)
    qos: str | None = None  # None: the configured default tier
    nice: int = 0
    output: str | None = None  # pattern; None: gpuq-%j.out in workdir (%A_%a for arrays)
    error: str | None = None  # None: into the output file
    array: ArraySpec | None = None
    dependencies: tuple[Dependency, ...] = ()
    hold: bool = False
    begin_time: float | None = None
    signal: WarningSignal | None = None
    requeue: bool = True
    singleton: bool = False
    source: str = ""  # where the script came from: a path, or "--wrap"
    umask: int | None = None  # the submitter's: output files are created with it
    placement: Placement = field(default_factory=Placement)
    terminal: Terminal | None = None  # an interactive job (gpuq run, gpuq alloc)
    # SLURM's --mail-type (gpuq.domain.notify.MAIL_TYPES, in that order) and --mail-user
    # (None: the job's user, delivered by the local MTA)
    mail_types: tuple[str, ...] = ()
    mail_user: str | None = None
    notify_url: str | None = None  # --notify: a webhook told of every state change

    def __post_init__(self) -> None:
        check_name(self.name)
        check_text("script", self.source, MAX_PATH_BYTES)
        check_script(self.script, self.source or self.name)
        if not self.script.startswith("#!"):
            raise InvalidInput(
                "script",
                self.source or self.name,
                "the first line must start with #! and an interpreter (or use --wrap)",
            )
        check_text("workdir", self.workdir, MAX_PATH_BYTES)
        if not self.workdir.startswith("/"):
            raise InvalidInput("workdir", self.workdir, "must be an absolute path")
        check_args(self.args)
        check_env(self.env)
        if self.qos is not None:
            check_qos(self.qos)
        check_range("--nice", self.nice, -MAX_NICE, MAX_NICE)
        if self.output is not None:
            check_text("--output", self.output, MAX_PATH_BYTES)
        if self.error is not None:
            check_text("--error", self.error, MAX_PATH_BYTES)
        if len(self.dependencies) > MAX_DEPENDENCIES:
            raise InvalidInput(
                "--after",
                f"{len(self.dependencies)} dependencies",
                f"at most {MAX_DEPENDENCIES} (depend on an array instead of its tasks)",
            )
        begin = self.begin_time
        if begin is not None and (
            isinstance(begin, bool)
            or not isinstance(begin, int | float)
            or not 0 <= begin <= MAX_BEGIN_TIME  # False for NaN too
        ):
            raise InvalidInput("--begin", shown(begin), "must be a time from 1970 to 2100")
        if self.umask is not None:
            check_range("umask", self.umask, 0, 0o777)
        check_mail_types(self.mail_types)
        if self.mail_user is not None:
            check_mail_user(self.mail_user)
        if self.notify_url is not None:
            check_notify_url(self.notify_url)


@dataclass(frozen=True, slots=True)
class JobResult:
    """How a run ended, kept apart from the state: exit code or signal, and why."""

    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Job:
    id: int
    spec: JobSpec
    user: str
    state: JobState
    qos: str  # the tier it runs in (the spec's, or the default one)
    priority: int
    submit_time: float
    start_time: float | None = None
    end_time: float | None = None
    node: str | None = None  # where it runs (ran): the first node of a multi-node job
    gpus: tuple[str, ...] = ()  # unit UUIDs of the current or last allocation (every node's)
    # a multi-node job's nodes, the first (where its script runs) first; () on one node
    nodes: tuple[str, ...] = ()
    # the current (last) start's MASTER_PORT (its step workers listen one above), and the
    # secret its srun and step workers prove to each other: the agents' business, never shown
    master_port: int | None = None
    step_key: str | None = field(default=None, repr=False)
    result: JobResult | None = None
    requeue_count: int = 0
    start_count: int = 0  # starts so far: the current start's attempt number (JobLaunch.attempt)
    array_job_id: int | None = None
    array_task_id: int | None = None
    reason: str = ""  # why the last state change happened (or the pending reason)
    stop: tuple[JobState, str] | None = None  # a requested stop: what it ends as, and why
    # an array's record stands for its tasks that have not been split off to run on their own
    # (SLURM keeps one record until tasks start); () for a single job or a split task
    tasks: tuple[int, ...] = ()
    # what its GPUs did (measured by its agent): over its run once it ended, so far while it
    # runs (as last stored); None: nothing measured
    telemetry: JobTelemetry | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def node_names(self) -> tuple[str, ...]:
        """Every node the job runs (ran) on, the first first; () before it started."""
        return self.nodes or ((self.node,) if self.node else ())

    @property
    def display_id(self) -> str:
        """`123`, `120_3` for task 3 of array 120, or `120_[4-99%8]` for an array's record of
        tasks not yet started, as SLURM prints them."""
        if self.tasks:
            limit = self.spec.array.max_running if self.spec.array else None
            return f"{self.array_job_id}_[{format_indices(self.tasks)}" + (
                f"%{limit}]" if limit else "]"
            )
        if self.array_job_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return str(self.id)


@dataclass(frozen=True, slots=True)
class UnitTelemetry:
    """One GPU unit's share of a job's telemetry; None: unknown (never 0)."""

    uuid: str
    peak_mem: int = 0  # bytes the job's processes held on it at most
    util_mean: float | None = None  # percent busy (SM)
    util_p95: float | None = None
    energy: float | None = None  # joules; None for a MIG slice (the counter is the board's)


@dataclass(frozen=True, slots=True)
class JobTelemetry:
    """What a job's GPUs did over its run (or so far): the aggregates kept with the job."""

    peak_gpu_mem: int = 0  # bytes, all its units together, at the busiest sample
    util_mean: float | None = None  # percent, mean over its units and samples; None: unknown
    util_p95: float | None = None
    energy: float | None = None  # joules; None: unknown
    samples: int = 0
    seconds: float = 0.0  # time the samples cover
    units: tuple[UnitTelemetry, ...] = ()


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """One point of a job's downsampled series (for plotting): bytes held, percent busy."""

    job_id: int
    at: float
    gpu_mem: int
    util: float | None = None  # mean over its units; None: unknown


@dataclass(frozen=True, slots=True)
class UsageRow:
    """`gpuq report`: one user's ended jobs (sreport/seff); energy and util cover only the
    jobs that measured them (util_gpu_seconds: the GPU-seconds the mean is over)."""

    user: str
    jobs: int
    gpu_seconds: float
    energy: float | None  # joules; None: no job measured it
    util_mean: float | None  # percent, weighted by GPU-seconds; None: none measured
    util_gpu_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class JobEvent:
    job_id: int
    at: float
    from_state: JobState | None
    to_state: JobState
    reason: str
    cause: str = ""  # what caused it: "Cancel by alice", "report from node a", ...


class NodeState(StrEnum):
    UP = "up"
    DOWN = "down"  # agent gone past its heartbeat timeout, or never connected since start


@dataclass(frozen=True, slots=True)
class GpuUnit:
    """What one job can be given: a whole GPU, or a MIG slice (then parent_uuid is set)."""

    uuid: str
    index: int
    name: str
    memory: int
    pci_bus_id: str = ""
    parent_uuid: str | None = None
    mig_profile: str | None = None
    shared: bool = False  # the admin shares this GPU (MPS shares); whole GPUs only

    @property
    def is_mig(self) -> bool:
        return self.parent_uuid is not None or self.mig_profile is not None

    @property
    def kind(self) -> str:
        """ "GPU" for a whole GPU, the profile (e.g. "MIG 3g.71gb") for a MIG slice."""
        return f"MIG {self.mig_profile or '?'}" if self.is_mig else "GPU"

    @property
    def label(self) -> str:
        """How reasons name it: "GPU 2", or "GPU 0 slice 3g.40gb" (a MIG slice of GPU 0)."""
        if self.is_mig:
            return f"GPU {self.index} slice {self.mig_profile or '?'}"
        return f"GPU {self.index}"


# How far apart two GPUs are; lower is closer. NVLink beats any PCIe path. The PCIe levels
# follow NVML's nvmlGpuTopologyLevel_t.
DISTANCE_NVLINK = 5
DISTANCE_SAME_BOARD = 10  # NVML TOPOLOGY_INTERNAL / SINGLE
DISTANCE_PCIE_SWITCH = 20  # MULTIPLE
DISTANCE_HOST_BRIDGE = 30
DISTANCE_NUMA_NODE = 40
DISTANCE_SYSTEM = 50  # across CPU sockets


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    units: tuple[GpuUnit, ...]
    cpus: int
    mem: int
    state: NodeState = NodeState.DOWN
    fake: bool = False
    topology: tuple[tuple[str, str, int], ...] = ()  # (uuid a, uuid b, distance), a < b
    last_seen: float | None = None
    reason: str = ""
    # as its agent registered (memory only): GPU isolation ("devices cgroup v1", "cgroup v2
    # device program", "advisory: WHY"), the NVIDIA driver, why it offers no GPUs
    isolation: str = ""
    driver: str = ""
    gpu_problem: str = ""
    features: tuple[str, ...] = ()  # [agent] features: what --constraint matches
    # its agent's [agent] fence_time as it registered (0: not said): its jobs are given up no
    # sooner than their supervisors have fenced them (gpuq.domain.policy.fence_wait)
    fence_time: float = 0.0


class Health(StrEnum):
    """A unit's health: ok, unhealthy or dirty as its agent last said, drained by an admin."""

    OK = "ok"
    UNHEALTHY = "unhealthy"  # NVML errors, a lost GPU, a hardware XID, ECC or row remapping
    DIRTY = "dirty"  # processes of an ended job (or foreign ones) still hold it
    DRAINED = "drained"  # an admin's drain (gpuq drain), kept in the store


@dataclass(frozen=True, slots=True)
class Drain:
    """An admin's drain of a whole node (unit "") or of one unit (its UUID)."""

    node: str
    unit: str
    reason: str
    by: str
    at: float


def is_advisory(isolation: str) -> bool:
    """The node cannot enforce a job's GPUs (only CUDA_VISIBLE_DEVICES stands between jobs)."""
    return isolation.startswith("advisory")


@dataclass(frozen=True, slots=True)
class CronEntry:
    """A recurring submission: `spec` is submitted at every time `schedule` names."""

    id: int
    user: str
    schedule: str  # five cron fields: minute hour day month weekday
    spec: JobSpec
    created_at: float
    last_fire: float | None = None  # the scheduled time of the last fire handled


@dataclass(frozen=True, slots=True)
class Allocation:
    """What a started job holds on its node."""

    job_id: int
    node: str
    gpus: tuple[str, ...]


def output_paths(
    spec: JobSpec,
    job_id: int,
    user: str,
    node: str | None = None,
    array: tuple[int, int | str] | None = None,
    name: str | None = None,
) -> tuple[str, str]:
    """The job's stdout and stderr files, with sbatch's `%` patterns filled in
    (gpuq.domain.file_patterns; for an array's record of tasks not yet started, `array` is
    (id, "%a"): each task's files differ; `name`: what `%x` shows instead of the job's name,
    for a caller from whom names are hidden; `node`: None before the job runs, `%N` then
    shows "unknown"). Relative paths are relative to the submit folder. Without --error,
    stderr goes to the output file, as with sbatch.
    """
    default = "gpuq-%A_%a.out" if array else "gpuq-%j.out"
    fields = Fields(
        job_id=job_id,
        user=user,
        name=spec.name if name is None else name,
        node=node or "unknown",
        array_id=array[0] if array else None,
        task=array[1] if array else None,
    )

    def expand(pattern: str) -> str:
        text = expand_pattern(pattern, fields)
        return text if text.startswith("/") else f"{spec.workdir.rstrip('/')}/{text}"

    stdout = expand(spec.output or default)
    return stdout, expand(spec.error) if spec.error else stdout
