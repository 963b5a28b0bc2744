"""Job and node rows <-> domain objects: the columns a new job is inserted with, an event row,
a job or node rebuilt from its row, a node's description as columns (its units and topology as
JSON).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Row

from gpuq.domain.array_specs import parse_indices
from gpuq.domain.codec import spec_to_dict
from gpuq.domain.model import GpuUnit, Job, JobResult, JobSpec, JobTelemetry, Node, NodeState
from gpuq.domain.states import JobState
from gpuq.store.records import NewJob

SUBMITTED = "submitted"  # a new job's reason, and its first event's


def event_row(
    job_id: int,
    now: float,
    from_state: JobState | None,
    to_state: JobState,
    reason: str,
    cause: str = "",
) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "at": now,
        "from_state": from_state.value if from_state else None,
        "to_state": to_state.value,
        "reason": reason,
        "cause": cause or None,
    }


def job_row(new: NewJob, state: JobState, now: float) -> dict[str, Any]:
    res = new.spec.resources
    return {
        "user": new.user,
        "name": new.spec.name,
        "state": state.value,
        "qos": new.qos,
        "priority": new.priority,
        "gpus": res.gpus,
        "gpu_mem": res.gpu_mem,
        "cpus": res.cpus,
        "mem": res.mem,
        "time_limit": res.time_limit,
        "submit_time": now,
        "reason": SUBMITTED,
        "requeue_count": 0,
        "array_job_id": None,
        "array_task_id": None,
        "array_tasks": None,
        "spec": json.dumps(spec_to_dict(new.spec), separators=(",", ":")),
    }


def job_from_row(
    row: Row[Any],
    units: tuple[str, ...],
    specs: dict[int, JobSpec],
    telemetry: JobTelemetry | None = None,
) -> Job:
    ended = row.exit_code is not None or row.signal is not None
    state = JobState(row.state)
    spec = specs[row.id if row.spec else row.array_job_id]
    return Job(
        id=row.id,
        spec=spec,
        user=row.user,
        state=state,
        qos=row.qos,
        priority=row.priority,
        submit_time=row.submit_time,
        start_time=row.start_time,
        end_time=row.end_time,
        node=row.node,
        gpus=units,
        nodes=tuple(row.nodes.split(",")) if row.nodes else (),
        master_port=row.master_port,
        step_key=row.step_key,
        result=(
            JobResult(row.exit_code, row.signal, row.reason)
            if ended or (not state.is_live and row.start_time is not None)
            else None
        ),
        requeue_count=row.requeue_count,
        start_count=row.start_count or 0,
        array_job_id=row.array_job_id,
        array_task_id=row.array_task_id,
        reason=row.reason,
        stop=(JobState(row.stop_state), row.stop_reason) if row.stop_state else None,
        tasks=_tasks(row.array_tasks, spec),
        telemetry=telemetry,
    )


def _tasks(text: str | None, spec: JobSpec) -> tuple[int, ...]:
    """A record's tasks; the spec's own tuple while none has left (half the memory)."""
    if not text:
        return ()
    tasks = parse_indices(text)
    return spec.array.indices if spec.array and spec.array.indices == tasks else tasks


def _unit_to_dict(unit: GpuUnit) -> dict[str, Any]:
    return {
        "uuid": unit.uuid,
        "index": unit.index,
        "name": unit.name,
        "memory": unit.memory,
        "pci_bus_id": unit.pci_bus_id,
        "parent_uuid": unit.parent_uuid,
        "mig_profile": unit.mig_profile,
        **({"shared": True} if unit.shared else {}),
    }


def node_row(node: Node) -> dict[str, Any]:
    """A node's columns but its name (the key an upsert matches on)."""
    return {
        "state": node.state.value,
        "cpus": node.cpus,
        "mem": node.mem,
        "fake": node.fake,
        "units": json.dumps([_unit_to_dict(u) for u in node.units]),
        "topology": json.dumps([list(link) for link in node.topology]),
        "last_seen": node.last_seen,
        "reason": node.reason,
        "fence_time": node.fence_time or None,
    }


def node_from_row(row: Row[Any]) -> Node:
    return Node(
        name=row.name,
        units=tuple(GpuUnit(**u) for u in json.loads(row.units)),
        cpus=row.cpus,
        mem=row.mem,
        state=NodeState(row.state),
        fake=row.fake,
        topology=tuple((a, b, d) for a, b, d in json.loads(row.topology)),
        last_seen=row.last_seen,
        reason=row.reason,
        fence_time=row.fence_time or 0.0,
    )
