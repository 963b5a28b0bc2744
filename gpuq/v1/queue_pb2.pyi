from gpuq.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WebLoginRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WebLoginReply(_message.Message):
    __slots__ = ("url", "expires")
    URL_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_FIELD_NUMBER: _ClassVar[int]
    url: str
    expires: float
    def __init__(self, url: _Optional[str] = ..., expires: _Optional[float] = ...) -> None: ...

class UpdateRequest(_message.Message):
    __slots__ = ("job_ids", "time_limit", "qos", "nice", "set_dependencies", "dependencies", "hold", "name", "set_begin_time", "begin_time", "gpus", "gpu_type", "cpus", "mem", "gpu_mem", "set_nodelist", "nodelist", "set_exclude", "exclude", "constraint")
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    NICE_FIELD_NUMBER: _ClassVar[int]
    SET_DEPENDENCIES_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCIES_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SET_BEGIN_TIME_FIELD_NUMBER: _ClassVar[int]
    BEGIN_TIME_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEM_FIELD_NUMBER: _ClassVar[int]
    GPU_MEM_FIELD_NUMBER: _ClassVar[int]
    SET_NODELIST_FIELD_NUMBER: _ClassVar[int]
    NODELIST_FIELD_NUMBER: _ClassVar[int]
    SET_EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    time_limit: int
    qos: str
    nice: int
    set_dependencies: bool
    dependencies: _containers.RepeatedCompositeFieldContainer[_types_pb2.Dependency]
    hold: bool
    name: str
    set_begin_time: bool
    begin_time: float
    gpus: int
    gpu_type: str
    cpus: int
    mem: int
    gpu_mem: int
    set_nodelist: bool
    nodelist: _containers.RepeatedScalarFieldContainer[str]
    set_exclude: bool
    exclude: _containers.RepeatedScalarFieldContainer[str]
    constraint: str
    def __init__(self, job_ids: _Optional[_Iterable[str]] = ..., time_limit: _Optional[int] = ..., qos: _Optional[str] = ..., nice: _Optional[int] = ..., set_dependencies: _Optional[bool] = ..., dependencies: _Optional[_Iterable[_Union[_types_pb2.Dependency, _Mapping]]] = ..., hold: _Optional[bool] = ..., name: _Optional[str] = ..., set_begin_time: _Optional[bool] = ..., begin_time: _Optional[float] = ..., gpus: _Optional[int] = ..., gpu_type: _Optional[str] = ..., cpus: _Optional[int] = ..., mem: _Optional[int] = ..., gpu_mem: _Optional[int] = ..., set_nodelist: _Optional[bool] = ..., nodelist: _Optional[_Iterable[str]] = ..., set_exclude: _Optional[bool] = ..., exclude: _Optional[_Iterable[str]] = ..., constraint: _Optional[str] = ...) -> None: ...

class AttachRequest(_message.Message):
    __slots__ = ("job_id", "input", "rows", "cols", "signal", "eof")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    input: bytes
    rows: int
    cols: int
    signal: int
    eof: bool
    def __init__(self, job_id: _Optional[int] = ..., input: _Optional[bytes] = ..., rows: _Optional[int] = ..., cols: _Optional[int] = ..., signal: _Optional[int] = ..., eof: _Optional[bool] = ...) -> None: ...

