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
            f"1 ({j.spec.resources.mig})" if j.spec.resources.mig else j.spec.resources.gpus,
            j.qos,
        ]
        if long_:
            row += [render.priority(j), render.factors(j), render.estimated_start(j)]
        flagged = f" [{render.flags_text(j)}]" if j.flags else ""
        rows.append([*row, render.job_reason(j) + flagged])
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
        ended = render.when(j.end_time if j.HasField("end_time") else None)
        rows.append(
            (
                render.job_id_text(j),
                j.spec.name[:16],
                render.SHORT_STATE.get(j.state, j.state),
                code,
                render.elapsed(j, time.time()),
                *render.telemetry_cells(j),
                j.node or "-",
                ended[5:16] if ended != "-" else ended,  # MM-DD HH:MM
                j.reason[:40],
            )
        )
    headers = ("JOBID", "NAME", "ST", "EXIT", "TIME", "VRAM", "UTIL", "KWH", "NODE", "ENDED")
    click.echo(render.table((*headers, "REASON"), rows))
    return 0


def _health(node: Any) -> dict[str, Any]:
    return {h.uuid: h for h in node.health}


def _utilization(usage: Any) -> int | None:
    """Percent, or None when unknown (never 0 for unknown)."""
    return usage.utilization if usage is not None and usage.HasField("utilization") else None


def _vram(gpus: Any) -> int:
    """GPU memory of these units (compute instances that share a MIG GPU instance each report
    their share of it: the agent splits it, so the sum counts it once)."""
    return sum(int(g.memory) for g in gpus)


def _kind(gpu: Any) -> str:
    """ "GPU", or "MIG 3g.71gb" for a slice (the domain's GpuUnit.kind)."""
    from gpuq.convert import unit_from_proto

    return unit_from_proto(gpu).kind


def node_dict(node: Any) -> dict[str, Any]:
    usage = {u.uuid: u for u in node.usage}
    health = _health(node)
    return {
        "name": node.name,
        "state": node.state,
        "reason": node.reason,
        "fake": node.fake,
        "cpus": node.cpus,
        "cpus_used": node.cpus_used,
        "mem": node.mem,
        "mem_used": node.mem_used,
        "gpu_memory": _vram(node.gpus),
        "isolation": node.isolation or None,
        "isolation_advisory": node.isolation.startswith("advisory"),
        "driver": node.driver or None,
        "gpu_problem": node.gpu_problem or None,
        "drain": (
            {"reason": node.drain_reason, "by": node.drained_by, "at": node.drained_at}
            if node.drain_reason
            else None
        ),
        "running_jobs": list(node.running_jobs),
        "gpus": [
            {
                "uuid": g.uuid,
                "index": g.index,
                "kind": _kind(g),
                "mig_profile": g.mig_profile or None,
                "parent_uuid": g.parent_uuid or None,
                "name": g.name,
                "memory": g.memory,
                "allocated": g.uuid in node.gpus_used,
                "memory_used": usage[g.uuid].memory_used if g.uuid in usage else None,
                "utilization": _utilization(usage.get(g.uuid)),
                "health": health[g.uuid].health if g.uuid in health else "ok",
                "health_reason": health[g.uuid].reason if g.uuid in health else "",
                "drained_by": health[g.uuid].drained_by or None if g.uuid in health else None,
                "drained_at": (
                    health[g.uuid].drained_at
                    if g.uuid in health and health[g.uuid].HasField("drained_at")
                    else None
                ),
                "notes": list(usage[g.uuid].notes) if g.uuid in usage else [],
                "jobs": list(usage[g.uuid].job_ids) if g.uuid in usage else [],
            }
            for g in node.gpus
        ],
    }


def node_facts(node: Any) -> str:
    """One line on what the node's agent said about its GPUs: driver, isolation, problems."""
    facts = []
    if node.gpu_problem:
        facts.append(f"no GPUs: {node.gpu_problem}")
    if node.driver:
        facts.append(f"driver {node.driver}")
    if node.isolation.startswith("advisory"):
        why = node.isolation.partition(":")[2].strip()
        facts.append(
            "GPU isolation ADVISORY"
            + (f" ({why})" if why else "")
            + ": only CUDA_VISIBLE_DEVICES separates jobs"
        )
    elif node.isolation:
        facts.append(f"GPU isolation: {node.isolation}")
    if node.drain_reason:
        facts.append(
            f"drained by {node.drained_by or 'admin'} at "
            f"{render.when(node.drained_at if node.HasField('drained_at') else None)}: "
            f"{node.drain_reason}"
        )
    return ", ".join(facts)


def unit_health_text(node: Any, gpu: Any) -> str:
    """`ok`, or `drained by admin: fan (root, 2026-11-30 13:40:00)`, `dirty: pid 4242 ...`,
    with the agent's notes (e.g. a foreign process) after them."""
    found = _health(node).get(gpu.uuid)
    text = found.reason if found is not None and found.health != "ok" else "ok"
    if found is not None and found.drained_by:
        at = render.when(found.drained_at if found.HasField("drained_at") else None)
        text += f" ({found.drained_by}, {at})"
    usage = next((u for u in node.usage if u.uuid == gpu.uuid), None)
    if usage is not None and usage.notes:
        text += "; notes: " + "; ".join(usage.notes)
    return text


