from gpuq.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentMessage(_message.Message):
    __slots__ = ("register", "heartbeat", "reports", "pty")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    PTY_FIELD_NUMBER: _ClassVar[int]
    register: Register
    heartbeat: Heartbeat
    reports: _containers.RepeatedCompositeFieldContainer[JobReport]
    pty: _containers.RepeatedCompositeFieldContainer[PtyOutput]
    def __init__(self, register: _Optional[_Union[Register, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., reports: _Optional[_Iterable[_Union[JobReport, _Mapping]]] = ..., pty: _Optional[_Iterable[_Union[PtyOutput, _Mapping]]] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("node", "gpus", "topology", "cpus", "mem", "fake", "version", "jobs", "gpu_problem", "isolation", "driver", "features", "address", "sent", "fence_time")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEM_FIELD_NUMBER: _ClassVar[int]
    FAKE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    GPU_PROBLEM_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SENT_FIELD_NUMBER: _ClassVar[int]
    FENCE_TIME_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpus: _containers.RepeatedCompositeFieldContainer[_types_pb2.GpuUnit]
    topology: _containers.RepeatedCompositeFieldContainer[_types_pb2.TopologyLink]
    cpus: int
    mem: int
    fake: bool
    version: str
    jobs: _containers.RepeatedCompositeFieldContainer[JobReport]
    gpu_problem: str
    isolation: str
    driver: str
    features: _containers.RepeatedScalarFieldContainer[str]
    address: str
    sent: float
    fence_time: float
    def __init__(self, node: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[_types_pb2.GpuUnit, _Mapping]]] = ..., topology: _Optional[_Iterable[_Union[_types_pb2.TopologyLink, _Mapping]]] = ..., cpus: _Optional[int] = ..., mem: _Optional[int] = ..., fake: _Optional[bool] = ..., version: _Optional[str] = ..., jobs: _Optional[_Iterable[_Union[JobReport, _Mapping]]] = ..., gpu_problem: _Optional[str] = ..., isolation: _Optional[str] = ..., driver: _Optional[str] = ..., features: _Optional[_Iterable[str]] = ..., address: _Optional[str] = ..., sent: _Optional[float] = ..., fence_time: _Optional[float] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("at", "usage", "not_accepting", "not_accepting_reason", "jobs", "output_gone", "sent", "isolation", "progress")
    AT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    NOT_ACCEPTING_FIELD_NUMBER: _ClassVar[int]
    NOT_ACCEPTING_REASON_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_GONE_FIELD_NUMBER: _ClassVar[int]
    SENT_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    at: float
    usage: _containers.RepeatedCompositeFieldContainer[_types_pb2.GpuUsage]
    not_accepting: bool
    not_accepting_reason: str
    jobs: _containers.RepeatedCompositeFieldContainer[JobSample]
    output_gone: _containers.RepeatedCompositeFieldContainer[OutputGone]
    sent: float
    isolation: str
    progress: _containers.RepeatedCompositeFieldContainer[JobProgress]
    def __init__(self, at: _Optional[float] = ..., usage: _Optional[_Iterable[_Union[_types_pb2.GpuUsage, _Mapping]]] = ..., not_accepting: _Optional[bool] = ..., not_accepting_reason: _Optional[str] = ..., jobs: _Optional[_Iterable[_Union[JobSample, _Mapping]]] = ..., output_gone: _Optional[_Iterable[_Union[OutputGone, _Mapping]]] = ..., sent: _Optional[float] = ..., isolation: _Optional[str] = ..., progress: _Optional[_Iterable[_Union[JobProgress, _Mapping]]] = ...) -> None: ...

class JobProgress(_message.Message):
    __slots__ = ("job_id", "attempt", "at", "done", "total", "rate", "unit", "source", "label")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    attempt: int
    at: float
    done: float
    total: float
    rate: float
    unit: str
    source: str
    label: str
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., at: _Optional[float] = ..., done: _Optional[float] = ..., total: _Optional[float] = ..., rate: _Optional[float] = ..., unit: _Optional[str] = ..., source: _Optional[str] = ..., label: _Optional[str] = ...) -> None: ...

class OutputGone(_message.Message):
    __slots__ = ("job_id", "attempt", "path", "folder", "replaced")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FOLDER_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    attempt: int
    path: str
    folder: bool
    replaced: bool
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., path: _Optional[str] = ..., folder: _Optional[bool] = ..., replaced: _Optional[bool] = ...) -> None: ...

