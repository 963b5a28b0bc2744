"""Listings: status (the glance), queue, nodes, history. Each has --json. (gpuq report and
gpuq eff: gpuq.cli.usage_verbs.)"""

from __future__ import annotations

import getpass
import time
from typing import Any

import click

from gpuq.cli import render
from gpuq.cli.progress_text import progress_cell

json_option = click.option("--json", "as_json", is_flag=True, help="print JSON")


def _split(values: tuple[str, ...]) -> tuple[str, ...]:
    """`-u a,b -u c` -> (a, b, c): each flag repeatable and a comma list, as squeue's."""
    return tuple(part.strip() for v in values for part in v.split(",") if part.strip())


def _states(values: tuple[str, ...]) -> frozenset[Any]:
    """--state words (PD, R, pending, cd...): bad input fails here, before any connection."""
    from gpuq.domain.states import parse_states

    return parse_states(_split(values))


class Look:
    """How this command's output looks, decided when it runs (not at import: a forked helper
    may write to a terminal it did not have when it started): colour, width, ellipsis."""

    def __init__(self, colour_mode: str = "auto") -> None:
        import os
        import sys

        stream = sys.stdout
        self.colour = render.wants_colour(colour_mode, stream, os.environ)
        self.width = render.output_width(stream, os.environ)
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        self.ellipsis = "…" if encoding.startswith("utf") else "~"

    def clip(self, line: str) -> str:
        return line if self.width is None else render.clip(line, self.width, self.ellipsis)


def _format(text: str | None) -> list[Any] | None:
    if text is None:
        return None
    try:
        return render.parse_format(text)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--format") from None


user_option = click.option(
    "--user", "-u", "users", multiple=True, help="only these users' jobs: a,b (repeatable)"
)
name_option = click.option(
    "--name",
    "-n",
    "names",
    multiple=True,
    help="only names matching these shell patterns: 'sweep*',train-? (repeatable)",
)
format_option = click.option(
    "--format",
    "-o",
    "fmt",
    metavar="FORMAT",
    help="squeue's field codes: '%.8i %-20j %u %t %M %b %R' (see the README)",
)
noheader_option = click.option("--noheader", is_flag=True, help="no header line")
colour_option = click.option(
    "--color",
    "--colour",
    "colour_mode",
    type=click.Choice(render.COLOUR_MODES),
    default="auto",
    show_default=True,
    help="colour states: auto is on a terminal only, never with NO_COLOR set",
)

QUEUE_COLUMNS = (
    render.Column("JOBID"),
    render.Column("NAME", shrink=8),
    render.Column("USER", shrink=8),
    render.Column("ST", state=True),
    render.Column("TIME", right=True),
    render.Column("GPUS", right=True),
    render.Column("QOS", drop=1),
)
LONG_COLUMNS = (
    render.Column("PRIORITY", right=True),
    render.Column("QOS+AGE+FAIRSHARE-NICE"),
    render.Column("START"),
    render.Column("PROGRESS"),  # a running job's, for its owner and admins: 12% 3.2it/s ETA ..
)