def unit_rows(node: Any) -> list[tuple[object, ...]]:
    usage = {u.uuid: u for u in node.usage}
    rows: list[tuple[object, ...]] = []
    for gpu in node.gpus:
        used = usage.get(gpu.uuid)
        util = _utilization(used)
        rows.append(
            (
                gpu.index,
                _kind(gpu),
                gpu.name,
                render.size(gpu.memory),
                render.size(used.memory_used) if used is not None else "-",
                "unknown" if util is None else f"{util}%",
                "yes" if gpu.uuid in node.gpus_used else "no",
                unit_health_text(node, gpu),
            )
        )
    return rows


@click.command()
@json_option
@click.pass_obj
def nodes(obj: Any, /, as_json: bool) -> int:
    """Nodes with their GPUs, CPUs and memory in use; then each node's units: index (as gpuq
    drain takes it), kind (GPU or MIG profile), model, memory, use, health."""
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
            render.size(_vram(n.gpus)) if n.gpus else "-",
            ", ".join(sorted({g.name for g in n.gpus})) or "-",
            n.reason,
        )
        for n in found
    ]
    lines = [
        render.table(("NODE", "STATE", "GPUS", "CPUS", "MEM", "GPU MEM", "MODEL", "NOTE"), rows)
    ]
    for n in found:
        facts = node_facts(n)
        if not n.gpus and not facts:
            continue
        lines.append("")
        lines.append(render.printable(f"{n.name}: {facts}" if facts else f"{n.name}:"))
        if n.gpus:
            table = render.table(
                ("GPU", "KIND", "MODEL", "MEMORY", "USED", "UTIL", "ALLOCATED", "HEALTH"),
                unit_rows(n),
            )
            lines += ["  " + line for line in table.splitlines()]
    click.echo("\n".join(lines))  # each table cell and line went through render.printable
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
        if facts := node_facts(node):
            lines.append(f"  {facts}")
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
            kind = "" if _kind(gpu) == "GPU" else f" {_kind(gpu)}"
            health = unit_health_text(node, gpu)
            shown = "" if health == "ok" else f"  [{health}]"
            lines.append(f"  GPU {gpu.index}{kind}  {gpu.name:<28} {memory:>13}  {who}{shown}")
    if not found:
        lines.append("no nodes yet: start an agent (gpuq serve runs one)")
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job.state] = counts.get(job.state, 0) + 1
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "none"
    lines.append(f"My jobs ({me}): {summary}")
    for job in jobs:
        flagged = f" [{'; '.join(job.flags)}]" if job.flags else ""
        lines.append(
            f"  {render.job_id_text(job):>8} {job.spec.name[:24]:<24} "
            f"{render.SHORT_STATE[job.state]:<3} {render.job_reason(job)}{flagged}"
        )
    # every line is one line of its own: what a user or an agent said is escaped in it
    click.echo("\n".join(render.printable(line) for line in lines))
    return 0


_AGO = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float) -> float:
    """`--since`: an ISO date or date-time (local time unless it has an offset), `today`,
    or how long ago: `30m`, `24h`, `7d`, `2w`."""
    import datetime as dt
    import re

    from gpuq.errors import InvalidInput

    raw = text.strip().lower()
    forms = "expected a date such as 2026-11-01, a date-time, today, or 7d / 24h / 30m / 2w ago"
    if match := re.fullmatch(r"([0-9]{1,6})\s*([mhdw])", raw):
        return now - int(match[1]) * _AGO[match[2]]
    if raw == "today":
        return dt.datetime.combine(dt.datetime.fromtimestamp(now).date(), dt.time()).timestamp()
    try:
        moment = dt.datetime.fromisoformat(text.strip()).timestamp()
    except (ValueError, OverflowError, OSError):
        raise InvalidInput("--since", text[:60], forms) from None
    if moment < 0:
        raise InvalidInput("--since", text[:60], "is before 1970")
    return moment


@click.command()
@click.option("--user", "-u", help="only this user (default: every user, as sreport)")
@click.option("--since", "-S", help="jobs that ended since: 2026-11-01, today, 7d, 24h")
@json_option
@click.pass_obj
def report(obj: Any, /, user: str | None, since: str | None, as_json: bool) -> int:
    """Usage per user over jobs that ran and ended (SLURM's sreport/seff): GPU-hours held,
    energy, and mean utilisation weighted by GPU-hours (over the jobs that measured it)."""
    start = parse_since(since, time.time()) if since is not None else None
    rows = obj.client().report(user=user, since=start)
    data = [render.report_dict(r) for r in rows]
    if as_json:
        click.echo(render.dumps(data))
        return 0
    table = [
        (
            d["user"],
            d["jobs"],
            f"{d['gpu_hours']:.1f}",
            "unknown" if d["energy_kwh"] is None else f"{d['energy_kwh']:.1f}",
            "unknown" if d["mean_util"] is None else f"{d['mean_util']:.0f} %",
            f"{d['measured_gpu_hours']:.1f}",
        )
        for d in data
    ]
    click.echo(
        render.table(("USER", "JOBS", "GPU-HOURS", "KWH", "MEAN UTIL", "MEASURED GPU-H"), table)
    )
    if not data:
        click.echo("no jobs ended in that time")
    return 0
