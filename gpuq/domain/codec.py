"""JobSpec <-> plain dicts (JSON-ready), for the store's spec column and the agent's job folder.

Explicit rather than generic: a renamed field must be a deliberate change here, because specs
written by an older gpuq are read back by a newer one.
"""

from __future__ import annotations

from typing import Any

from gpuq.domain.model import (
    ArraySpec,
    Dependency,
    DependencyKind,
    JobSpec,
    Resources,
    WarningSignal,
)


def spec_to_dict(spec: JobSpec) -> dict[str, Any]:
    res = spec.resources
    return {
        "name": spec.name,
        "script": spec.script,
        "workdir": spec.workdir,
        "args": list(spec.args),
        "env": dict(spec.env),
        "resources": {
            "gpus": res.gpus,
            "gpu_mem": res.gpu_mem,
            "cpus": res.cpus,
            "mem": res.mem,
            "time_limit": res.time_limit,
        },
        "qos": spec.qos,
        "nice": spec.nice,
        "output": spec.output,
        "error": spec.error,
        "array": (
            {"indices": list(spec.array.indices), "max_running": spec.array.max_running}
            if spec.array
            else None
        ),
        "dependencies": [[d.job_id, d.kind.value] for d in spec.dependencies],
        "hold": spec.hold,
        "begin_time": spec.begin_time,
        "signal": [spec.signal.signal, spec.signal.seconds] if spec.signal else None,
        "requeue": spec.requeue,
        "singleton": spec.singleton,
        "source": spec.source,
    }


def spec_from_dict(data: dict[str, Any]) -> JobSpec:
    res = data["resources"]
    array = data.get("array")
    signal = data.get("signal")
    return JobSpec(
        name=data["name"],
        script=data["script"],
        workdir=data["workdir"],
        args=tuple(data.get("args", ())),
        env=dict(data.get("env", {})),
        resources=Resources(
            gpus=res["gpus"],
            gpu_mem=res.get("gpu_mem"),
            cpus=res["cpus"],
            mem=res.get("mem"),
            time_limit=res.get("time_limit"),
        ),
        qos=data.get("qos"),
        nice=data.get("nice", 0),
        output=data.get("output"),
        error=data.get("error"),
        array=ArraySpec(tuple(array["indices"]), array.get("max_running")) if array else None,
        dependencies=tuple(
            Dependency(job_id, DependencyKind(kind))
            for job_id, kind in data.get("dependencies", ())
        ),
        hold=data.get("hold", False),
        begin_time=data.get("begin_time"),
        signal=WarningSignal(signal[0], signal[1]) if signal else None,
        requeue=data.get("requeue", True),
        singleton=data.get("singleton", False),
        source=data.get("source", ""),
    )