@click.command()
@user_option
@click.option("--me", is_flag=True, help="only my jobs (with --user: mine too)")
@name_option
@click.option(
    "--state",
    "-t",
    "-s",
    "states",
    multiple=True,
    help="only these states: names or SLURM codes, e.g. PD,R or pending (repeatable)",
)
@click.option("--nodelist", "-w", "nodes", multiple=True, help="only jobs on these nodes: a,b")
@click.option("--array", "-r", "expand", is_flag=True, help="each array task on a line of its own")
@click.option("--long", "-l", "long_", is_flag=True, help="priority, start estimate, progress")
@format_option
@noheader_option
@colour_option
@json_option
@click.pass_obj
def queue(
    obj: Any,
    /,
    users: tuple[str, ...],
    me: bool,
    names: tuple[str, ...],
    states: tuple[str, ...],
    nodes: tuple[str, ...],
    expand: bool,
    long_: bool,
    fmt: str | None,
    noheader: bool,
    colour_mode: str,
    as_json: bool,
) -> int:
    """Pending, held and running jobs, with why each pending job waits. An array's waiting
    tasks show as one line, e.g. 40_[3-99%8] (--array: one line each). Fits the terminal
    (80 columns when piped with COLUMNS=80; nothing cut when piped without it)."""
    wanted = _states(states)
    if ended := sorted(s.value for s in wanted if not s.is_live):
        raise click.BadParameter(
            f"{', '.join(ended)}: gpuq queue lists live jobs; ended ones are in gpuq history",
            param_hint="--state",
        )
    parts = _format(fmt)
    who = _split(users) + ((getpass.getuser(),) if me else ())
    jobs = obj.client().list_raw(
        states=wanted,
        users=who,
        names=_split(names),
        nodes=_split(nodes),
        expand_arrays=expand,
    )
    if as_json:
        click.echo(render.dumps([render.job_dict(j) for j in jobs]))
        return 0
    look, now = Look(colour_mode), time.time()
    if parts is not None:
        lines = render.format_lines(parts, jobs, now, colour=look.colour, header=not noheader)
        click.echo("\n".join(lines), color=look.colour)
        return 0
    # PARTITION only where some job has one (a site without partitions sees no change)
    parted = any(j.spec.placement.partitions for j in jobs)
    columns = [
        *QUEUE_COLUMNS,
        *((render.Column("PARTITION", shrink=6, drop=2),) if parted else ()),
        *(LONG_COLUMNS if long_ else ()),
        render.Column("NODE/REASON"),
    ]
    rows = []
    for j in jobs:
        row = [
            render.job_id_text(j),
            j.spec.name,
            j.user,
            render.SHORT_STATE[j.state],
            render.elapsed(j, now),
            f"1 ({j.spec.resources.mig})" if j.spec.resources.mig else _gpus(j),
            j.qos,
            *((render.partition_text(j),) if parted else ()),
        ]
        if long_:
            row += [render.priority(j), render.factors(j), render.estimated_start(j)]
            row.append(progress_cell(j))
        flagged = f" [{render.flags_text(j)}]" if j.flags else ""
        rows.append([*row, render.job_reason(j) + flagged])
    lines = render.layout(
        columns,
        rows,
        None if long_ else look.width,  # --long: every column, as wide as it takes
        states=[j.state for j in jobs],
        colour=look.colour,
        header=not noheader,
        ellipsis=look.ellipsis,
    )
    if lines:
        click.echo("\n".join(lines), color=look.colour)
    return 0


def _gpus(job: Any) -> str:
    """`2`, or `a100:2` for a GPU model: over all the job's nodes."""
    res = job.spec.resources
    count = render.total_gpus(res)
    return f"{res.gpu_type}:{count}" if res.gpu_type else str(count)


HISTORY_COLUMNS = (
    render.Column("JOBID"),
    render.Column("NAME", shrink=8),
    render.Column("USER", shrink=8, drop=1),
    render.Column("ST", state=True),
    render.Column("EXIT", right=True),
    render.Column("TIME", right=True),
    render.Column("VRAM", right=True, drop=3),
    render.Column("UTIL", right=True, drop=4),
    render.Column("KWH", right=True, drop=5),
    render.Column("NODE", shrink=6, drop=2),
    render.Column("ENDED"),
    render.Column("REASON", shrink=10),
)


