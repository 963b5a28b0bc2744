"""Usage and right-sizing: `gpuq report` (SLURM's sreport: usage per user; `--advice`: what a
user's jobs would have fitted, and whose GPUs sat idle) and `gpuq eff JOB` (SLURM's seff: what
a job asked for against what it used). The coordinator gathers the figures and the pure rules
of gpuq.domain.right_sizing decide; this module prints them."""

from __future__ import annotations

import time
from typing import Any

import click

from gpuq.cli import render
from gpuq.cli.listings import json_option, parse_since


@click.command()
@click.option("--user", "-u", help="only this user (default: every user, as sreport)")
@click.option("--since", "-S", help="jobs that ended since: 2026-11-01, today, 7d, 24h")
@click.option(
    "--advice",
    is_flag=True,
    help="also right-sizing advice for the user's jobs (default: yours) per job name, and "
    "the users whose GPUs sat idle",
)
@json_option
@click.pass_obj
def report(obj: Any, /, user: str | None, since: str | None, advice: bool, as_json: bool) -> int:
    """Usage per user over jobs that ran and ended (SLURM's sreport/seff): GPU-hours held,
    energy, and mean utilisation weighted by GPU-hours (over the jobs that measured it).
    --advice: per job name, a --gpu-mem, MIG slice, MPS share or --time that would have
    fitted (over the last 30 days unless --since), and the users whose GPUs sat idle."""
    start = parse_since(since, time.time()) if since is not None else None
    client = obj.client()
    reply = client.advice(user=user, since=start) if advice else None
    rows = list(reply.rows) if reply is not None else client.report(user=user, since=start)
    data = [render.report_dict(r) for r in rows]
    if as_json:
        if reply is None:
            click.echo(render.dumps(data))
        else:
            click.echo(render.dumps({"usage": data, **advice_dict(reply)}))
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
    if reply is not None:
        click.echo("")
        import getpass

        click.echo(advice_text(reply, user or getpass.getuser(), since))
    return 0


@click.command()
@click.argument("job")
@json_option
@click.pass_obj
def eff(obj: Any, /, job: str, as_json: bool) -> int:
    """What JOB asked for against what it used (SLURM's seff): time, GPUs, GPU memory, host
    memory, energy, and one line for each resource that was badly sized. A running job's
    figures are so far."""
    from gpuq.domain.dependencies import parse_job_ref

    job_id, task = parse_job_ref(job)  # bad input fails here, before any connection
    client = obj.client()
    if task is not None:  # a task of an array: its own job id
        job_id = client.detail_reply(job).job.id
    reply = client.efficiency(job_id)
    data = efficiency_dict(reply)
    click.echo(render.dumps(data) if as_json else efficiency_text(reply, data))
    return 0


# ---- what they print ---------------------------------------------------------------------------


def _size(value: int | None) -> str:
    from gpuq.domain.right_sizing import gib

    return "unknown" if value is None else f"{gib(value)} GiB"


def _percent(part: float, whole: float) -> float | None:
    return round(100 * part / whole, 1) if whole else None


