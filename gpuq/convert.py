"""Proto <-> domain, in one place for both sides of the wire.

Converting into the domain validates (the dataclasses do), so a malformed request becomes one
InvalidInput before anything else looks at it.
"""

from __future__ import annotations

import math
from typing import Any

from gpuq.domain.array_specs import format_indices, parse_indices
from gpuq.domain.codec import spec_from_dict
from gpuq.domain.diagnosis import Diagnosis, Verdict
from gpuq.domain.limits import MAX_NODE_NAME, MAX_NODE_UNITS, MAX_UNIT_ID, clean_line
from gpuq.domain.model import (
    MAX_NODES,
    GpuUnit,
    Job,
    JobEvent,
    JobResult,
    JobSpec,
    JobTelemetry,
    UnitTelemetry,
)
from gpuq.domain.progress import Throughput
from gpuq.domain.states import JobState
from gpuq.v1 import queue_pb2
from gpuq.v1 import types_pb2 as pb


def spec_to_proto(spec: JobSpec) -> pb.JobSpec:
    res = spec.resources
    message = pb.JobSpec(
        name=spec.name,
        script=spec.script,
        args=list(spec.args),
        workdir=spec.workdir,
        env=spec.env,
        resources=pb.Resources(
            gpus=res.gpus,
            gpu_mem=res.gpu_mem,
            cpus=res.cpus,
            mem=res.mem,
            time_limit=res.time_limit,
            mig=res.mig or "",
            gpu_share=res.gpu_share or 0,
            gpu_type=res.gpu_type or "",
            nodes=res.nodes,
            tasks_per_node=res.tasks_per_node,
            gpus_per_task=res.gpus_per_task or 0,
            exclusive=res.exclusive,
            mem_all=res.mem_all,
            explicit_tasks=res.explicit_tasks,
        ),
        qos=spec.qos or "",
        nice=spec.nice,
        output=spec.output or "",
        error=spec.error or "",
        dependencies=[
            pb.Dependency(job_id=d.job_id, kind=d.kind.value, task=d.task)
            for d in spec.dependencies
        ],
        hold=spec.hold,
        begin_time=spec.begin_time,
        no_requeue=not spec.requeue,
        singleton=spec.singleton,
        source=spec.source,
        umask=spec.umask,
        placement=pb.Placement(
            nodelist=list(spec.placement.nodelist),
            exclude=list(spec.placement.exclude),
            constraint=spec.placement.constraint or "",
            partitions=list(spec.placement.partitions),
        ),
        mail_types=list(spec.mail_types),
        mail_user=spec.mail_user or "",
        notify_url=spec.notify_url or "",
    )
    if spec.terminal is not None:
        term = spec.terminal
        message.terminal.CopyFrom(
            pb.Terminal(
                rows=term.rows,
                cols=term.cols,
                term=term.term,
                stdin_tty=term.stdin_tty,
                stdout_tty=term.stdout_tty,
            )
        )
    if spec.array is not None:
        message.array.CopyFrom(
            pb.ArraySpec(indices=list(spec.array.indices), max_running=spec.array.max_running)
        )
    if spec.signal is not None:
        message.signal.CopyFrom(
            pb.WarningSignal(signal=spec.signal.signal, seconds=spec.signal.seconds)
        )
    return message


def spec_from_proto(message: pb.JobSpec) -> JobSpec:
    """Raises InvalidInput for anything a JobSpec refuses (a submission: checked in full)."""
    return spec_from_dict(_spec_dict(message), checked=True)


