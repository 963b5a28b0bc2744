"""Changing jobs after submission: `gpuq update` (SLURM's `scontrol update`) and `gpuq
requeue` (`scontrol requeue`). Values are parsed by the parsers the submit options use, so
`--time 1:00:00` or `--mem 40G` mean here what they mean to `gpuq submit`."""

from __future__ import annotations

from typing import Any

import click

from gpuq.cli.job_verbs import _act, check_selection, complete_ids, report, selection_options


def update_fields(
    time: str | None,
    qos: str | None,
    after: str | None,
    nice: str | None,
    hold: bool | None,
    name: str | None,
    begin: str | None,
    gpus: str | None,
    cpus: str | None,
    mem: str | None,
    gpu_mem: str | None,
    nodelist: str | None,
    exclude: str | None,
    constraint: str | None,
) -> dict[str, Any]:
    """The flags as UpdateRequest fields (Client.update's keywords); bad input raises
    InvalidInput here, before any connection."""
    from gpuq.domain.limits import check_name, check_qos
    from gpuq.domain.units import parse_duration, parse_size
    from gpuq.errors import InvalidInput

    fields: dict[str, Any] = {}
    if time is not None:
        fields["time_limit"] = parse_duration(time, "--time")
    if qos is not None:
        check_qos(qos)
        fields["qos"] = qos
    if nice is not None:
        try:
            fields["nice"] = int(nice)
        except ValueError:
            raise InvalidInput("--nice", nice, "expected a whole number") from None
    if hold is not None:
        fields["hold"] = hold
    if name is not None:
        fields["name"] = check_name(name)
    if after is not None:
        from gpuq.domain.parsing import parse_dependencies
        from gpuq.v1 import types_pb2

        deps = () if after.strip().lower() == "none" else parse_dependencies(after)[0]
        fields["dependencies"] = [
            types_pb2.Dependency(job_id=d.job_id, kind=d.kind.value, task=d.task) for d in deps
        ]
    if begin is not None:
        from gpuq.domain.parsing import parse_begin

        fields["begin_time"] = None if begin.strip().lower() == "now" else parse_begin(begin)
    if gpus is not None:
        from gpuq.domain.gpu_types import parse_gpu_request

        gpu_type, count = parse_gpu_request(gpus)
        fields["gpus"] = count
        fields["gpu_type"] = gpu_type or ""
    if cpus is not None:
        try:
            fields["cpus"] = int(cpus)
        except ValueError:
            raise InvalidInput("--cpus", cpus, "expected a whole number") from None
    if mem is not None:
        fields["mem"] = parse_size(mem, "--mem")
    if gpu_mem is not None:
        fields["gpu_mem"] = parse_size(gpu_mem, "--gpu-mem")
    for flag, value in (("nodelist", nodelist), ("exclude", exclude)):
        if value is not None:
            from gpuq.domain.node_constraints import expand_nodes

            none = value.strip().lower() in ("", "none")
            fields[flag] = [] if none else list(expand_nodes(value, f"--{flag}"))
    if constraint is not None:
        none = constraint.strip().lower() in ("", "none")
        fields["constraint"] = "" if none else constraint
    return fields


@click.command()
@click.argument("job_ids", nargs=-1, required=True, shell_complete=complete_ids)
@click.option("--time", "-t", metavar="TIME", help="time limit (owners may only lower it)")
@click.option("--qos", "-q", metavar="QOS", help="another QOS tier")
@click.option("--after", "-d", metavar="DEPS", help="replace the dependencies ('none' clears)")
@click.option("--nice", metavar="N", help="nice (owners may only raise it)")
@click.option("--hold/--release", default=None, help="hold, or release, as well")
@click.option("--name", "-J", metavar="NAME", help="job name")
@click.option("--begin", "-b", metavar="TIME", help="not before TIME ('now' clears)")
@click.option("--gpus", "-G", metavar="[TYPE:]N", help="GPUs, e.g. 2 or a100:2")
@click.option("--cpus", "-c", metavar="N", help="CPU cores")
@click.option("--mem", metavar="SIZE", help="host memory, e.g. 40G")
@click.option("--gpu-mem", metavar="SIZE", help="least memory per GPU, e.g. 40G")
@click.option("--nodelist", "-w", metavar="NODES", help="only these nodes ('none' clears)")
@click.option("--exclude", "-x", metavar="NODES", help="never these nodes ('none' clears)")
@click.option("--constraint", "-C", metavar="EXPR", help="node features ('none' clears)")
@click.option("--verbose", "-v", is_flag=True, help="a line per job, also in bulk")
@click.pass_obj
def update(obj: Any, /, job_ids: tuple[str, ...], verbose: bool, **flags: Any) -> int:
    """Change pending or held jobs (JOB, ARRAY for its unstarted tasks, ARRAY_TASK). Owners
    may lower a time limit, raise nice and pick a QOS they could submit to; raising limits
    is for admins. A job is changed as a whole or not at all; each change is an event."""
    check_selection("update", job_ids, "", (), "")
    fields = update_fields(**flags)
    if not fields:
        raise click.UsageError("say what to change, e.g. gpuq update JOB --time 1:00:00")
    outcomes = obj.client().update(*job_ids, missing_ok=True, **fields)
    return report("update", outcomes, verbose)


@click.command()
@selection_options
@click.option("--hold", "-H", is_flag=True, help="back to the queue held (gpuq release)")
@click.pass_obj
def requeue(
    obj: Any,
    /,
    job_ids: tuple[str, ...],
    user: str,
    states: tuple[str, ...],
    name: str,
    verbose: bool,
    hold: bool,
) -> int:
    """Put jobs back in the queue with the same id: running ones are stopped first (as a
    preemption stops them), ended ones (failed, cancelled, timeout, completed...) are queued
    again. Jobs submitted with --no-requeue are refused, as SLURM refuses them."""
    return _act(obj, "requeue", job_ids, user, states, name, verbose, hold=hold)
