from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Resources(_message.Message):
    __slots__ = ("gpus", "gpu_mem", "cpus", "mem", "time_limit", "mig", "gpu_share", "gpu_type", "nodes", "tasks_per_node", "gpus_per_task", "exclusive", "mem_all", "explicit_tasks")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_MEM_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEM_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_FIELD_NUMBER: _ClassVar[int]
    MIG_FIELD_NUMBER: _ClassVar[int]
    GPU_SHARE_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    TASKS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_TASK_FIELD_NUMBER: _ClassVar[int]
    EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    MEM_ALL_FIELD_NUMBER: _ClassVar[int]
    EXPLICIT_TASKS_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    gpu_mem: int
    cpus: int
    mem: int
    time_limit: int
    mig: str
    gpu_share: int
    gpu_type: str
    nodes: int
    tasks_per_node: int
    gpus_per_task: int
    exclusive: bool
    mem_all: bool
    explicit_tasks: bool
    def __init__(self, gpus: _Optional[int] = ..., gpu_mem: _Optional[int] = ..., cpus: _Optional[int] = ..., mem: _Optional[int] = ..., time_limit: _Optional[int] = ..., mig: _Optional[str] = ..., gpu_share: _Optional[int] = ..., gpu_type: _Optional[str] = ..., nodes: _Optional[int] = ..., tasks_per_node: _Optional[int] = ..., gpus_per_task: _Optional[int] = ..., exclusive: _Optional[bool] = ..., mem_all: _Optional[bool] = ..., explicit_tasks: _Optional[bool] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("nodelist", "exclude", "constraint", "partitions")
    NODELIST_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    nodelist: _containers.RepeatedScalarFieldContainer[str]
    exclude: _containers.RepeatedScalarFieldContainer[str]
    constraint: str
    partitions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, nodelist: _Optional[_Iterable[str]] = ..., exclude: _Optional[_Iterable[str]] = ..., constraint: _Optional[str] = ..., partitions: _Optional[_Iterable[str]] = ...) -> None: ...

class Terminal(_message.Message):
    __slots__ = ("rows", "cols", "term", "stdin_tty", "stdout_tty")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    STDIN_TTY_FIELD_NUMBER: _ClassVar[int]
    STDOUT_TTY_FIELD_NUMBER: _ClassVar[int]
    rows: int
    cols: int
    term: str
    stdin_tty: bool
    stdout_tty: bool
    def __init__(self, rows: _Optional[int] = ..., cols: _Optional[int] = ..., term: _Optional[str] = ..., stdin_tty: _Optional[bool] = ..., stdout_tty: _Optional[bool] = ...) -> None: ...

class Dependency(_message.Message):
    __slots__ = ("job_id", "kind", "task")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    kind: str
    task: int
    def __init__(self, job_id: _Optional[int] = ..., kind: _Optional[str] = ..., task: _Optional[int] = ...) -> None: ...

class ArraySpec(_message.Message):
    __slots__ = ("indices", "max_running")
    INDICES_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    max_running: int
    def __init__(self, indices: _Optional[_Iterable[int]] = ..., max_running: _Optional[int] = ...) -> None: ...

class WarningSignal(_message.Message):
    __slots__ = ("signal", "seconds")
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    signal: int
    seconds: int
    def __init__(self, signal: _Optional[int] = ..., seconds: _Optional[int] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "script", "args", "workdir", "env", "resources", "qos", "nice", "output", "error", "array", "dependencies", "hold", "begin_time", "signal", "no_requeue", "singleton", "source", "umask", "placement", "terminal", "mail_types", "mail_user", "notify_url")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCRIPT_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    NICE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ARRAY_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCIES_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    BEGIN_TIME_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    NO_REQUEUE_FIELD_NUMBER: _ClassVar[int]
    SINGLETON_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    UMASK_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_FIELD_NUMBER: _ClassVar[int]
    MAIL_TYPES_FIELD_NUMBER: _ClassVar[int]
    MAIL_USER_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_URL_FIELD_NUMBER: _ClassVar[int]
    name: str
    script: str
    args: _containers.RepeatedScalarFieldContainer[str]
    workdir: str
    env: _containers.ScalarMap[str, str]
    resources: Resources
    qos: str
    nice: int
    output: str
    error: str
    array: ArraySpec
    dependencies: _containers.RepeatedCompositeFieldContainer[Dependency]
    hold: bool
    begin_time: float
    signal: WarningSignal
    no_requeue: bool
    singleton: bool
    source: str
    umask: int
    placement: Placement
    terminal: Terminal
    mail_types: _containers.RepeatedScalarFieldContainer[str]
    mail_user: str
    notify_url: str
    def __init__(self, name: _Optional[str] = ..., script: _Optional[str] = ..., args: _Optional[_Iterable[str]] = ..., workdir: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., qos: _Optional[str] = ..., nice: _Optional[int] = ..., output: _Optional[str] = ..., error: _Optional[str] = ..., array: _Optional[_Union[ArraySpec, _Mapping]] = ..., dependencies: _Optional[_Iterable[_Union[Dependency, _Mapping]]] = ..., hold: _Optional[bool] = ..., begin_time: _Optional[float] = ..., signal: _Optional[_Union[WarningSignal, _Mapping]] = ..., no_requeue: _Optional[bool] = ..., singleton: _Optional[bool] = ..., source: _Optional[str] = ..., umask: _Optional[int] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ..., terminal: _Optional[_Union[Terminal, _Mapping]] = ..., mail_types: _Optional[_Iterable[str]] = ..., mail_user: _Optional[str] = ..., notify_url: _Optional[str] = ...) -> None: ...