@click.command()
@user_option
@click.option("--me", is_flag=True, help="only my jobs (with --user: mine too)")
@click.option(  # -n stays --limit here, as it always was
    "--name", "names", multiple=True, help="only names matching these shell patterns: 'sweep*'"
)
@click.option(
    "--state", "-t", "-s", "states", multiple=True, help="only these endings: CD,F,TO,CA,OOM..."
)
@click.option(
    "--since", "-S", help="ended at or after: 2026-11-01, yesterday, today, -2d, '1h ago'"
)
@click.option("--until", "-E", help="ended before (same forms as --since)")
@click.option("--nodelist", "-w", "nodes", multiple=True, help="only jobs that ran on these nodes")
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(1, 100_000),
    default=20,
    show_default=True,
    help="how many (1 to 100000)",
)
@format_option
@noheader_option
@colour_option
@json_option
@click.pass_obj
def history(
    obj: Any,
    /,
    users: tuple[str, ...],
    me: bool,
    names: tuple[str, ...],
    states: tuple[str, ...],
    since: str | None,
    until: str | None,
    nodes: tuple[str, ...],
    limit: int,
    fmt: str | None,
    noheader: bool,
    colour_mode: str,
    as_json: bool,
) -> int:
    """Finished jobs, newest first; the filters are applied by the database."""
    now = time.time()
    wanted = _states(states)
    parts = _format(fmt)
    start = parse_since(since, now, "--since") if since is not None else None
    end = parse_since(until, now, "--until") if until is not None else None
    who = _split(users) + ((getpass.getuser(),) if me else ())
    jobs = obj.client().list_raw(
        states=wanted,
        finished=True,
        users=who,
        names=_split(names),
        nodes=_split(nodes),
        since=start,
        until=end,
        limit=limit,
    )
    if as_json:
        click.echo(render.dumps([render.job_dict(j) for j in jobs]))
        return 0
    look = Look(colour_mode)
    if parts is not None:
        lines = render.format_lines(parts, jobs, now, colour=look.colour, header=not noheader)
        click.echo("\n".join(lines), color=look.colour)
        return 0
    rows = []
    for j in jobs:
        result = j.result if j.HasField("result") else None
        code = str(result.exit_code) if result and result.HasField("exit_code") else "-"
        ended = render.when(j.end_time if j.HasField("end_time") else None)
        rows.append(
            (
                render.job_id_text(j),
                j.spec.name,
                j.user,
                render.SHORT_STATE.get(j.state, j.state),
                code,
                render.elapsed(j, now),
                *render.telemetry_cells(j),
                render.node_text(j) or "-",
                ended[5:16] if ended != "-" else ended,  # MM-DD HH:MM
                j.reason,
            )
        )
    lines = render.layout(
        HISTORY_COLUMNS,
        rows,
        look.width,
        states=[j.state for j in jobs],
        colour=look.colour,
        header=not noheader,
        ellipsis=look.ellipsis,
    )
    if lines:
        click.echo("\n".join(lines), color=look.colour)
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
        "features": list(node.features),
        "partitions": list(node.partitions),
        "default_partition": node.default_partition or None,
        "gpu_types": _gpu_types(node),
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


def _gpu_types(node: Any) -> list[str]:
    """The types of a node's GPUs, as --gpus TYPE:N and --constraint name them."""
    from gpuq.domain.gpu_types import gpu_type

    return sorted({gpu_type(g.name) for g in node.gpus})


def node_facts(node: Any) -> str:
    """One line on what the node's agent said about its GPUs: driver, isolation, problems;
    its GPU types and features (what --gpus TYPE:N and --constraint match)."""
    facts = []
    if node.gpus:
        facts.append("types " + ",".join(_gpu_types(node)))
    if node.features:
        facts.append("features " + ",".join(node.features))
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


def _partitions(node: Any) -> str:
    """ "debug*,gpu": a node's partitions, `*` after the default one (as sinfo marks it)."""
    marked = [p + ("*" if p == node.default_partition else "") for p in node.partitions]
    return ",".join(marked) or "-"


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
    parted = any(n.partitions for n in found)  # sinfo's PARTITION, where there are any
    rows = [
        (
            n.name,
            n.state + (" (fake GPUs)" if n.fake else ""),
            f"{len(n.gpus_used)}/{len(n.gpus)}",
            f"{n.cpus_used}/{n.cpus}",
            f"{render.size(n.mem_used)}/{render.size(n.mem)}",
            render.size(_vram(n.gpus)) if n.gpus else "-",
            ", ".join(sorted({g.name for g in n.gpus})) or "-",
            *((_partitions(n),) if parted else ()),
            n.reason,
        )
        for n in found
    ]
    headers = ("NODE", "STATE", "GPUS", "CPUS", "MEM", "GPU MEM", "MODEL")
    lines = [render.table((*headers, *(("PARTITION",) if parted else ()), "NOTE"), rows)]
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


RECENT, RECENT_MAX = 3600, 5  # `gpuq status` shows my jobs that ended this long ago, this many