def efficiency_dict(reply: Any) -> dict[str, Any]:
    """`gpuq eff --json`: the figures (sizes in bytes, times in seconds; null: unknown)."""
    job = reply.job
    res = job.spec.resources
    started = job.HasField("start_time")
    end = job.end_time if job.HasField("end_time") else time.time()
    elapsed = max(0.0, end - job.start_time) if started else None
    measured = render.telemetry_dict(job)
    peak = None
    if job.HasField("telemetry"):
        peaks = [u.peak_mem for u in job.telemetry.units]
        peak = max(peaks) if peaks else job.telemetry.peak_gpu_mem // max(1, len(job.gpus))
    asked_gpu_mem = res.gpu_mem if res.HasField("gpu_mem") else None
    energy = measured["energy_joules"] if measured else None
    return {
        "job_id": render.job_id_text(job),
        "user": job.user,
        "name": job.spec.name,
        "state": job.state,
        "started": started,
        "elapsed": elapsed,
        "time_limit": reply.time_limit or None,
        "time_used_percent": _percent(elapsed or 0.0, reply.time_limit) if started else None,
        "gpus_asked": render.total_gpus(res),
        "gpus": list(job.gpus),
        "gpu_mem_asked": asked_gpu_mem,
        "card_mem": reply.card_mem or None,
        "gpu_mem_peak": peak,
        "gpu_mem_used_percent": (
            _percent(peak, asked_gpu_mem or reply.card_mem) if peak is not None else None
        ),
        "util_mean": measured["util_mean"] if measured else None,
        "util_p95": measured["util_p95"] if measured else None,
        "mem_asked": res.mem if res.HasField("mem") else None,
        "mem_peak": reply.mem_peak if reply.HasField("mem_peak") else None,
        "cpus": res.cpus,
        "energy_kwh": energy / render.JOULES_PER_KWH if energy is not None else None,
        "telemetry": measured,
        "verdicts": list(reply.verdicts),
    }


def efficiency_text(reply: Any, data: dict[str, Any]) -> str:
    from gpuq.domain.units import format_duration

    job = reply.job
    lines = [
        ("Job", f"{data['job_id']} ({job.spec.name})"),
        ("User", job.user),
        ("State", job.state + (f" ({job.result.reason})" if job.HasField("result") else "")),
    ]
    if not data["started"]:
        lines.append(("Usage", "it has not started: nothing measured yet"))
        return _lines(lines)
    so_far = " so far" if job.state == "running" else ""
    limit = data["time_limit"]
    of = f" of {format_duration(limit)} ({data['time_used_percent']:.0f}%)" if limit else ""
    lines.append(("Elapsed", f"{format_duration(data['elapsed'])}{of}{so_far}"))
    lines.append(("GPUs", f"{data['gpus_asked']} asked: {', '.join(job.gpus) or '-'}"))
    if data["telemetry"] is None:
        lines.append(("GPU usage", "not measured (no telemetry for this job)"))
    else:
        asked = data["gpu_mem_asked"]
        base = f"{_size(asked)} asked" if asked else f"its {_size(data['card_mem'])} GPU"
        peak, whole = data["gpu_mem_peak"], asked or data["card_mem"]
        share = f" ({100 * peak / whole:.0f}%)" if peak is not None and whole else ""
        lines.append(("GPU memory", f"peak {_size(data['gpu_mem_peak'])} of {base}{share}"))
        util, p95 = data["util_mean"], data["util_p95"]
        lines.append(
            (
                "GPU utilisation",
                "unknown"
                if util is None
                else f"mean {util:.0f}%" + (f", p95 {p95:.0f}%" if p95 is not None else ""),
            )
        )
        for unit in data["telemetry"]["units"]:
            mean = "unknown" if unit["util_mean"] is None else f"{unit['util_mean']:.0f}%"
            lines.append(("unit", f"{unit['uuid']}: peak {_size(unit['peak_mem'])}, mean {mean}"))
        kwh = data["energy_kwh"]
        lines.append(
            ("Energy", "unknown" if kwh is None else render.energy_text(kwh * 3.6e6) + so_far)
        )
    asked_mem, mem_peak = data["mem_asked"], data["mem_peak"]
    asked_text = f"{render.size(asked_mem)} asked" if asked_mem else "no --mem asked"
    if mem_peak is None:
        mem_text = f"{asked_text}; peak not reported (its agent reports it when the job ends)"
    else:
        share = f" ({100 * mem_peak / asked_mem:.0f}%)" if asked_mem else ""
        mem_text = f"peak {render.size(mem_peak)} of {asked_text}{share}"
    lines.append(("Host memory", mem_text))
    verdicts = data["verdicts"]
    text = _lines(lines)
    if verdicts:
        text += "\nBadly sized:\n" + "\n".join(f"  {render.printable(v)}" for v in verdicts)
    elif data["telemetry"] is not None:
        text += "\nNothing badly sized" + so_far + "."
    return text


