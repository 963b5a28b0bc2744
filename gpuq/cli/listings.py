"""Listings: status (the glance), queue, nodes, history. Each has --json."""

from __future__ import annotations

import getpass
import time
from typing import Any

import click

from gpuq.cli import render

json_option = click.option("--json", "as_json", is_flag=True, help="print JSON")


@click.command()
@click.option("--user", "-u", help="only this user's jobs")
@click.option(
    "--state",
    "-s",
    "states",
    multiple=True,
    help="only these states: names or SLURM codes, e.g. R,PD (repeatable)",
)
@click.option("--long", "-l", "long_", is_flag=True, help="priority factors and estimated start")
@json_option
@click.pass_obj
def queue(
    obj: Any, /, user: str | None, states: tuple[str, ...], long_: bool, as_json: bool
) -> int:
    """Pending, held and running jobs, with why each pending job waits. An array's waiting
    tasks show as one line, e.g. 40_[3-99%8]."""
    from gpuq.domain.states import parse_states

    wanted = parse_states(states)  # bad input fails here, before any connection
    jobs = obj.client().list_raw(states=wanted, user=user)
    if as_json:
        click.echo(render.dumps([render.job_dict(j) for j in jobs]))
        return 0
    now = time.time()
    headers = ["JOBID", "NAME", "USER", "ST", "TIME", "GPUS", "QOS"]
    if long_:
        headers += ["PRIORITY", "QOS+AGE+FAIRSHARE-NICE", "START"]
    rows = []
    for j in jobs:
        row = [
            render.job_id_text(j),
            j.spec.name[:24],
            j.user,
            render.SHORT_STATE[j.state],
            render.elapsed(j, now),
            j.spec.resources.gpus,
            j.qos,
        ]
        if long_:
            row += [render.priority(j), render.factors(j), render.estimated_start(j)]
        rows.append([*row, render.job_reason(j)])
    click.echo(render.table([*headers, "NODE/REASON"], rows))
    return 0


@click.command()
@click.option("--user", "-u", help="only this user's jobs")
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(1, 100_000),
    default=20,
    show_default=True,
    help="how many (1 to 100000)",
)
@json_option
@click.pass_obj
def history(obj: Any, /, user: str | None, limit: int, as_json: bool) -> int:
    """Finished jobs, newest first."""
    jobs = obj.client().list_raw(finished=True, user=user, limit=limit)
    if as_json:
        click.echo(render.dumps([render.job_dict(j) for j in jobs]))
        return 0
    rows = []
    for j in jobs:
        result = j.result if j.HasField("result") else None
        code = str(result.exit_code) if result and result.HasField("exit_code") else "-"
        rows.append(
            (
                render.job_id_text(j),
                j.spec.name[:24],
                j.state,
                code,
                render.elapsed(j, time.time()),
                j.node or "-",
                render.when(j.end_time if j.HasField("end_time") else None),
                j.reason[:60],
            )
        )
    click.echo(
        render.table(("JOBID", "NAME", "STATE", "EXIT", "TIME", "NODE", "ENDED", "REASON"), rows)
    )
    return 0


def node_dict(node: Any) -> dict[str, Any]:
    usage = {u.uuid: u for u in node.usage}
    return {
        "name": node.name,
        "state": node.state,
        "reason": node.reason,
        "fake": node.fake,
        "cpus": node.cpus,
        "cpus_used": node.cpus_used,
        "mem": node.mem,
        "mem_used": node.mem_used,
        "running_jobs": list(node.running_jobs),
        "gpus": [
            {
                "uuid": g.uuid,
                "index": g.index,
                "name": g.name,
                "memory": g.memory,
                "allocated": g.uuid in node.gpus_used,
                "memory_used": usage[g.uuid].memory_used if g.uuid in usage else None,
                "utilization": usage[g.uuid].utilization if g.uuid in usage else None,
                "jobs": list(usage[g.uuid].job_ids) if g.uuid in usage else [],
            }
            for g in node.gpus
        ],
    }


@click.command()
@json_option
@click.pass_obj
def nodes(obj: Any, /, as_json: bool) -> int:
    """Nodes with their GPUs, CPUs and memory in use."""
    found = obj.client().nodes()
    if as_json:
        click.echo(render.dumps([node_dict(n) for n in found]))
        return 0
    rows = [
        (
            n.name,
            n.state + (" (fake GPUs)" if n.fake else ""),
            f"{len(n.gpus_used)}/{len(n.gpus)}",
            f"{n.cpus_used}/{n.cpus}",
            f"{render.size(n.mem_used)}/{render.size(n.mem)}",
            ", ".join(sorted({g.name for g in n.gpus})) or "-",
            n.reason,
        )
        for n in found
    ]
    click.echo(render.table(("NODE", "STATE", "GPUS", "CPUS", "MEM", "MODEL", "NOTE"), rows))
    return 0


@click.command()
@json_option
@click.pass_obj
def status(obj: Any, /, as_json: bool) -> int:
    """At a glance: every GPU (who holds it, memory in use) and my jobs."""
    client = obj.client()
    found = client.nodes()
    me = getpass.getuser()
    jobs = client.list_raw(user=me)
    if as_json:
        click.echo(
            render.dumps(
                {"nodes": [node_dict(n) for n in found], "jobs": [render.job_dict(j) for j in jobs]}
            )
        )
        return 0
    holder = {uuid: j for j in jobs for uuid in j.gpus if j.state == "running"}
    lines = []
    for node in found:
        fake = " (FAKE GPUs)" if node.fake else ""
        lines.append(
            f"{node.name}: {node.state}{fake}, {len(node.gpus_used)}/{len(node.gpus)} "
            f"GPUs in use, {node.cpus_used}/{node.cpus} CPUs"
            + (f" - {node.reason}" if node.reason else "")
        )
        usage = {u.uuid: u for u in node.usage}
        for gpu in node.gpus:
            used = usage.get(gpu.uuid)
            memory = (
                f"{render.size(used.memory_used)}/{render.size(gpu.memory)}"
                if used
                else f"-/{render.size(gpu.memory)}"
            )
            owner = holder.get(gpu.uuid)
            who = (
                f"job {render.job_id_text(owner)} ({owner.spec.name})"
                if owner
                else "in use"
                if gpu.uuid in node.gpus_used
                else "free"
            )
            lines.append(f"  GPU {gpu.index}  {gpu.name:<28} {memory:>13}  {who}")
    if not found:
        lines.append("no nodes yet: start an agent (gpuq serve runs one)")
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job.state] = counts.get(job.state, 0) + 1
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "none"
    lines.append(f"My jobs ({me}): {summary}")
    for job in jobs:
        lines.append(
            f"  {render.job_id_text(job):>8} {job.spec.name[:24]:<24} "
            f"{render.SHORT_STATE[job.state]:<3} {render.job_reason(job)}"
        )
    click.echo("\n".join(lines))
    return 0
