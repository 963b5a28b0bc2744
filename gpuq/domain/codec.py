"""JobSpec <-> plain dicts (JSON-ready), for the store's spec column and the agent's job folder.

Explicit rather than generic: a renamed field must be a deliberate change here, because specs
written by an older gpuq are read back by a newer one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from gpuq.domain.array_specs import ArraySpec
from gpuq.domain.dependencies import Dependency, DependencyKind
from gpuq.domain.interactive_jobs import Terminal
from gpuq.domain.model import JobSpec, Resources, WarningSignal
from gpuq.domain.node_constraints import Placement
from gpuq.errors import InvalidInput


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
            **({"mig": res.mig} if res.mig is not None else {}),
            **({"gpu_share": res.gpu_share} if res.gpu_share is not None else {}),
            **({"gpu_type": res.gpu_type} if res.gpu_type is not None else {}),
            **_layout_dict(res),
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
        **({"placement": _placement_dict(spec.placement)} if spec.placement else {}),
        **({"terminal": dataclasses.asdict(spec.terminal)} if spec.terminal else {}),
        **({"mail_types": list(spec.mail_types)} if spec.mail_types else {}),
        **({"mail_user": spec.mail_user} if spec.mail_user is not None else {}),
        **({"notify_url": spec.notify_url} if spec.notify_url is not None else {}),
    }


def _layout_dict(res: Resources) -> dict[str, Any]:
    """A multi-node or multi-task job's layout: each key only when not its default, so a
    one-node spec is stored as before and an older gpuq's rows read back as one node."""
    return {
        **({"nodes": res.nodes} if res.nodes != 1 else {}),
        **({"tasks_per_node": res.tasks_per_node} if res.tasks_per_node != 1 else {}),
        **({"gpus_per_task": res.gpus_per_task} if res.gpus_per_task is not None else {}),
        **({"exclusive": True} if res.exclusive else {}),
        **({"mem_all": True} if res.mem_all else {}),
        **({"explicit_tasks": True} if res.explicit_tasks else {}),
    }


def _placement_dict(placement: Placement) -> dict[str, Any]:
    return {
        "nodelist": list(placement.nodelist),
        "exclude": list(placement.exclude),
        "constraint": placement.constraint,
        **({"partitions": list(placement.partitions)} if placement.partitions else {}),
    }


T = TypeVar("T")


def spec_from_dict(data: dict[str, Any], *, checked: bool = False) -> JobSpec:
    """A spec from its dict form. Unchecked by default: a stored spec is read back as it was
    stored, since it was checked when it was accepted, and a rule added since (a newer gpuq)
    must not make a stored job unreadable, and so the coordinator unable to start; a stored
    value the code cannot handle makes the scheduler set that job aside instead. `checked`
    runs every check (a submission from the wire): InvalidInput for what a JobSpec refuses."""
    build: Callable[..., Any] = _checked if checked else _trusted
    res = data["resources"]
    array = data.get("array")
    signal = data.get("signal")
    return build(  # type: ignore[no-any-return]
        JobSpec,
        name=data["name"],
        script=data["script"],
        workdir=data["workdir"],
        args=tuple(data.get("args", ())),
        env=dict(data.get("env", {})),
        resources=build(
            Resources,
            gpus=res["gpus"],
            gpu_mem=res.get("gpu_mem"),
            cpus=res["cpus"],
            mem=res.get("mem"),
            time_limit=res.get("time_limit"),
            mig=res.get("mig"),
            gpu_share=res.get("gpu_share"),
            gpu_type=res.get("gpu_type"),
            nodes=res.get("nodes", 1),
            tasks_per_node=res.get("tasks_per_node", 1),
            gpus_per_task=res.get("gpus_per_task"),
            exclusive=res.get("exclusive", False),
            mem_all=res.get("mem_all", False),
            explicit_tasks=res.get("explicit_tasks", False),
        ),
        qos=data.get("qos"),
        nice=data.get("nice", 0),
        output=data.get("output"),
        error=data.get("error"),
        array=(
            build(ArraySpec, indices=tuple(array["indices"]), max_running=array.get("max_running"))
            if array
            else None
        ),
        dependencies=tuple(
            build(
                Dependency,
                job_id=dep[0],
                kind=_kind(dep[1]),
                task=dep[2] if len(dep) > 2 else None,
            )
            for dep in data.get("dependencies", ())
        ),
        hold=data.get("hold", False),
        begin_time=data.get("begin_time"),
        signal=build(WarningSignal, signal=signal[0], seconds=signal[1]) if signal else None,
        requeue=data.get("requeue", True),
        singleton=data.get("singleton", False),
        source=data.get("source", ""),
        umask=data.get("umask"),
        placement=(
            build(
                Placement,
                nodelist=tuple(placed.get("nodelist", ())),
                exclude=tuple(placed.get("exclude", ())),
                constraint=placed.get("constraint"),
                partitions=tuple(placed.get("partitions", ())),
            )
            if (placed := data.get("placement"))
            else Placement()
        ),
        terminal=build(Terminal, **terminal) if (terminal := data.get("terminal")) else None,
        mail_types=tuple(data.get("mail_types", ())),
        mail_user=data.get("mail_user"),
        notify_url=data.get("notify_url"),
    )


def _kind(text: str) -> DependencyKind:
    try:
        return DependencyKind(text)
    except ValueError:
        raise InvalidInput("--after", text, "the kind must be ok, any or notok") from None


def _checked(cls: type[T], **values: Any) -> T:
    return cls(**values)


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
