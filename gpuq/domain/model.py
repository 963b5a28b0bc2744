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
MAX_ARRAY_INDEX = 10_000_000
MAX_JOB_ID = 2**53  # exact in a JSON number and a double; far beyond any real queue
# Bounds on what one submission may say, checked on construction (so over gRPC too): each keeps
# a single submission from costing the scheduler, the store or an agent more than it should.
MAX_TIME_LIMIT = 366 * 86400  # --time, and how long before it --signal may warn
MAX_MEM = 2**60  # --mem (1024P)
MAX_GPU_MEM = 2**50  # --gpu-mem (1P per GPU)
MAX_BEGIN_TIME = 4_102_444_800.0  # 2100-01-01T00:00:00Z: any clock and datetime can show it
MAX_PATH_BYTES = 4096  # --output, --error, --chdir, the script's path (Linux's PATH_MAX)
MAX_SCRIPT_BYTES = 4 << 20
MAX_ENV_BYTES = 1 << 20  # the whole environment, K=V entries counted in UTF-8 bytes
MAX_ARGS = 4096
MAX_ARGS_BYTES = 1 << 20
MAX_ARG_STRLEN = 128 << 10  # Linux's limit on one argument or one K=V (NUL included)
MAX_DEPENDENCIES = 1000
MAX_NICE = 10_000
MAX_ARRAY_TEXT = 1 << 20  # an array spec's text (the store keeps unstarted tasks this way)
_NAME_RE = re.compile(r"[A-Za-z0-9_.+@=:,-]{1,128}")
_QOS_RE = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_DIGITS_RE = re.compile(r"[0-9]+")


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
            _check_range("--gpu-mem", self.gpu_mem, 1, MAX_GPU_MEM, "must be from 1 byte to 1P")
            if self.gpus == 0:
                raise InvalidInput("--gpu-mem", self.gpu_mem, "needs --gpus of at least 1")
        if self.mem is not None:
            _check_range("--mem", self.mem, 1, MAX_MEM, "must be from 1 byte to 1024P")
        if self.time_limit is not None:
            _check_range(
                "--time", self.time_limit, 1, MAX_TIME_LIMIT, "must be from 1 second to 366 days"
            )


def _check_range(name: str, value: int, low: int, high: int, problem: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(
            name, _shown(value), problem or f"must be a whole number from {low} to {high}"
        )


def _shown(value: object) -> object:
    """`value` as an error message may show it: long text cut, huge numbers summarised (the
    message must stay one short line; repr() of an int of 4,300+ digits even raises)."""
    if isinstance(value, str) and len(value) > 80:
        return f"{value[:60]}... ({len(value)} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"a number of about {int(abs(value).bit_length() * 0.30103) + 1} digits"
    return value


def _number(digits: str, limit: int) -> int | None:
    """The value of ASCII `digits`, or None when it is above `limit` (decided before int()
    meets thousands of digits)."""
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(limit)):
        return None
    value = int(significant)
    return value if value <= limit else None


def _check_text(name: str, value: object, limit: int) -> None:
    """Text that can travel (UTF-8) and be shown: at most `limit` bytes, no NUL, no control
    characters (newlines, terminal escapes)."""
    if not isinstance(value, str):
        raise InvalidInput(name, _shown(value), "must be text")
    if len(value) > limit:
        raise InvalidInput(name, _shown(value), f"is longer than {limit} bytes")
    if "\0" in value:
        raise InvalidInput(name, _shown(value), "contains a NUL byte")
    if bad := _CONTROL_RE.search(value):
        raise InvalidInput(name, _shown(value), f"contains the control character {bad[0]!r}")
    if not value.isascii():
        try:
            size = len(value.encode())
        except UnicodeEncodeError:
            raise InvalidInput(name, _shown(value), "is not valid UTF-8 text") from None
        if size > limit:
            raise InvalidInput(name, _shown(value), f"is longer than {limit} bytes")


class DependencyKind(StrEnum):
    OK = "ok"  # start after the job completed with exit code 0 (SLURM afterok)
    ANY = "any"  # start after the job ended in any way (afterany)
    NOTOK = "notok"  # start after the job ended in failure of any kind (afternotok)


