"""The pure core: data, states and units. Nothing here does I/O."""

from gpuq.domain.model import (
    Allocation,
    ArraySpec,
    Dependency,
    DependencyKind,
    GpuUnit,
    Job,
    JobEvent,
    JobResult,
    JobSpec,
    Node,
    NodeState,
    Resources,
    WarningSignal,
)
from gpuq.domain.states import LIVE_STATES, TRANSITIONS, JobState, check_transition
from gpuq.domain.units import format_duration, format_size, parse_duration, parse_size

__all__ = [
    "LIVE_STATES",
    "TRANSITIONS",
    "Allocation",
    "ArraySpec",
    "Dependency",
    "DependencyKind",
    "GpuUnit",
    "Job",
    "JobEvent",
    "JobResult",
    "JobSpec",
    "JobState",
    "Node",
    "NodeState",
    "Resources",
    "WarningSignal",
    "check_transition",
    "format_duration",
    "format_size",
    "parse_duration",
    "parse_size",
]