class JobSample(_message.Message):
    __slots__ = ("job_id", "at", "gpu_mem", "units", "output_bytes", "so_far")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    GPU_MEM_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SO_FAR_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    at: float
    gpu_mem: int
    units: _containers.RepeatedCompositeFieldContainer[UnitSample]
    output_bytes: int
    so_far: _types_pb2.GpuTelemetry
    def __init__(self, job_id: _Optional[int] = ..., at: _Optional[float] = ..., gpu_mem: _Optional[int] = ..., units: _Optional[_Iterable[_Union[UnitSample, _Mapping]]] = ..., output_bytes: _Optional[int] = ..., so_far: _Optional[_Union[_types_pb2.GpuTelemetry, _Mapping]] = ...) -> None: ...

class UnitSample(_message.Message):
    __slots__ = ("uuid", "util", "memory")
    UUID_FIELD_NUMBER: _ClassVar[int]
    UTIL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    util: float
    memory: int
    def __init__(self, uuid: _Optional[str] = ..., util: _Optional[float] = ..., memory: _Optional[int] = ...) -> None: ...

class JobReport(_message.Message):
    __slots__ = ("job_id", "kind", "end_state", "result", "at", "peak_mem", "peak_gpu_mem", "attempt", "telemetry", "output_tail")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[JobReport.Kind]
        RUNNING: _ClassVar[JobReport.Kind]
        ENDED: _ClassVar[JobReport.Kind]
        NOT_STARTED: _ClassVar[JobReport.Kind]
    KIND_UNSPECIFIED: JobReport.Kind
    RUNNING: JobReport.Kind
    ENDED: JobReport.Kind
    NOT_STARTED: JobReport.Kind
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    END_STATE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEM_FIELD_NUMBER: _ClassVar[int]
    PEAK_GPU_MEM_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TAIL_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    kind: JobReport.Kind
    end_state: str
    result: _types_pb2.JobResult
    at: float
    peak_mem: int
    peak_gpu_mem: int
    attempt: int
    telemetry: _types_pb2.GpuTelemetry
    output_tail: bytes
    def __init__(self, job_id: _Optional[int] = ..., kind: _Optional[_Union[JobReport.Kind, str]] = ..., end_state: _Optional[str] = ..., result: _Optional[_Union[_types_pb2.JobResult, _Mapping]] = ..., at: _Optional[float] = ..., peak_mem: _Optional[int] = ..., peak_gpu_mem: _Optional[int] = ..., attempt: _Optional[int] = ..., telemetry: _Optional[_Union[_types_pb2.GpuTelemetry, _Mapping]] = ..., output_tail: _Optional[bytes] = ...) -> None: ...

class CoordinatorMessage(_message.Message):
    __slots__ = ("registered", "start", "stop", "signal", "ack", "pty", "seen")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    PTY_FIELD_NUMBER: _ClassVar[int]
    SEEN_FIELD_NUMBER: _ClassVar[int]
    registered: Registered
    start: _containers.RepeatedCompositeFieldContainer[JobLaunch]
    stop: _containers.RepeatedCompositeFieldContainer[StopJob]
    signal: _containers.RepeatedCompositeFieldContainer[SignalJob]
    ack: _containers.RepeatedScalarFieldContainer[int]
    pty: _containers.RepeatedCompositeFieldContainer[PtyInput]
    seen: float
    def __init__(self, registered: _Optional[_Union[Registered, _Mapping]] = ..., start: _Optional[_Iterable[_Union[JobLaunch, _Mapping]]] = ..., stop: _Optional[_Iterable[_Union[StopJob, _Mapping]]] = ..., signal: _Optional[_Iterable[_Union[SignalJob, _Mapping]]] = ..., ack: _Optional[_Iterable[int]] = ..., pty: _Optional[_Iterable[_Union[PtyInput, _Mapping]]] = ..., seen: _Optional[float] = ...) -> None: ...