@dataclass(frozen=True, slots=True)
class Dependency:
    """Start after `job_id` (every task, when it is an array) or after one task of it."""

    job_id: int
    kind: DependencyKind = DependencyKind.OK
    task: int | None = None  # `--after 40_3`: task 3 of array 40

    def __post_init__(self) -> None:
        _check_range("--after", self.job_id, 1, MAX_JOB_ID)
        if self.task is not None:
            _check_range("--after task", self.task, 0, MAX_ARRAY_INDEX)

    @property
    def display(self) -> str:
        return f"{self.job_id}_{self.task}" if self.task is not None else str(self.job_id)

    @classmethod
    def parse(cls, text: str) -> Dependency:
        """One dependency: `JOB[:ok|any|notok]` (`123`, `40_3:any`) or SLURM's `afterok:JOB`,
        `afterany:JOB`, `afternotok:JOB`; JOB is `N` or `N_T` (task T of array N).

        SLURM's lists (`afterok:12:13,afterany:14`) and `singleton` are split by
        gpuq.submission.parse_dependencies; start-based `after:` and `?` (any of) are refused.
        """
        raw = text.strip() if isinstance(text, str) else ""
        if not raw:
            raise InvalidInput("--after", text, "expected JOB[:ok|any|notok]")
        if len(raw) > 200:
            raise InvalidInput("--after", _shown(text), "expected JOB[:ok|any|notok]")
        if "?" in raw:
            raise InvalidInput("--after", text, _NO_EITHER)
        if "," in raw:
            raise InvalidInput("--after", text, "one dependency here; give --after again")
        head, _, rest = raw.partition(":")
        word = head.lower()
        if word[:1].isalpha():
            kind = _SLURM_KINDS.get(word)
            if kind is None:
                raise InvalidInput("--after", text, _unsupported_kind(word))
            if not rest or ":" in rest:
                raise InvalidInput("--after", text, f"expected {word}:JOB")
            job_text = rest
        else:
            job_text = head
            try:
                kind = DependencyKind((rest or "ok").lower())
            except ValueError:
                raise InvalidInput(
                    "--after", text, "the kind must be ok, any or notok (JOB[:ok|any|notok])"
                ) from None
        job_id, task = parse_job_ref(job_text, "--after")
        return cls(job_id, kind, task)


_SLURM_KINDS = {
    "afterok": DependencyKind.OK,
    "afterany": DependencyKind.ANY,
    "afternotok": DependencyKind.NOTOK,
}
_NO_EITHER = (
    "'?' (any one of several) is not supported: a job waits for all its dependencies "
    "(separate them with ',')"
)


def _unsupported_kind(word: str) -> str:
    supported = "use JOB[:ok|any|notok], afterok:JOB, afterany:JOB, afternotok:JOB or singleton"
    if word == "after":
        return f"after: (start once JOB has started) is not supported; {supported}"
    if word in ("aftercorr", "afterburstbuffer", "expand"):
        return f"{word} is not supported; {supported}"
    if word == "singleton":
        return "singleton stands alone (or use --singleton)"
    return f"unknown dependency type {word!r}; {supported}"


_JOB_REF_RE = re.compile(r"([0-9]+)(?:_([0-9]+))?")


