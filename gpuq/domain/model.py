"""The plain data gpuq is about: what a user asks for, what a job is, what a node offers.

All frozen dataclasses, validated on construction so that an invalid value cannot travel far:
the CLI parses strings into these, the servicers convert protos into these, and both get the
same InvalidInput for the same mistake.
"""

from __future__ import annotations

import re
import signal as signal_module
from dataclasses import dataclass, field
from enum import StrEnum

from gpuq.domain.states import JobState
from gpuq.errors import InvalidInput

MAX_ARRAY_TASKS = 100_000
_NAME_RE = re.compile(r"^[A-Za-z0-9_.+@=:,-]{1,128}$")


@dataclass(frozen=True, slots=True)
class Resources:
    """What one job (or one array task) needs; sizes in bytes, time in seconds."""

    gpus: int = 0
    gpu_mem: int | None = None  # per GPU: the least memory a GPU must have for this job
    cpus: int = 1
    mem: int | None = None  # host RAM for the whole job (SLURM's --mem)
    time_limit: int | None = None  # None: the QOS default applies

    def __post_init__(self) -> None:
        _check_range("--gpus", self.gpus, 0, 1024)
        _check_range("--cpus", self.cpus, 1, 65536)
        if self.gpu_mem is not None:
            _check_range("--gpu-mem", self.gpu_mem, 1, 2**50)
            if self.gpus == 0:
                raise InvalidInput("--gpu-mem", self.gpu_mem, "needs --gpus of at least 1")
        if self.mem is not None:
            _check_range("--mem", self.mem, 1, 2**60)
        if self.time_limit is not None:
            _check_range("--time", self.time_limit, 1, 366 * 86400)


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(name, value, f"must be a whole number from {low} to {high}")


class DependencyKind(StrEnum):
    OK = "ok"  # start after the job completed with exit code 0 (SLURM afterok)
    ANY = "any"  # start after the job ended in any way (afterany)
    NOTOK = "notok"  # start after the job ended in failure of any kind (afternotok)


@dataclass(frozen=True, slots=True)
class Dependency:
    job_id: int
    kind: DependencyKind = DependencyKind.OK

    @classmethod
    def parse(cls, text: str) -> Dependency:
        """`123`, `123:ok`, `123:any` or `123:notok`."""
        job, _, kind = text.strip().partition(":")
        if not job.isdigit() or int(job) <= 0:
            raise InvalidInput("--after", text, "expected JOB[:ok|any|notok]")
        try:
            return cls(int(job), DependencyKind(kind or "ok"))
        except ValueError:
            raise InvalidInput("--after", text, "the kind must be ok, any or notok") from None


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """Task indices and how many may run at once (SLURM's `0-99%8`)."""

    indices: tuple[int, ...]
    max_running: int | None = None

    def __post_init__(self) -> None:
        if not self.indices:
            raise InvalidInput("--array", self.indices, "has no tasks")
        if len(set(self.indices)) != len(self.indices):
            raise InvalidInput("--array", self.indices, "repeats a task index")
        if len(self.indices) > MAX_ARRAY_TASKS:
            raise InvalidInput("--array", len(self.indices), f"more than {MAX_ARRAY_TASKS} tasks")
        if min(self.indices) < 0 or max(self.indices) > 10_000_000:
            raise InvalidInput("--array", self.indices, "indices go from 0 to 10000000")
        if self.max_running is not None:
            _check_range("--array limit", self.max_running, 1, MAX_ARRAY_TASKS)

    @classmethod
    def parse(cls, text: str) -> ArraySpec:
        """`0-99`, `0-99%8`, `1,3,5-7`, `0-15:4` (step 4)."""
        body, _, limit = text.strip().partition("%")
        indices: list[int] = []
        try:
            for part in body.split(","):
                span, _, step_text = part.partition(":")
                first, _, last = span.partition("-")
                low = int(first)
                high = int(last) if last else low
                step = int(step_text) if step_text else 1
                if high < low or step < 1:
                    raise ValueError(part)
                if (high - low) // step >= MAX_ARRAY_TASKS:
                    raise InvalidInput("--array", text, f"more than {MAX_ARRAY_TASKS} tasks")
                indices.extend(range(low, high + 1, step))
            max_running = int(limit) if limit else None
        except ValueError:
            raise InvalidInput(
                "--array", text, "expected e.g. 0-99, 1,3,5-7, 0-15:4 or 0-99%8"
            ) from None
        return cls(tuple(sorted(set(indices))), max_running)