class JobResult(_message.Message):
    __slots__ = ("exit_code", "signal", "reason")
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    exit_code: int
    signal: int
    reason: str
    def __init__(self, exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class PriorityFactor(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: float
    def __init__(self, name: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...

class PendingInfo(_message.Message):
    __slots__ = ("reasons", "estimated_start", "priority", "factors")
    REASONS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_START_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    FACTORS_FIELD_NUMBER: _ClassVar[int]
    reasons: _containers.RepeatedScalarFieldContainer[str]
    estimated_start: float
    priority: float
    factors: _containers.RepeatedCompositeFieldContainer[PriorityFactor]
    def __init__(self, reasons: _Optional[_Iterable[str]] = ..., estimated_start: _Optional[float] = ..., priority: _Optional[float] = ..., factors: _Optional[_Iterable[_Union[PriorityFactor, _Mapping]]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "spec", "user", "state", "submit_time", "start_time", "end_time", "node", "gpus", "result", "requeue_count", "array_job_id", "array_task_id", "reason", "pending", "stdout_path", "stderr_path", "priority", "qos", "stop_reason", "stop_state", "array_tasks", "start_count", "telemetry", "gpu_enforcement", "flags", "nodes", "progress")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    REQUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    ARRAY_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ARRAY_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    STDOUT_PATH_FIELD_NUMBER: _ClassVar[int]
    STDERR_PATH_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_STATE_FIELD_NUMBER: _ClassVar[int]
    ARRAY_TASKS_FIELD_NUMBER: _ClassVar[int]
    START_COUNT_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    GPU_ENFORCEMENT_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    id: int
    spec: JobSpec
    user: str
    state: str
    submit_time: float
    start_time: float
    end_time: float
    node: str
    gpus: _containers.RepeatedScalarFieldContainer[str]
    result: JobResult
    requeue_count: int
    array_job_id: int
    array_task_id: int
    reason: str
    pending: PendingInfo
    stdout_path: str
    stderr_path: str
    priority: int
    qos: str
    stop_reason: str
    stop_state: str
    array_tasks: str
    start_count: int
    telemetry: GpuTelemetry
    gpu_enforcement: str
    flags: _containers.RepeatedScalarFieldContainer[str]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    progress: JobThroughput
    def __init__(self, id: _Optional[int] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., user: _Optional[str] = ..., state: _Optional[str] = ..., submit_time: _Optional[float] = ..., start_time: _Optional[float] = ..., end_time: _Optional[float] = ..., node: _Optional[str] = ..., gpus: _Optional[_Iterable[str]] = ..., result: _Optional[_Union[JobResult, _Mapping]] = ..., requeue_count: _Optional[int] = ..., array_job_id: _Optional[int] = ..., array_task_id: _Optional[int] = ..., reason: _Optional[str] = ..., pending: _Optional[_Union[PendingInfo, _Mapping]] = ..., stdout_path: _Optional[str] = ..., stderr_path: _Optional[str] = ..., priority: _Optional[int] = ..., qos: _Optional[str] = ..., stop_reason: _Optional[str] = ..., stop_state: _Optional[str] = ..., array_tasks: _Optional[str] = ..., start_count: _Optional[int] = ..., telemetry: _Optional[_Union[GpuTelemetry, _Mapping]] = ..., gpu_enforcement: _Optional[str] = ..., flags: _Optional[_Iterable[str]] = ..., nodes: _Optional[_Iterable[str]] = ..., progress: _Optional[_Union[JobThroughput, _Mapping]] = ...) -> None: ...

class JobThroughput(_message.Message):
    __slots__ = ("done", "total", "fraction", "unit", "label", "source", "rate", "eta", "read_at", "collapse")
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    ETA_FIELD_NUMBER: _ClassVar[int]
    READ_AT_FIELD_NUMBER: _ClassVar[int]
    COLLAPSE_FIELD_NUMBER: _ClassVar[int]
    done: float
    total: float
    fraction: float
    unit: str
    label: str
    source: str
    rate: float
    eta: float
    read_at: float
    collapse: str
    def __init__(self, done: _Optional[float] = ..., total: _Optional[float] = ..., fraction: _Optional[float] = ..., unit: _Optional[str] = ..., label: _Optional[str] = ..., source: _Optional[str] = ..., rate: _Optional[float] = ..., eta: _Optional[float] = ..., read_at: _Optional[float] = ..., collapse: _Optional[str] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("job_id", "at", "from_state", "to_state", "reason", "cause")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    at: float
    from_state: str
    to_state: str
    reason: str
    cause: str
    def __init__(self, job_id: _Optional[int] = ..., at: _Optional[float] = ..., from_state: _Optional[str] = ..., to_state: _Optional[str] = ..., reason: _Optional[str] = ..., cause: _Optional[str] = ...) -> None: ...

class GpuUnit(_message.Message):
    __slots__ = ("uuid", "index", "name", "memory", "pci_bus_id", "parent_uuid", "mig_profile", "shared")
    UUID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_UUID_FIELD_NUMBER: _ClassVar[int]
    MIG_PROFILE_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    index: int
    name: str
    memory: int
    pci_bus_id: str
    parent_uuid: str
    mig_profile: str
    shared: bool
    def __init__(self, uuid: _Optional[str] = ..., index: _Optional[int] = ..., name: _Optional[str] = ..., memory: _Optional[int] = ..., pci_bus_id: _Optional[str] = ..., parent_uuid: _Optional[str] = ..., mig_profile: _Optional[str] = ..., shared: _Optional[bool] = ...) -> None: ...

class TopologyLink(_message.Message):
    __slots__ = ("a", "b", "distance")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    DISTANCE_FIELD_NUMBER: _ClassVar[int]
    a: str
    b: str
    distance: int
    def __init__(self, a: _Optional[str] = ..., b: _Optional[str] = ..., distance: _Optional[int] = ...) -> None: ...

class GpuUsage(_message.Message):
    __slots__ = ("uuid", "memory_used", "utilization", "job_ids", "health", "health_reason", "notes")
    UUID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    HEALTH_REASON_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    memory_used: int
    utilization: int
    job_ids: _containers.RepeatedScalarFieldContainer[int]
    health: str
    health_reason: str
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, uuid: _Optional[str] = ..., memory_used: _Optional[int] = ..., utilization: _Optional[int] = ..., job_ids: _Optional[_Iterable[int]] = ..., health: _Optional[str] = ..., health_reason: _Optional[str] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...

class GpuTelemetry(_message.Message):
    __slots__ = ("peak_gpu_mem", "util_mean", "util_p95", "energy", "samples", "seconds", "units")
    PEAK_GPU_MEM_FIELD_NUMBER: _ClassVar[int]
    UTIL_MEAN_FIELD_NUMBER: _ClassVar[int]
    UTIL_P95_FIELD_NUMBER: _ClassVar[int]
    ENERGY_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    peak_gpu_mem: int
    util_mean: float
    util_p95: float
    energy: float
    samples: int
    seconds: float
    units: _containers.RepeatedCompositeFieldContainer[UnitTelemetry]
    def __init__(self, peak_gpu_mem: _Optional[int] = ..., util_mean: _Optional[float] = ..., util_p95: _Optional[float] = ..., energy: _Optional[float] = ..., samples: _Optional[int] = ..., seconds: _Optional[float] = ..., units: _Optional[_Iterable[_Union[UnitTelemetry, _Mapping]]] = ...) -> None: ...

class UnitTelemetry(_message.Message):
    __slots__ = ("uuid", "peak_mem", "util_mean", "util_p95", "energy")
    UUID_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEM_FIELD_NUMBER: _ClassVar[int]
    UTIL_MEAN_FIELD_NUMBER: _ClassVar[int]
    UTIL_P95_FIELD_NUMBER: _ClassVar[int]
    ENERGY_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    peak_mem: int
    util_mean: float
    util_p95: float
    energy: float
    def __init__(self, uuid: _Optional[str] = ..., peak_mem: _Optional[int] = ..., util_mean: _Optional[float] = ..., util_p95: _Optional[float] = ..., energy: _Optional[float] = ...) -> None: ...