def parse_job_ref(text: str, field_name: str = "job id") -> tuple[int, int | None]:
    """A job as a user types it: `42` -> (42, None), `40_3` (task 3 of array 40) -> (40, 3).

    Decimal ASCII digits only (int() would also take `5_0`, ` 5`, `+5` or other scripts'
    digits, none of which is an id); job ids from 1 to MAX_JOB_ID, tasks from 0 to
    MAX_ARRAY_INDEX. Anything else raises InvalidInput(field_name, ...).
    """
    match = _JOB_REF_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidInput(
            field_name, _shown(text), "expected a job id such as 42, or 42_3 for task 3 of array 42"
        )
    job_id = _number(match[1], MAX_JOB_ID)
    if job_id is None or job_id < 1:
        raise InvalidInput(field_name, _shown(text), f"job ids go from 1 to {MAX_JOB_ID}")
    if match[2] is None:
        return job_id, None
    task = _number(match[2], MAX_ARRAY_INDEX)
    if task is None:
        raise InvalidInput(field_name, _shown(text), f"task ids go from 0 to {MAX_ARRAY_INDEX}")
    return job_id, task


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """Task indices and how many may run at once (SLURM's `0-99%8`)."""

    indices: tuple[int, ...]
    max_running: int | None = None

    def __post_init__(self) -> None:
        indices = self.indices
        if not isinstance(indices, tuple) or not indices:
            raise InvalidInput("--array", _shown(str(indices)), "has no tasks")
        if len(indices) > MAX_ARRAY_TASKS:
            raise InvalidInput(
                "--array", f"{len(indices)} tasks", f"more than {MAX_ARRAY_TASKS} tasks"
            )
        if any(type(index) is not int for index in indices):
            raise InvalidInput("--array", _shown(str(indices)), "task indices are whole numbers")
        low, high = min(indices), max(indices)
        if low < 0 or high > MAX_ARRAY_INDEX:
            raise InvalidInput(
                "--array", _shown(high if high > MAX_ARRAY_INDEX else low), _INDEX_RANGE
            )
        if len(set(indices)) != len(indices):
            raise InvalidInput("--array", _shown(str(indices)), "repeats a task index")
        if self.max_running is not None:
            _check_range(
                "--array limit",
                self.max_running,
                1,
                MAX_ARRAY_TASKS,
                f"the %N limit must be from 1 to {MAX_ARRAY_TASKS}",
            )

    @classmethod
    def parse(cls, text: str) -> ArraySpec:
        """`0-99`, `0-99%8`, `1,3,5-7`, `0-15:4` (step 4). Bounds are checked on the text,
        before any range is built: `0-99999999999` is refused at once."""
        raw = text.strip() if isinstance(text, str) else ""
        if len(raw) > MAX_ARRAY_TEXT:
            raise InvalidInput("--array", _shown(raw), f"is longer than {MAX_ARRAY_TEXT} bytes")
        body, percent, limit_text = raw.partition("%")
        indices: set[int] = set()
        for part in body.split(","):
            match = _ARRAY_PART_RE.fullmatch(part)
            if match is None:
                raise InvalidInput("--array", _shown(text), _ARRAY_FORMS)
            low = _array_index(match[1], text)
            high = _array_index(match[2], text) if match[2] else low
            step = _number(match[3], MAX_ARRAY_INDEX) if match[3] else 1
            if step == 0:
                raise InvalidInput("--array", _shown(text), "a step must be at least 1")
            if step is None:  # a step beyond any index: the range's first task only
                step = MAX_ARRAY_INDEX + 1
            if high < low:
                raise InvalidInput("--array", _shown(text), f"the range {part} goes down")
            if (high - low) // step >= MAX_ARRAY_TASKS:
                raise InvalidInput("--array", _shown(text), f"more than {MAX_ARRAY_TASKS} tasks")
            indices.update(range(low, high + 1, step))
            if len(indices) > MAX_ARRAY_TASKS:
                raise InvalidInput("--array", _shown(text), f"more than {MAX_ARRAY_TASKS} tasks")
        max_running = None
        if percent:
            if not _DIGITS_RE.fullmatch(limit_text):
                raise InvalidInput("--array", _shown(text), _ARRAY_FORMS)
            max_running = _number(limit_text, MAX_ARRAY_TASKS)
            if not max_running:  # %0, or above the bound
                raise InvalidInput(
                    "--array", _shown(text), f"the %N limit must be from 1 to {MAX_ARRAY_TASKS}"
                )
        return cls(tuple(sorted(indices)), max_running)


_ARRAY_PART_RE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")
_ARRAY_FORMS = "expected e.g. 0-99, 1,3,5-7, 0-15:4 or 0-99%8"
_INDEX_RANGE = f"task indices go from 0 to {MAX_ARRAY_INDEX}"