class AttachReply(_message.Message):
    __slots__ = ("state", "reason", "output", "node", "ended", "result")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    state: str
    reason: str
    output: bytes
    node: str
    ended: bool
    result: _types_pb2.JobResult
    def __init__(self, state: _Optional[str] = ..., reason: _Optional[str] = ..., output: _Optional[bytes] = ..., node: _Optional[str] = ..., ended: _Optional[bool] = ..., result: _Optional[_Union[_types_pb2.JobResult, _Mapping]] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("user", "since", "advice", "job_id")
    USER_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    ADVICE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    user: str
    since: float
    advice: bool
    job_id: int
    def __init__(self, user: _Optional[str] = ..., since: _Optional[float] = ..., advice: _Optional[bool] = ..., job_id: _Optional[int] = ...) -> None: ...

class SizingAdvice(_message.Message):
    __slots__ = ("user", "name", "jobs", "measured", "asked_gpu_mem", "peak_gpu_mem", "peak_gpu_mem_p95", "card_mem", "util_p95", "asked_time", "completed", "run_p95", "timeouts", "gpu_mem", "mig", "gpu_share", "time", "suggestions")
    USER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    ASKED_GPU_MEM_FIELD_NUMBER: _ClassVar[int]
    PEAK_GPU_MEM_FIELD_NUMBER: _ClassVar[int]
    PEAK_GPU_MEM_P95_FIELD_NUMBER: _ClassVar[int]
    CARD_MEM_FIELD_NUMBER: _ClassVar[int]
    UTIL_P95_FIELD_NUMBER: _ClassVar[int]
    ASKED_TIME_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    RUN_P95_FIELD_NUMBER: _ClassVar[int]
    TIMEOUTS_FIELD_NUMBER: _ClassVar[int]
    GPU_MEM_FIELD_NUMBER: _ClassVar[int]
    MIG_FIELD_NUMBER: _ClassVar[int]
    GPU_SHARE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    SUGGESTIONS_FIELD_NUMBER: _ClassVar[int]
    user: str
    name: str
    jobs: int
    measured: int
    asked_gpu_mem: int
    peak_gpu_mem: int
    peak_gpu_mem_p95: int
    card_mem: int
    util_p95: float
    asked_time: int
    completed: int
    run_p95: float
    timeouts: int
    gpu_mem: int
    mig: str
    gpu_share: int
    time: int
    suggestions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, user: _Optional[str] = ..., name: _Optional[str] = ..., jobs: _Optional[int] = ..., measured: _Optional[int] = ..., asked_gpu_mem: _Optional[int] = ..., peak_gpu_mem: _Optional[int] = ..., peak_gpu_mem_p95: _Optional[int] = ..., card_mem: _Optional[int] = ..., util_p95: _Optional[float] = ..., asked_time: _Optional[int] = ..., completed: _Optional[int] = ..., run_p95: _Optional[float] = ..., timeouts: _Optional[int] = ..., gpu_mem: _Optional[int] = ..., mig: _Optional[str] = ..., gpu_share: _Optional[int] = ..., time: _Optional[int] = ..., suggestions: _Optional[_Iterable[str]] = ...) -> None: ...

class IdleHolder(_message.Message):
    __slots__ = ("user", "gpu_seconds", "util_mean")
    USER_FIELD_NUMBER: _ClassVar[int]
    GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UTIL_MEAN_FIELD_NUMBER: _ClassVar[int]
    user: str
    gpu_seconds: float
    util_mean: float
    def __init__(self, user: _Optional[str] = ..., gpu_seconds: _Optional[float] = ..., util_mean: _Optional[float] = ...) -> None: ...

class JobEfficiency(_message.Message):
    __slots__ = ("job", "time_limit", "card_mem", "verdicts", "mem_peak")
    JOB_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_FIELD_NUMBER: _ClassVar[int]
    CARD_MEM_FIELD_NUMBER: _ClassVar[int]
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    MEM_PEAK_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    time_limit: int
    card_mem: int
    verdicts: _containers.RepeatedScalarFieldContainer[str]
    mem_peak: int
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ..., time_limit: _Optional[int] = ..., card_mem: _Optional[int] = ..., verdicts: _Optional[_Iterable[str]] = ..., mem_peak: _Optional[int] = ...) -> None: ...

class ReportRow(_message.Message):
    __slots__ = ("user", "jobs", "gpu_seconds", "energy", "util_mean", "util_gpu_seconds")
    USER_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ENERGY_FIELD_NUMBER: _ClassVar[int]
    UTIL_MEAN_FIELD_NUMBER: _ClassVar[int]
    UTIL_GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    user: str
    jobs: int
    gpu_seconds: float
    energy: float
    util_mean: float
    util_gpu_seconds: float
    def __init__(self, user: _Optional[str] = ..., jobs: _Optional[int] = ..., gpu_seconds: _Optional[float] = ..., energy: _Optional[float] = ..., util_mean: _Optional[float] = ..., util_gpu_seconds: _Optional[float] = ...) -> None: ...

class ReportReply(_message.Message):
    __slots__ = ("rows", "advice", "idle", "efficiency")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ADVICE_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    EFFICIENCY_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[ReportRow]
    advice: _containers.RepeatedCompositeFieldContainer[SizingAdvice]
    idle: _containers.RepeatedCompositeFieldContainer[IdleHolder]
    efficiency: JobEfficiency
    def __init__(self, rows: _Optional[_Iterable[_Union[ReportRow, _Mapping]]] = ..., advice: _Optional[_Iterable[_Union[SizingAdvice, _Mapping]]] = ..., idle: _Optional[_Iterable[_Union[IdleHolder, _Mapping]]] = ..., efficiency: _Optional[_Union[JobEfficiency, _Mapping]] = ...) -> None: ...

class TokenRequest(_message.Message):
    __slots__ = ("user",)
    USER_FIELD_NUMBER: _ClassVar[int]
    user: str
    def __init__(self, user: _Optional[str] = ...) -> None: ...