@click.command()
@colour_option
@json_option
@click.pass_obj
def status(obj: Any, /, colour_mode: str, as_json: bool) -> int:
    """At a glance: every GPU (which user's job holds it, memory in use), my jobs, and mine
    that ended in the last hour (the last few); lines fit the terminal (cut with an
    ellipsis). Others' job names show as the coordinator's privacy rule allows
    ([coordinator] private_data)."""
    from gpuq.client import listing_request

    client = obj.client()
    me = getpass.getuser()
    found, (jobs, running, ended) = client.nodes_and_listings(
        listing_request(user=me),
        listing_request(states=["running"]),
        listing_request(user=me, finished=True, since=time.time() - RECENT, limit=RECENT_MAX),
    )
    if as_json:
        data = {
            "nodes": [node_dict(n) for n in found],
            "jobs": [render.job_dict(j) for j in jobs],
            "running": [render.job_dict(j) for j in running],
            "ended": [render.job_dict(j) for j in ended],
        }
        click.echo(render.dumps(data))
        return 0
    holder = {uuid: j for j in running for uuid in j.gpus}
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
                f"{owner.user}: job {render.job_id_text(owner)} ({owner.spec.name})"
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
    if ended:
        summary += f"; {len(ended)} ended in the last hour"
    lines.append(f"My jobs ({me}): {summary}")
    look = Look(colour_mode)
    # every line is one line of its own: what a user or an agent said is escaped in it
    out = [look.clip(render.printable(line)) for line in lines]
    id_width = max([8, *(len(render.printable(render.job_id_text(j))) for j in [*jobs, *ended])])
    out += [_status_job_line(job, look, id_width) for job in jobs]
    if ended:
        out.append(look.clip(f"Ended in the last hour (the last {RECENT_MAX} at most):"))
        out += [_status_job_line(job, look, id_width) for job in ended]
    click.echo("\n".join(out), color=look.colour)
    return 0


def _status_job_line(job: Any, look: Look, id_width: int) -> str:
    """`      42 train-resnet…             R   node1`: the name cut to 24 columns, the state
    coloured after padding, the reason cut to what the width leaves."""
    name = render.clip(render.printable(job.spec.name), 24, look.ellipsis)
    head = f"  {render.printable(render.job_id_text(job)):>{id_width}} {name:<24} "
    code = render.paint(f"{render.SHORT_STATE[job.state]:<3}", job.state, look.colour)
    flagged = f" [{'; '.join(job.flags)}]" if job.flags else ""
    tail = render.printable(f" {render.job_reason(job)}{flagged}")
    if look.width is not None:
        tail = render.clip(tail, max(0, look.width - len(head) - 3), look.ellipsis)
    return (head + code + tail).rstrip()


_AGO = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
    **dict.fromkeys(("w", "week", "weeks"), 7 * 86400),
}
_AGO_RE = r"-?\s*([0-9]{1,6})\s*([a-z]+)(\s+ago)?"


def parse_since(text: str, now: float, flag: str = "--since") -> float:
    """`--since`/`--until`: an ISO date or date-time (local time unless it has an offset),
    `now`, `today`, `yesterday` (their midnight), or how long ago: `30m`, `-2d`, `1h ago`,
    `2 weeks ago` (s, m, h, d, w and their long names)."""
    import datetime as dt
    import re

    from gpuq.errors import InvalidInput

    raw = " ".join(text.split()).lower()[:64]
    forms = "expected 2026-11-01, a date-time, now, today, yesterday, or -2d / 1h ago / 30m"
    if match := re.fullmatch(_AGO_RE, raw):
        if match[2] not in _AGO:
            raise InvalidInput(flag, text[:60], f"unknown unit {match[2]!r}: use s, m, h, d or w")
        return now - int(match[1]) * _AGO[match[2]]
    if raw == "now":
        return now
    if raw in ("today", "yesterday"):
        day = dt.datetime.fromtimestamp(now).date() - dt.timedelta(days=raw == "yesterday")
        return dt.datetime.combine(day, dt.time()).timestamp()
    try:
        moment = dt.datetime.fromisoformat(text.strip()).timestamp()
    except (ValueError, OverflowError, OSError):
        raise InvalidInput(flag, text[:60], forms) from None
    if moment < 0:
        raise InvalidInput(flag, text[:60], "is before 1970")
    return moment
