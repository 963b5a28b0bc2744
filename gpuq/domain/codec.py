"""JobSpec <-> plain dicts (JSON-ready), for the store's spec column and the agent's job folder.

Explicit rather than generic: a renamed field must be a deliberate change here, because specs
written by an older gpuq are read back by a newer one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

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
        "dependencies": [
            [d.job_id, d.kind.value] + ([d.task] if d.task is not None else [])
            for d in spec.dependencies
        ],
        "hold": spec.hold,
        "begin_time": spec.begin_time,
        "signal": [spec.signal.signal, spec.signal.seconds] if spec.signal else None,
        "requeue": spec.requeue,
        "singleton": spec.singleton,
        "source": spec.source,
        "umask": spec.umask,
    }


def spec_from_dict(data: dict[str, Any]) -> JobSpec:
    """A spec read back as it was stored, without validating it again: it was checked when it
    was accepted, and a rule added since (a newer gpuq) must not make a stored job unreadable,
    and so the coordinator unable to start. A stored value the code cannot handle makes the
    scheduler set that job aside (held, with the error as its reason) instead."""
    res = data["resources"]
    array = data.get("array")
    signal = data.get("signal")
    return _trusted(
        JobSpec,
        name=data["name"],
        script=data["script"],
        workdir=data["workdir"],
        args=tuple(data.get("args", ())),
        env=dict(data.get("env", {})),
        resources=_trusted(
            Resources,
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
        array=(
            _trusted(
                ArraySpec, indices=tuple(array["indices"]), max_running=array.get("max_running")
            )
            if array
            else None
        ),
        dependencies=tuple(
            _trusted(
                Dependency,
                job_id=dep[0],
                kind=DependencyKind(dep[1]),
                task=dep[2] if len(dep) > 2 else None,
            )
            for dep in data.get("dependencies", ())
        ),
        hold=data.get("hold", False),
        begin_time=data.get("begin_time"),
        signal=_trusted(WarningSignal, signal=signal[0], seconds=signal[1]) if signal else None,
        requeue=data.get("requeue", True),
        singleton=data.get("singleton", False),
        source=data.get("source", ""),
        umask=data.get("umask"),
    )


T = TypeVar("T")


def _trusted(cls: type[T], **values: Any) -> T:
    """An instance of a frozen dataclass without running its checks; fields not given take
    their defaults."""
    instance = object.__new__(cls)
    for item in dataclasses.fields(cls):  # type: ignore[arg-type]
        if item.name in values:
            value = values[item.name]
        elif item.default is not dataclasses.MISSING:
            value = item.default
        else:
            value = item.default_factory()  # type: ignore[operator]
        object.__setattr__(instance, item.name, value)
    return instance