class TokenReply(_message.Message):
    __slots__ = ("token", "revoked")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    token: str
    revoked: int
    def __init__(self, token: _Optional[str] = ..., revoked: _Optional[int] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("node", "gpu", "reason")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpu: str
    reason: str
    def __init__(self, node: _Optional[str] = ..., gpu: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DrainReply(_message.Message):
    __slots__ = ("units", "message")
    UNITS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    units: _containers.RepeatedScalarFieldContainer[str]
    message: str
    def __init__(self, units: _Optional[_Iterable[str]] = ..., message: _Optional[str] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("spec", "request_key")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REQUEST_KEY_FIELD_NUMBER: _ClassVar[int]
    spec: _types_pb2.JobSpec
    request_key: str
    def __init__(self, spec: _Optional[_Union[_types_pb2.JobSpec, _Mapping]] = ..., request_key: _Optional[str] = ...) -> None: ...

class SubmitResult(_message.Message):
    __slots__ = ("job_ids", "code", "message", "error_kind")
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[int]
    code: int
    message: str
    error_kind: str
    def __init__(self, job_ids: _Optional[_Iterable[int]] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., error_kind: _Optional[str] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id", "task", "diagnose")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSE_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    task: int
    diagnose: bool
    def __init__(self, job_id: _Optional[int] = ..., task: _Optional[int] = ..., diagnose: _Optional[bool] = ...) -> None: ...

class JobDetail(_message.Message):
    __slots__ = ("job", "events", "array_states", "diagnosis")
    class ArrayStatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    JOB_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ARRAY_STATES_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSIS_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    events: _containers.RepeatedCompositeFieldContainer[_types_pb2.JobEvent]
    array_states: _containers.ScalarMap[str, int]
    diagnosis: Diagnosis
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ..., events: _Optional[_Iterable[_Union[_types_pb2.JobEvent, _Mapping]]] = ..., array_states: _Optional[_Mapping[str, int]] = ..., diagnosis: _Optional[_Union[Diagnosis, _Mapping]] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("name", "title", "evidence", "advice")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    ADVICE_FIELD_NUMBER: _ClassVar[int]
    name: str
    title: str
    evidence: _containers.RepeatedScalarFieldContainer[str]
    advice: str
    def __init__(self, name: _Optional[str] = ..., title: _Optional[str] = ..., evidence: _Optional[_Iterable[str]] = ..., advice: _Optional[str] = ...) -> None: ...

class Diagnosis(_message.Message):
    __slots__ = ("verdicts", "note")
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    verdicts: _containers.RepeatedCompositeFieldContainer[Verdict]
    note: str
    def __init__(self, verdicts: _Optional[_Iterable[_Union[Verdict, _Mapping]]] = ..., note: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("states", "user", "job_ids", "limit", "finished", "array_job_id", "with_pending_info", "expand_arrays", "users", "names", "since", "until", "nodes", "page_size", "page_token")
    STATES_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    ARRAY_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WITH_PENDING_INFO_FIELD_NUMBER: _ClassVar[int]
    EXPAND_ARRAYS_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[str]
    user: str
    job_ids: _containers.RepeatedScalarFieldContainer[int]
    limit: int
    finished: bool
    array_job_id: int
    with_pending_info: bool
    expand_arrays: bool
    users: _containers.RepeatedScalarFieldContainer[str]
    names: _containers.RepeatedScalarFieldContainer[str]
    since: float
    until: float
    nodes: _containers.RepeatedScalarFieldContainer[str]
    page_size: int
    page_token: str
    def __init__(self, states: _Optional[_Iterable[str]] = ..., user: _Optional[str] = ..., job_ids: _Optional[_Iterable[int]] = ..., limit: _Optional[int] = ..., finished: _Optional[bool] = ..., array_job_id: _Optional[int] = ..., with_pending_info: _Optional[bool] = ..., expand_arrays: _Optional[bool] = ..., users: _Optional[_Iterable[str]] = ..., names: _Optional[_Iterable[str]] = ..., since: _Optional[float] = ..., until: _Optional[float] = ..., nodes: _Optional[_Iterable[str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListJobsReply(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_types_pb2.Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[_types_pb2.Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class JobSelection(_message.Message):
    __slots__ = ("job_ids", "reason", "user", "states", "name", "hold")
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    user: str
    states: _containers.RepeatedScalarFieldContainer[str]
    name: str
    hold: bool
    def __init__(self, job_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., user: _Optional[str] = ..., states: _Optional[_Iterable[str]] = ..., name: _Optional[str] = ..., hold: _Optional[bool] = ...) -> None: ...

class ActionOutcome(_message.Message):
    __slots__ = ("job_id", "done", "message", "error_kind")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    done: bool
    message: str
    error_kind: str
    def __init__(self, job_id: _Optional[str] = ..., done: _Optional[bool] = ..., message: _Optional[str] = ..., error_kind: _Optional[str] = ...) -> None: ...

class ActionReply(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[ActionOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[ActionOutcome, _Mapping]]] = ...) -> None: ...

class JobEvents(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_types_pb2.JobEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[_types_pb2.JobEvent, _Mapping]]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("job_ids",)
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, job_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("name", "state", "cpus", "mem", "gpus", "fake", "last_seen", "reason", "usage", "running_jobs", "cpus_used", "mem_used", "gpus_used", "health", "isolation", "driver", "gpu_problem", "drain_reason", "drained_by", "drained_at", "features", "partitions", "default_partition")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEM_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    FAKE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    CPUS_USED_FIELD_NUMBER: _ClassVar[int]
    MEM_USED_FIELD_NUMBER: _ClassVar[int]
    GPUS_USED_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    GPU_PROBLEM_FIELD_NUMBER: _ClassVar[int]
    DRAIN_REASON_FIELD_NUMBER: _ClassVar[int]
    DRAINED_BY_FIELD_NUMBER: _ClassVar[int]
    DRAINED_AT_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PARTITION_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    cpus: int
    mem: int
    gpus: _containers.RepeatedCompositeFieldContainer[_types_pb2.GpuUnit]
    fake: bool
    last_seen: float
    reason: str
    usage: _containers.RepeatedCompositeFieldContainer[_types_pb2.GpuUsage]
    running_jobs: _containers.RepeatedScalarFieldContainer[int]
    cpus_used: int
    mem_used: int
    gpus_used: _containers.RepeatedScalarFieldContainer[str]
    health: _containers.RepeatedCompositeFieldContainer[UnitHealth]
    isolation: str
    driver: str
    gpu_problem: str
    drain_reason: str
    drained_by: str
    drained_at: float
    features: _containers.RepeatedScalarFieldContainer[str]
    partitions: _containers.RepeatedScalarFieldContainer[str]
    default_partition: str
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ..., cpus: _Optional[int] = ..., mem: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[_types_pb2.GpuUnit, _Mapping]]] = ..., fake: _Optional[bool] = ..., last_seen: _Optional[float] = ..., reason: _Optional[str] = ..., usage: _Optional[_Iterable[_Union[_types_pb2.GpuUsage, _Mapping]]] = ..., running_jobs: _Optional[_Iterable[int]] = ..., cpus_used: _Optional[int] = ..., mem_used: _Optional[int] = ..., gpus_used: _Optional[_Iterable[str]] = ..., health: _Optional[_Iterable[_Union[UnitHealth, _Mapping]]] = ..., isolation: _Optional[str] = ..., driver: _Optional[str] = ..., gpu_problem: _Optional[str] = ..., drain_reason: _Optional[str] = ..., drained_by: _Optional[str] = ..., drained_at: _Optional[float] = ..., features: _Optional[_Iterable[str]] = ..., partitions: _Optional[_Iterable[str]] = ..., default_partition: _Optional[str] = ...) -> None: ...

class UnitHealth(_message.Message):
    __slots__ = ("uuid", "health", "reason", "drained_by", "drained_at")
    UUID_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DRAINED_BY_FIELD_NUMBER: _ClassVar[int]
    DRAINED_AT_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    health: str
    reason: str
    drained_by: str
    drained_at: float
    def __init__(self, uuid: _Optional[str] = ..., health: _Optional[str] = ..., reason: _Optional[str] = ..., drained_by: _Optional[str] = ..., drained_at: _Optional[float] = ...) -> None: ...

class ListNodesReply(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ...) -> None: ...

class AddCronRequest(_message.Message):
    __slots__ = ("schedule", "spec")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    schedule: str
    spec: _types_pb2.JobSpec
    def __init__(self, schedule: _Optional[str] = ..., spec: _Optional[_Union[_types_pb2.JobSpec, _Mapping]] = ...) -> None: ...

class CronEntry(_message.Message):
    __slots__ = ("id", "user", "schedule", "spec", "created_at", "last_fire", "next_fire")
    ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_FIRE_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIRE_FIELD_NUMBER: _ClassVar[int]
    id: int
    user: str
    schedule: str
    spec: _types_pb2.JobSpec
    created_at: float
    last_fire: float
    next_fire: float
    def __init__(self, id: _Optional[int] = ..., user: _Optional[str] = ..., schedule: _Optional[str] = ..., spec: _Optional[_Union[_types_pb2.JobSpec, _Mapping]] = ..., created_at: _Optional[float] = ..., last_fire: _Optional[float] = ..., next_fire: _Optional[float] = ...) -> None: ...

class ListCronRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCronReply(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[CronEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[CronEntry, _Mapping]]] = ...) -> None: ...

class RemoveCronRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class FailJobRequest(_message.Message):
    __slots__ = ("job_id", "attempt", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    attempt: int
    reason: str
    def __init__(self, job_id: _Optional[int] = ..., attempt: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...