@dataclass(frozen=True, slots=True)
class WarningSignal:
    """`--signal SIG@SECONDS`: sent that long before a time limit or a preemption's kill."""

    signal: int = int(signal_module.SIGTERM)
    seconds: int = 0

    @classmethod
    def parse(cls, text: str) -> WarningSignal:
        name, _, seconds = text.strip().partition("@")
        sig = parse_signal(name, "--signal")
        if seconds and not seconds.isdigit():
            raise InvalidInput("--signal", text, "expected SIG or SIG@SECONDS")
        return cls(sig, int(seconds or 0))


def parse_signal(text: str, field_name: str = "signal") -> int:
    """`TERM`, `SIGTERM`, `usr1` or `15`."""
    raw = text.strip().upper()
    if raw.isdigit():
        number = int(raw)
        valid = {int(s) for s in signal_module.Signals}
        if number not in valid:
            raise InvalidInput(field_name, text, "not a signal number")
        return number
    name = raw if raw.startswith("SIG") else f"SIG{raw}"
    try:
        return int(signal_module.Signals[name])
    except KeyError:
        raise InvalidInput(field_name, text, "not a signal name") from None


def check_name(value: str, field_name: str = "--name") -> str:
    if not _NAME_RE.match(value):
        raise InvalidInput(field_name, value, "use 1 to 128 letters, digits or _ . + @ = : , -")
    return value


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

    def __post_init__(self) -> None:
        check_name(self.name)
        if not self.script.startswith("#!"):
            raise InvalidInput(
                "script",
                self.source or self.name,
                "the first line must start with #! and an interpreter (or use --wrap)",
            )
        if "\0" in self.script:
            raise InvalidInput("script", self.source or self.name, "contains a NUL byte")
        if not self.workdir.startswith("/"):
            raise InvalidInput("workdir", self.workdir, "must be an absolute path")
        _check_range("--nice", self.nice, -10000, 10000)
        for key in self.env:
            if not key or "=" in key or "\0" in key or "\0" in self.env[key]:
                raise InvalidInput("--env", key, "not a valid environment variable")


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
    node: str | None = None
    gpus: tuple[str, ...] = ()  # unit UUIDs of the current or last allocation
    result: JobResult | None = None
    requeue_count: int = 0
    array_job_id: int | None = None
    array_task_id: int | None = None
    reason: str = ""  # why the last state change happened (or the pending reason)
    stop: tuple[JobState, str] | None = None  # a requested stop: what it ends as, and why

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def display_id(self) -> str:
        """`123`, or `120_3` for task 3 of array 120, as SLURM prints them."""
        if self.array_job_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return str(self.id)


@dataclass(frozen=True, slots=True)
class JobEvent:
    job_id: int
    at: float
    from_state: JobState | None
    to_state: JobState
    reason: str


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
    array: tuple[int, int] | None = None,
) -> tuple[str, str]:
    """The job's stdout and stderr files, with sbatch's `%` patterns filled in.

    `%j` job id, `%A`/`%a` array job id and task index, `%x` name, `%u` user, `%N` node,
    `%%` a percent sign; relative paths are relative to the submit folder. Without --error,
    stderr goes to the output file, as with sbatch.
    """
    default = "gpuq-%A_%a.out" if array else "gpuq-%j.out"
    values = {
        "j": str(job_id),
        "A": str(array[0]) if array else str(job_id),
        "a": str(array[1]) if array else "0",
        "x": spec.name,
        "u": user,
        "N": node or "unknown",
        "%": "%",
    }

    def expand(pattern: str) -> str:
        text = re.sub(r"%([jAaxuN%])", lambda m: values[m.group(1)], pattern)
        return text if text.startswith("/") else f"{spec.workdir.rstrip('/')}/{text}"

    stdout = expand(spec.output or default)
    return stdout, expand(spec.error) if spec.error else stdout