def _spec_dict(message: pb.JobSpec) -> dict[str, Any]:
    """A wire spec in the store's dict form (gpuq.domain.codec)."""
    res = message.resources
    return {
        "name": message.name,
        "script": message.script,
        "workdir": message.workdir,
        "args": list(message.args),
        "env": dict(message.env),
        "resources": {
            "gpus": res.gpus,
            "gpu_mem": res.gpu_mem if res.HasField("gpu_mem") else None,
            "cpus": res.cpus or 1,
            "mem": res.mem if res.HasField("mem") else None,
            "time_limit": res.time_limit if res.HasField("time_limit") else None,
            "mig": res.mig or None,
            "gpu_share": res.gpu_share or None,
            "gpu_type": res.gpu_type or None,
            "nodes": res.nodes or 1,
            "tasks_per_node": res.tasks_per_node or 1,
            "gpus_per_task": res.gpus_per_task or None,
            "exclusive": res.exclusive,
            "mem_all": res.mem_all,
            "explicit_tasks": res.explicit_tasks,
        },
        "qos": message.qos or None,
        "nice": message.nice,
        "output": message.output or None,
        "error": message.error or None,
        "array": (
            {
                "indices": list(message.array.indices),
                "max_running": message.array.max_running
                if message.array.HasField("max_running")
                else None,
            }
            if message.HasField("array")
            else None
        ),
        "dependencies": [
            [d.job_id, d.kind or "ok"] + ([d.task] if d.HasField("task") else [])
            for d in message.dependencies
        ],
        "hold": message.hold,
        "begin_time": message.begin_time if message.HasField("begin_time") else None,
        "signal": (
            [message.signal.signal, message.signal.seconds] if message.HasField("signal") else None
        ),
        "requeue": not message.no_requeue,
        "singleton": message.singleton,
        "source": message.source,
        "umask": message.umask if message.HasField("umask") else None,
        "placement": {
            "nodelist": list(message.placement.nodelist),
            "exclude": list(message.placement.exclude),
            "constraint": message.placement.constraint or None,
            "partitions": list(message.placement.partitions),
        },
        "terminal": (
            {
                "rows": message.terminal.rows,
                "cols": message.terminal.cols,
                "term": message.terminal.term,
                "stdin_tty": message.terminal.stdin_tty,
                "stdout_tty": message.terminal.stdout_tty,
            }
            if message.HasField("terminal")
            else None
        ),
        "mail_types": list(message.mail_types),
        "mail_user": message.mail_user or None,
        "notify_url": message.notify_url or None,
    }


def result_to_proto(result: JobResult) -> pb.JobResult:
    return pb.JobResult(exit_code=result.exit_code, signal=result.signal, reason=result.reason)


def result_from_proto(message: pb.JobResult) -> JobResult:
    return JobResult(
        exit_code=message.exit_code if message.HasField("exit_code") else None,
        signal=message.signal if message.HasField("signal") else None,
        reason=message.reason,
    )


def job_to_proto(job: Job, stdout_path: str = "", stderr_path: str = "") -> pb.Job:
    message = pb.Job(
        id=job.id,
        spec=spec_to_proto(job.spec),
        user=job.user,
        state=job.state.value,
        submit_time=job.submit_time,
        start_time=job.start_time,
        end_time=job.end_time,
        node=job.node or "",
        gpus=list(job.gpus),
        requeue_count=job.requeue_count,
        array_job_id=job.array_job_id,
        array_task_id=job.array_task_id,
        reason=job.reason,
        stdout_path=stdout_path,
        stderr_path=stderr_path,
        priority=job.priority,
        qos=job.qos,
        stop_reason=job.stop[1] if job.stop else "",
        stop_state=job.stop[0].value if job.stop else "",
        array_tasks=format_indices(job.tasks),
        start_count=job.start_count,
        gpu_enforcement=job.spec.resources.enforcement,
        nodes=list(job.nodes),
    )
    if job.result is not None:
        message.result.CopyFrom(result_to_proto(job.result))
    if job.telemetry is not None:
        message.telemetry.CopyFrom(telemetry_to_proto(job.telemetry))
    return message


def job_from_proto(message: pb.Job) -> Job:
    """A job as the coordinator sent it: its spec is not checked again (see spec_from_dict),
    so a client can read every job the coordinator can. A pending job's reason is why it
    waits (every reason, as `gpuq show` lists them), where the coordinator said."""
    waiting = message.state == JobState.PENDING.value and message.HasField("pending")
    reasons = list(message.pending.reasons) if waiting else []
    return Job(
        id=message.id,
        spec=spec_from_dict(_spec_dict(message.spec), checked=False),
        user=message.user,
        state=JobState(message.state),
        qos=message.qos,
        priority=message.priority,
        submit_time=message.submit_time,
        start_time=message.start_time if message.HasField("start_time") else None,
        end_time=message.end_time if message.HasField("end_time") else None,
        node=message.node or None,
        gpus=tuple(message.gpus),
        nodes=tuple(clean_line(name, MAX_NODE_NAME) for name in message.nodes[:MAX_NODES]),
        result=result_from_proto(message.result) if message.HasField("result") else None,
        requeue_count=message.requeue_count,
        array_job_id=message.array_job_id if message.HasField("array_job_id") else None,
        array_task_id=message.array_task_id if message.HasField("array_task_id") else None,
        reason="; ".join(reasons) if reasons else message.reason,
        stop=(JobState(message.stop_state), message.stop_reason) if message.stop_state else None,
        tasks=parse_indices(message.array_tasks),
        start_count=message.start_count,
        telemetry=(
            telemetry_from_proto(message.telemetry) if message.HasField("telemetry") else None
        ),
    )