def _lines(lines: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k.rjust(width)}: {render.printable(v)}" for k, v in lines)


def advice_dict(reply: Any) -> dict[str, Any]:
    """`gpuq report --advice --json`: the advice and the idle GPU holders."""

    def known(message: Any, name: str) -> Any:
        return getattr(message, name) if message.HasField(name) else None

    return {
        "advice": [
            {
                "user": a.user,
                "name": a.name,
                "jobs": a.jobs,
                "measured": a.measured,
                "gpu_mem_asked": a.asked_gpu_mem or None,
                "gpu_mem_peak": known(a, "peak_gpu_mem"),
                "gpu_mem_peak_p95": known(a, "peak_gpu_mem_p95"),
                "card_mem": a.card_mem or None,
                "util_p95": known(a, "util_p95"),
                "time_asked": a.asked_time or None,
                "completed": a.completed,
                "run_time_p95": known(a, "run_p95"),
                "timeouts": a.timeouts,
                "suggest": {
                    "gpu_mem": a.gpu_mem or None,
                    "mig": a.mig or None,
                    "gpu_share": a.gpu_share or None,
                    "time": a.time or None,
                },
                "suggestions": list(a.suggestions),
            }
            for a in reply.advice
        ],
        "idle": [
            {"user": h.user, "gpu_hours": h.gpu_seconds / 3600, "mean_util": h.util_mean}
            for h in reply.idle
        ],
    }


def advice_text(reply: Any, user: str, since: str | None) -> str:
    from gpuq.domain.right_sizing import ADVICE_DAYS, IDLE_MIN_GPU_SECONDS, IDLE_UTIL
    from gpuq.domain.units import format_duration

    when = f"since {since}" if since else f"in the last {ADVICE_DAYS} days"
    out = [f"Right-sizing advice for {user}'s jobs that ended {when}:"]
    for a in reply.advice:
        evidence = [f"{a.jobs} jobs"]
        if a.HasField("peak_gpu_mem"):
            base = f"{_size(a.asked_gpu_mem)} asked" if a.asked_gpu_mem else "the GPU"
            if not a.asked_gpu_mem and a.card_mem:
                base = f"its {_size(a.card_mem)} GPU"
            p95 = f" (p95 {_size(a.peak_gpu_mem_p95)})" if a.jobs > 1 else ""
            evidence.append(f"GPU memory peak {_size(a.peak_gpu_mem)}{p95} of {base}")
        if a.HasField("util_p95"):
            evidence.append(f"utilisation p95 {a.util_p95:.0f}%")
        if a.HasField("run_p95"):
            limit = f" of {format_duration(a.asked_time)}" if a.asked_time else ""
            evidence.append(f"run time p95 {format_duration(a.run_p95)}{limit}")
        if a.timeouts:
            evidence.append(f"{a.timeouts} reached the time limit")
        out.append(f"  {render.printable(a.name)}: " + "; ".join(evidence))
        out.append(f"    would fit: {' '.join(a.suggestions)}")
    if not reply.advice:
        out.append("  nothing to suggest: the jobs used about what they asked for")
    out.append("")
    hours = IDLE_MIN_GPU_SECONDS / 3600
    out.append(
        f"Users whose GPUs sat idle (mean utilisation under {IDLE_UTIL:.0f}% over at least "
        f"{hours:.0f} measured GPU-hour{'s' if hours != 1 else ''}):"
    )
    for h in reply.idle:
        out.append(f"  {h.user}: {h.gpu_seconds / 3600:.1f} GPU-hours at {h.util_mean:.0f}% mean")
    if not reply.idle:
        out.append("  none")
    return "\n".join(out)