def _array_index(digits: str, text: str) -> int:
    index = _number(digits, MAX_ARRAY_INDEX)
    if index is None:
        raise InvalidInput("--array", _shown(text), _INDEX_RANGE)
    return index


def format_indices(indices: tuple[int, ...] | list[int]) -> str:
    """Sorted task indices in ArraySpec.parse's notation, runs collapsed: `0-99`, `1,3,5-7`,
    `0-96:4`; the exact inverse of parsing, so a record's tasks can be stored as this text."""
    parts: list[str] = []
    i, n = 0, len(indices)
    while i < n:
        start = indices[i]
        if i + 1 == n:
            parts.append(str(start))
            break
        step = indices[i + 1] - start
        j = i + 1
        while j + 1 < n and indices[j + 1] - indices[j] == step:
            j += 1
        if j - i >= 2 or step == 1:
            parts.append(f"{start}-{indices[j]}" + (f":{step}" if step != 1 else ""))
            i = j + 1
        else:
            parts.append(str(start))
            i += 1
    return ",".join(parts)


def parse_indices(text: str) -> tuple[int, ...]:
    """The inverse of format_indices (trusted text from the store)."""
    return ArraySpec.parse(text).indices if text else ()


@dataclass(frozen=True, slots=True)
class WarningSignal:
    """`--signal SIG@SECONDS`: sent that long before a time limit or a preemption's kill."""

    signal: int = int(signal_module.SIGTERM)
    seconds: int = 0

    def __post_init__(self) -> None:
        _check_range("--signal", self.signal, 1, 64, "signal numbers go from 1 to 64")
        if self.signal not in _SIGNALS:
            raise InvalidInput("--signal", self.signal, "not a signal number")
        if self.signal in _NO_WARNING:
            raise InvalidInput("--signal", self.signal, _NO_WARNING[self.signal])
        _check_range(
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
        if at and not _DIGITS_RE.fullmatch(seconds):
            raise InvalidInput("--signal", _shown(text), "expected SIG or SIG@SECONDS")
        number = _number(seconds, MAX_TIME_LIMIT) if at else 0
        if number is None:
            raise InvalidInput(
                "--signal",
                _shown(text),
                f"the warning time must be from 0 to {MAX_TIME_LIMIT} seconds (366 days)",
            )
        if sig in _NO_WARNING:
            raise InvalidInput("--signal", _shown(text), _NO_WARNING[sig])
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
    if _DIGITS_RE.fullmatch(raw):
        number = _number(raw, 64)
        if number is None or number not in _SIGNALS:
            raise InvalidInput(field_name, _shown(text), "not a signal number (1 to 64)")
        return number
    if not _SIGNAL_NAME_RE.fullmatch(raw):
        raise InvalidInput(field_name, _shown(text), "not a signal name, e.g. USR1 or TERM")
    name = raw if raw.startswith("SIG") else f"SIG{raw}"
    try:
        return int(signal_module.Signals[name])
    except KeyError:
        raise InvalidInput(field_name, text, "not a signal name, e.g. USR1 or TERM") from None


def check_name(value: str, field_name: str = "--name") -> str:
    """A job name: 1 to 128 ASCII letters, digits or `_ . + @ = : , -`."""
    if isinstance(value, str) and _NAME_RE.fullmatch(value):
        return value
    if not isinstance(value, str) or not value:
        raise InvalidInput(field_name, _shown(value), "is empty")
    if len(value) > 128:
        raise InvalidInput(field_name, _shown(value), "is longer than 128 characters")
    bad = next(c for c in value if not _NAME_RE.fullmatch(c))
    if _CONTROL_RE.fullmatch(bad):
        why = f"contains the control character {bad!r}"
    elif not bad.isascii():
        why = f"contains the non-ASCII character {bad!r}"
    else:
        why = f"contains {bad!r}"
    raise InvalidInput(
        field_name, _shown(value), f"{why}; use 1 to 128 letters, digits or _ . + @ = : , -"
    )


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

    def __post_init__(self) -> None:
        check_name(self.name)
        _check_text("script", self.source, MAX_PATH_BYTES)
        if not isinstance(self.script, str) or len(self.script) > MAX_SCRIPT_BYTES:
            raise InvalidInput(
                "script", self.source or self.name, "is larger than 4 MiB; is it really a script?"
            )
        if not self.script.startswith("#!"):
            raise InvalidInput(
                "script",
                self.source or self.name,
                "the first line must start with #! and an interpreter (or use --wrap)",
            )
        if "\0" in self.script:
            raise InvalidInput("script", self.source or self.name, "contains a NUL byte")
        _check_text("workdir", self.workdir, MAX_PATH_BYTES)
        if not self.workdir.startswith("/"):
            raise InvalidInput("workdir", self.workdir, "must be an absolute path")
        _check_args(self.args)
        _check_env(self.env)
        if self.qos is not None and not (isinstance(self.qos, str) and _QOS_RE.fullmatch(self.qos)):
            raise InvalidInput("--qos", _shown(self.qos), "use 1 to 64 letters, digits or _ . + -")
        _check_range("--nice", self.nice, -MAX_NICE, MAX_NICE)
        if self.output is not None:
            _check_text("--output", self.output, MAX_PATH_BYTES)
        if self.error is not None:
            _check_text("--error", self.error, MAX_PATH_BYTES)
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
            raise InvalidInput("--begin", _shown(begin), "must be a time from 1970 to 2100")
        if self.umask is not None:
            _check_range("umask", self.umask, 0, 0o777)


def _check_args(args: tuple[str, ...]) -> None:
    if len(args) > MAX_ARGS:
        raise InvalidInput("arguments", f"{len(args)} arguments", f"more than {MAX_ARGS}")
    total = 0
    for arg in args:
        if not isinstance(arg, str):
            raise InvalidInput("argument", _shown(arg), "must be text")
        if "\0" in arg:
            raise InvalidInput("argument", _shown(arg), "contains a NUL byte")
        size = len(arg) + 1
        if not arg.isascii():
            try:
                size = len(arg.encode()) + 1
            except UnicodeEncodeError:
                raise InvalidInput("argument", _shown(arg), "is not valid UTF-8 text") from None
        if size > MAX_ARG_STRLEN:
            raise InvalidInput("argument", _shown(arg), "is longer than 128 KiB (Linux's limit)")
        total += size
    if total > MAX_ARGS_BYTES:
        raise InvalidInput(
            "arguments", f"{len(args)} arguments, {total} bytes", "more than 1 MiB in all"
        )


def _check_env(env: dict[str, str]) -> None:
    """Names without `=` or NUL (exported shell functions such as `BASH_FUNC_x%%` are
    carried, as sbatch does), values without NUL, UTF-8, at most MAX_ENV_BYTES in all."""
    total = 0
    for key, value in env.items():
        if (
            not isinstance(key, str)
            or not isinstance(value, str)
            or not key
            or "=" in key
            or "\0" in key
            or "\0" in value
        ):
            raise InvalidInput("--env", _shown(key), "not a valid environment variable")
        size = len(key) + len(value) + 2
        if not (key.isascii() and value.isascii()):
            try:
                size = len(key.encode()) + len(value.encode()) + 2
            except UnicodeEncodeError:
                raise InvalidInput("--env", _shown(key), "is not valid UTF-8 text") from None
        if size > MAX_ARG_STRLEN:
            raise InvalidInput(
                "--env", _shown(key), "K=V is longer than 128 KiB (Linux's limit for a variable)"
            )
        total += size
    if total > MAX_ENV_BYTES:
        raise InvalidInput(
            "--env",
            f"{len(env)} variables, {total} bytes",
            "the job's environment is larger than 1 MiB",
        )


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
    # an array's record stands for its tasks that have not been split off to run on their own
    # (SLURM keeps one record until tasks start); () for a single job or a split task
    tasks: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name

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
    array: tuple[int, int | str] | None = None,
) -> tuple[str, str]:
    """The job's stdout and stderr files, with sbatch's `%` patterns filled in (for an array's
    record of tasks not yet started, `array` is (id, "%a"): each task's files differ).

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