def telemetry_to_proto(telemetry: JobTelemetry) -> pb.GpuTelemetry:
    return pb.GpuTelemetry(
        peak_gpu_mem=telemetry.peak_gpu_mem,
        util_mean=telemetry.util_mean,
        util_p95=telemetry.util_p95,
        energy=telemetry.energy,
        samples=telemetry.samples,
        seconds=telemetry.seconds,
        units=[
            pb.UnitTelemetry(
                uuid=u.uuid,
                peak_mem=u.peak_mem,
                util_mean=u.util_mean,
                util_p95=u.util_p95,
                energy=u.energy,
            )
            for u in telemetry.units
        ],
    )


def telemetry_from_proto(message: pb.GpuTelemetry) -> JobTelemetry:
    """What an agent measured, made safe to keep: a figure that is not a finite, non-negative
    number (or a percentage above 100) is unknown; at most MAX_NODE_UNITS units, each UUID
    one bounded line. Never refused: a bad figure must not lose the job's end."""

    def figure(owner: Any, name: str, most: float = math.inf) -> float | None:
        if not owner.HasField(name):
            return None
        value = float(getattr(owner, name))
        return value if math.isfinite(value) and 0.0 <= value <= most else None

    def count(value: float) -> float:
        return value if math.isfinite(value) and value >= 0.0 else 0.0

    return JobTelemetry(
        peak_gpu_mem=min(message.peak_gpu_mem, 2**62),
        util_mean=figure(message, "util_mean", 100.0),
        util_p95=figure(message, "util_p95", 100.0),
        energy=figure(message, "energy"),
        samples=min(message.samples, 2**31 - 1),
        seconds=count(message.seconds),
        units=tuple(
            UnitTelemetry(
                uuid=clean_line(u.uuid, MAX_UNIT_ID),
                peak_mem=min(u.peak_mem, 2**62),
                util_mean=figure(u, "util_mean", 100.0),
                util_p95=figure(u, "util_p95", 100.0),
                energy=figure(u, "energy"),
            )
            for u in message.units[:MAX_NODE_UNITS]
        ),
    )


def event_to_proto(event: JobEvent) -> pb.JobEvent:
    return pb.JobEvent(
        job_id=event.job_id,
        at=event.at,
        from_state=event.from_state.value if event.from_state else "",
        to_state=event.to_state.value,
        reason=event.reason,
        cause=event.cause,
    )


def event_from_proto(message: pb.JobEvent) -> JobEvent:
    return JobEvent(
        job_id=message.job_id,
        at=message.at,
        from_state=JobState(message.from_state) if message.from_state else None,
        to_state=JobState(message.to_state),
        reason=message.reason,
        cause=message.cause,
    )


def unit_to_proto(unit: GpuUnit) -> pb.GpuUnit:
    return pb.GpuUnit(
        uuid=unit.uuid,
        index=unit.index,
        name=unit.name,
        memory=unit.memory,
        pci_bus_id=unit.pci_bus_id,
        parent_uuid=unit.parent_uuid or "",
        mig_profile=unit.mig_profile or "",
        shared=unit.shared and not unit.is_mig,
    )


def unit_from_proto(message: pb.GpuUnit) -> GpuUnit:
    return GpuUnit(
        uuid=message.uuid,
        index=message.index,
        name=message.name,
        memory=message.memory,
        pci_bus_id=message.pci_bus_id,
        parent_uuid=message.parent_uuid or None,
        mig_profile=message.mig_profile or None,
        shared=message.shared and not (message.parent_uuid or message.mig_profile),
    )


def throughput_to_proto(throughput: Throughput, read_at: float, collapse: str) -> pb.JobThroughput:
    """A running job's progress on the wire: `read_at`, when its output was last read;
    `collapse`, the line that says its throughput collapsed ("": it did not)."""
    progress = throughput.progress
    message = pb.JobThroughput(
        done=progress.done,
        unit=progress.unit,
        label=progress.label,
        source=progress.source,
        read_at=read_at,
        collapse=collapse,
    )
    if progress.total is not None:
        message.total = progress.total
    if (fraction := progress.fraction) is not None:
        message.fraction = fraction
    if throughput.rate is not None:
        message.rate = throughput.rate
    if throughput.eta is not None:
        message.eta = throughput.eta
    return message


def diagnosis_to_proto(diagnosis: Diagnosis) -> queue_pb2.Diagnosis:
    return queue_pb2.Diagnosis(
        verdicts=[
            queue_pb2.Verdict(
                name=v.name, title=v.title, evidence=list(v.evidence), advice=v.advice
            )
            for v in diagnosis.verdicts
        ],
        note=diagnosis.note,
    )


def diagnosis_from_proto(message: queue_pb2.Diagnosis) -> Diagnosis:
    """The wire's diagnosis (its verdicts' weights stay the coordinator's: their order says)."""
    return Diagnosis(
        tuple(Verdict(v.name, v.title, tuple(v.evidence), v.advice) for v in message.verdicts),
        message.note,
    )