class Registered(_message.Message):
    __slots__ = ("heartbeat_interval", "node_timeout")
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    NODE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval: float
    node_timeout: float
    def __init__(self, heartbeat_interval: _Optional[float] = ..., node_timeout: _Optional[float] = ...) -> None: ...

class JobLaunch(_message.Message):
    __slots__ = ("job_id", "spec", "gpus", "user", "array_job_id", "array_task_id", "time_limit", "kill_grace", "requeue_count", "attempt", "nodes", "node_addrs", "node_index", "master_port", "step_key", "max_output")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ARRAY_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ARRAY_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_FIELD_NUMBER: _ClassVar[int]
    KILL_GRACE_FIELD_NUMBER: _ClassVar[int]
    REQUEUE_COUNT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    NODE_ADDRS_FIELD_NUMBER: _ClassVar[int]
    NODE_INDEX_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    spec: _types_pb2.JobSpec
    gpus: _containers.RepeatedScalarFieldContainer[str]
    user: str
    array_job_id: int
    array_task_id: int
    time_limit: int
    kill_grace: float
    requeue_count: int
    attempt: int
    nodes: _containers.RepeatedScalarFieldContainer[str]
    node_addrs: _containers.RepeatedScalarFieldContainer[str]
    node_index: int
    master_port: int
    step_key: str
    max_output: int
    def __init__(self, job_id: _Optional[int] = ..., spec: _Optional[_Union[_types_pb2.JobSpec, _Mapping]] = ..., gpus: _Optional[_Iterable[str]] = ..., user: _Optional[str] = ..., array_job_id: _Optional[int] = ..., array_task_id: _Optional[int] = ..., time_limit: _Optional[int] = ..., kill_grace: _Optional[float] = ..., requeue_count: _Optional[int] = ..., attempt: _Optional[int] = ..., nodes: _Optional[_Iterable[str]] = ..., node_addrs: _Optional[_Iterable[str]] = ..., node_index: _Optional[int] = ..., master_port: _Optional[int] = ..., step_key: _Optional[str] = ..., max_output: _Optional[int] = ...) -> None: ...

class StopJob(_message.Message):
    __slots__ = ("job_id", "end_state", "reason", "grace", "signal", "attempt")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    END_STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GRACE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    end_state: str
    reason: str
    grace: float
    signal: int
    attempt: int
    def __init__(self, job_id: _Optional[int] = ..., end_state: _Optional[str] = ..., reason: _Optional[str] = ..., grace: _Optional[float] = ..., signal: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class SignalJob(_message.Message):
    __slots__ = ("job_id", "signal")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    signal: int
    def __init__(self, job_id: _Optional[int] = ..., signal: _Optional[int] = ...) -> None: ...

class PtyInput(_message.Message):
    __slots__ = ("job_id", "attempt", "data", "rows", "cols", "eof", "pause", "resume")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    PAUSE_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    attempt: int
    data: bytes
    rows: int
    cols: int
    eof: bool
    pause: bool
    resume: bool
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., data: _Optional[bytes] = ..., rows: _Optional[int] = ..., cols: _Optional[int] = ..., eof: _Optional[bool] = ..., pause: _Optional[bool] = ..., resume: _Optional[bool] = ...) -> None: ...

class PtyOutput(_message.Message):
    __slots__ = ("job_id", "attempt", "data", "closed", "problem")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    attempt: int
    data: bytes
    closed: bool
    problem: str
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., data: _Optional[bytes] = ..., closed: _Optional[bool] = ..., problem: _Optional[str] = ...) -> None: ...
