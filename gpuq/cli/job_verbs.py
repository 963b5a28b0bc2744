"""Verbs on jobs: submit, cancel, hold, release, show, logs."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from gpuq.cli import render
from gpuq.cli.group import EXIT_INTERRUPTED
from gpuq.cli.progress_text import progress_lines
from gpuq.domain.units import format_duration
from gpuq.options import OPTIONS, resolve_submit_args


def submit_options(
    command: Callable[..., Any], skip: frozenset[str] = frozenset()
) -> Callable[..., Any]:
    """The submit flags, from the one table that #GPUQ directives also use (but `skip`)."""
    for option in reversed(OPTIONS):
        if option.name in skip:
            continue
        if option.is_flag:
            decorator = click.option(
                *option.flags, option.name, is_flag=True, default=None, help=option.help
            )
        else:
            decorator = click.option(
                *option.flags,
                option.name,
                multiple=option.multiple,
                metavar=option.metavar,
                help=option.help,
            )
        command = decorator(command)
    return command


class SubmitCommand(click.Command):
    """`gpuq submit`, whose long options may be written as any unambiguous prefix
    (`--part`, `--err`), as sbatch (getopt_long) takes its own."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            resolved, spelled = resolve_submit_args(args)
        except ValueError as exc:
            raise click.UsageError(str(exc), ctx) from None
        ctx.meta[_SPELLED] = spelled
        return super().parse_args(ctx, resolved)


_SPELLED = "gpuq.submit.spelled"  # how the command line wrote each option, for errors


@click.command(cls=SubmitCommand, context_settings={"allow_interspersed_args": False})
@click.argument("script", required=False)
@click.argument("args", nargs=-1)
@click.option("--wrap", metavar="CMD", help="run CMD with /bin/sh instead of a script")
@click.option("--wait", "-W", is_flag=True, help="wait for the job; exit with its exit code")
@click.option("--parsable", is_flag=True, help="print only the job id (the array's, for an array)")
@submit_options
@click.pass_obj
def submit(
    obj: Any,
    /,
    script: str | None,
    args: tuple[str, ...],
    wrap: str | None,
    wait: bool,
    parsable: bool,
    **options: Any,
) -> int:
    """Queue SCRIPT (with ARGS) or --wrap CMD. Options also come from `#GPUQ` and `#SBATCH`
    lines at the top of the script (#GPUQ wins); flags given here win over both. Options
    after SCRIPT are the script's arguments, as with sbatch."""
    if script is not None and wrap is not None:
        raise click.UsageError("give a script or --wrap, not both")
    if script is None and wrap is None:
        raise click.UsageError('give a script to run, or --wrap "CMD"')
    from gpuq.submission import options_after_script

    for flag in options_after_script(args):
        _warn(
            "gpuq submit",
            f"{flag} after the script is passed to the script; put gpuq options before the script",
        )
    spec = build_spec_warning(
        "gpuq submit",
        script=script,
        args=args,
        wrap=wrap,
        defaults=_defaults(obj),
        spelled=click.get_current_context().meta.get(_SPELLED),
        **options,
    )
    from gpuq.directives import asks_to_wait

    wait = wait or asks_to_wait(spec.script)  # `#SBATCH --wait` (-W), as sbatch
    if spec.mail_types and (missing := no_mail_program(obj.settings())):
        _warn("gpuq submit", missing)
    client = obj.client()
    ids = client.submit_spec(spec)
    job_id = ids[0]  # an array's id, for an array
    try:  # from here on the job exists: a Ctrl-C anywhere below leaves it running, and says so
        if parsable:
            click.echo(str(job_id))
        elif spec.array is not None:
            click.echo(f"Submitted array job {job_id} ({len(spec.array.indices)} tasks)")
        else:
            click.echo(f"Submitted job {job_id}")
        if not wait:
            return 0
        ended = client.wait(job_id)
    except KeyboardInterrupt:  # Ctrl-C stops the waiting, not the job: say so, and how
        click.echo(
            f"\ngpuq submit: stopped waiting; job {job_id} keeps running; "
            f"gpuq cancel {job_id} stops it",
            err=True,
        )
        return EXIT_INTERRUPTED
    return ended_exit(ended, job_id)


def ended_exit(job: Any, job_id: object) -> int:
    """`submit --wait`'s and `logs -f`'s exit code for an ended job: 0 when it completed,
    else (with a line on stderr saying how it ended) its exit code, 128 + the signal that
    killed it, or 1."""
    if job.state.value == "completed":
        return 0
    click.echo(f"job {job_id} {job.state.value}: {render.printable(job.reason)}", err=True)
    if job.result is not None and job.result.exit_code is not None and job.result.exit_code:
        return int(job.result.exit_code)
    if job.result is not None and job.result.signal:
        return 128 + int(job.result.signal)
    return 1


def complete_ids(ctx: Any, param: Any, incomplete: str) -> list[Any]:
    """Tab completion of job ids (gpuq.cli.completion, imported only when completing, and
    nothing to offer where that module is missing)."""
    import importlib

    try:
        completion = importlib.import_module("gpuq.cli.completion")
    except ImportError:
        return []
    return list(completion.complete_job_ids(ctx, param, incomplete))


def selection_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`[JOB...] [-u USER] [--state STATE] [--name PATTERN]`, as scancel takes them."""
    for decorator in reversed(
        (
            click.argument("job_ids", nargs=-1, shell_complete=complete_ids),
            click.option(
                "--user", "-u", default="", metavar="USER", help="only USER's jobs (admins)"
            ),
            click.option(
                "--state",
                "-t",
                "states",
                multiple=True,
                metavar="STATE",
                help="only jobs in STATE (PD, HD, R or names; comma lists)",
            ),
            click.option("--name", "-n", default="", metavar="PATTERN", help="only jobs named so"),
            click.option("--verbose", "-v", is_flag=True, help="a line per job, also in bulk"),
        )
    ):
        command = decorator(command)
    return command


def check_selection(
    verb: str, job_ids: tuple[str, ...], user: str, states: tuple[str, ...], name: str
) -> None:
    """Ids or a filter (bad ids and states fail here, before any connection)."""
    from gpuq.domain.dependencies import parse_job_ref
    from gpuq.domain.states import parse_states

    if not (job_ids or user or states or name):
        raise click.UsageError(
            f"name jobs, or select them: gpuq {verb} -u USER, --state STATE, --name PATTERN"
        )
    for job_id in job_ids:
        parse_job_ref(job_id)
    if states:
        parse_states(states)


def report(verb: str, outcomes: Any, verbose: bool = False, bulk: bool = False) -> int:
    """A line per job (`job 12: held`); for a bulk request (filters, or more than
    BULK_LINES jobs) a summary (`held 500 jobs`) unless verbose. Failures are always listed,
    one line each on stderr; exit 2 when any failed."""
    done = [o for o in outcomes if o.done]
    failed = [o for o in outcomes if not o.done]
    if verbose or not (bulk or len(done) > BULK_LINES):
        for outcome in done:
            click.echo(f"job {outcome.job_id}: {render.printable(outcome.message)}")
    else:
        messages = sorted({o.message for o in done})
        what = f": {render.printable(messages[0])}" if len(messages) == 1 else ""
        click.echo(f"{PAST[verb]} {len(done)} job{'s' if len(done) != 1 else ''}{what}")
    for outcome in failed:
        message = render.printable(outcome.message)
        click.echo(f"gpuq {verb}: job {outcome.job_id}: {message}", err=True)
    if bulk and not outcomes:
        click.echo(f"gpuq {verb}: no jobs matched", err=True)
    return 2 if failed else 0


BULK_LINES = 20  # more jobs than this in one request: a summary line (-v: every line)
PAST = {
    "cancel": "cancelled",
    "hold": "held",
    "release": "released",
    "requeue": "requeued",
    "update": "updated",
}


def _act(
    obj: Any,
    /,
    verb: str,
    job_ids: tuple[str, ...],
    user: str = "",
    states: tuple[str, ...] = (),
    name: str = "",
    verbose: bool = False,
    **kwargs: Any,
) -> int:
    check_selection(verb, job_ids, user, states, name)
    act = getattr(obj.client(), verb)  # every outcome, an unknown job's too: one line each
    outcomes = act(*job_ids, user=user, states=states, name=name, missing_ok=True, **kwargs)
    return report(verb, outcomes, verbose, bulk=bool(user or states or name))


@click.command()
@selection_options
@click.option("--reason", default="", help="recorded with the cancellation")
@click.pass_obj
def cancel(
    obj: Any,
    /,
    job_ids: tuple[str, ...],
    user: str,
    states: tuple[str, ...],
    name: str,
    verbose: bool,
    reason: str,
) -> int:
    """Cancel jobs (JOB, ARRAY for every task, ARRAY_TASK for one), or every live job that
    matches -u/--state/--name (`gpuq cancel -u $USER --state PD`). Running jobs get
    SIGTERM, then SIGKILL after the grace period. One request, whatever the count."""
    return _act(obj, "cancel", job_ids, user, states, name, verbose, reason=reason)


@click.command()
@selection_options
@click.pass_obj
def hold(
    obj: Any,
    /,
    job_ids: tuple[str, ...],
    user: str,
    states: tuple[str, ...],
    name: str,
    verbose: bool,
) -> int:
    """Keep pending jobs from starting until released (or every pending job that matches
    -u/--state/--name)."""
    return _act(obj, "hold", job_ids, user, states, name, verbose)


@click.command()
@selection_options
@click.pass_obj
def release(
    obj: Any,
    /,
    job_ids: tuple[str, ...],
    user: str,
    states: tuple[str, ...],
    name: str,
    verbose: bool,
) -> int:
    """Let held jobs start (or every held job that matches -u/--state/--name)."""
    return _act(obj, "release", job_ids, user, states, name, verbose)


@click.command()
@click.argument("job_id", shell_complete=complete_ids)
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@click.pass_obj
def show(obj: Any, /, job_id: str, as_json: bool) -> int:
    """Everything about one job (JOB, ARRAY_TASK such as 40_3, or ARRAY for the array):
    resources, placement, why it waits, its history, and why it ended (gpuq diagnose)."""
    from gpuq.cli.diagnosis_render import diagnosis_dict, diagnosis_text
    from gpuq.domain.dependencies import parse_job_ref

    parse_job_ref(job_id)  # bad input fails here, before any connection
    client = obj.client()
    reply = client.detail_reply(job_id, diagnose=True)
    job, events = client.detail_from(reply)
    array_states = dict(reply.array_states)
    if as_json:
        from google.protobuf.json_format import MessageToDict

        data = render.job_dict(job)
        data["spec"] = MessageToDict(job.spec, preserving_proto_field_name=True)
        data["events"] = [
            {
                "at": e.at,
                "from": e.from_state.value if e.from_state else None,
                "to": e.to_state.value,
                "reason": e.reason,
                "cause": e.cause,  # "" where it was not kept (events from before 0011)
            }
            for e in events
        ]
        if array_states:
            data["array_states"] = array_states
        data["efficiency"] = render.efficiency_line(job, _capacity(client, job))
        if reply.diagnosis.verdicts:
            data["diagnosis"] = diagnosis_dict(reply.diagnosis)
        click.echo(render.dumps(data))
        return 0
    click.echo(_describe(job, events, array_states, _capacity(client, job)))
    if [v.name for v in reply.diagnosis.verdicts] not in ([], ["completed"]):
        click.echo(diagnosis_text(reply.diagnosis, "Diagnosis"))
    return 0


def _capacity(client: Any, job: Any) -> int | None:
    """The memory of the job's GPUs together, from the nodes' listing (None: unknown, or
    nothing measured to compare it with). Units that share memory (MIG compute instances of
    one GPU instance) count once per distinct figure only as far as the listing tells."""
    from gpuq.errors import GpuqError

    if not job.HasField("telemetry") or not job.gpus:
        return None
    try:
        where = set(job.nodes) or {job.node}
        memory = {g.uuid: g.memory for n in client.nodes() if n.name in where for g in n.gpus}
    except GpuqError:
        return None
    if not all(memory.get(u) for u in job.gpus):
        return None
    return int(sum(memory[u] for u in job.gpus))


def telemetry_lines(job: Any, capacity: int | None = None) -> list[tuple[str, str]]:
    """`gpuq show`'s figures (as seff prints them) and the coordinator's flags."""
    lines: list[tuple[str, str]] = []
    if job.flags:
        lines.append(("Flags", render.flags_text(job)))
    lines += progress_lines(job)  # a running job's, for its owner and admins
    efficiency = render.efficiency_line(job, capacity)
    if efficiency is None:
        return lines
    if job.HasField("telemetry"):
        t = job.telemetry
        p95 = f"{t.util_p95:.0f} %" if t.HasField("util_p95") else "unknown"
        so_far = " so far" if job.state == "running" else ""
        lines.append(
            (
                "GPU telemetry",
                f"peak VRAM {render.size(t.peak_gpu_mem)}, util p95 {p95}, {t.samples} samples "
                f"over {format_duration(t.seconds)}{so_far}",
            )
        )
        for u in t.units:
            util = f"{u.util_mean:.0f} %" if u.HasField("util_mean") else "unknown"
            energy = render.energy_text(u.energy) if u.HasField("energy") else "unknown"
            lines.append(
                (
                    "unit",
                    f"{u.uuid}: peak {render.size(u.peak_mem)}, mean util {util}, energy {energy}",
                )
            )
    lines.append(("Efficiency", efficiency))
    return lines


def _resources(res: Any) -> str:
    gpu_mem = f" with >= {render.size(res.gpu_mem)}" if res.HasField("gpu_mem") else ""
    mem = "all" if res.mem_all else render.size(res.mem) if res.HasField("mem") else "-"
    limit = format_duration(res.time_limit) if res.HasField("time_limit") else "qos default"
    gpus = f"1 MIG {res.mig} slice" if res.mig else f"{res.gpus} GPUs"
    if res.gpu_type:
        gpus = f"{res.gpu_type}: {gpus}"
    if res.gpu_share:
        gpus, gpu_mem = f"a {res.gpu_share}% share of 1 GPU", f" with {render.size(res.gpu_mem)}"
    each = "per node: " if render.node_count(res) > 1 else ""
    return f"{each}{gpus}{gpu_mem}, {res.cpus} CPUs, mem {mem}, time {limit}"


def _describe(
    job: Any, events: list[Any], array_states: dict[str, int], capacity: int | None = None
) -> str:
    res = job.spec.resources
    lines = [
        ("Job", f"{render.job_id_text(job)} ({job.spec.name})"),
        ("User", job.user),
        ("State", job.state + (f" ({job.stop_reason})" if job.stop_reason else "")),
        ("QOS / priority", f"{job.qos} / {job.priority}"),
        ("Script", job.spec.source + (" " + " ".join(job.spec.args) if job.spec.args else "")),
        ("Folder", job.spec.workdir),
        ("Resources", _resources(res)),
        *render.layout_lines(job),
        ("Placement", render.placement_text(job.spec.placement)),
        ("Node", render.node_text(job) or "-"),
        (
            "GPUs",
            (", ".join(job.gpus) or "-")
            + (f" (enforced: {job.gpu_enforcement})" if job.gpu_enforcement else ""),
        ),
        ("Submitted", render.when(job.submit_time)),
        ("Started", render.when(job.start_time if job.HasField("start_time") else None)),
        ("Ended", render.when(job.end_time if job.HasField("end_time") else None)),
        (
            "Output",
            job.stdout_path
            + ("" if job.stderr_path == job.stdout_path else f" (stderr: {job.stderr_path})"),
        ),
    ]
    if job.HasField("result"):
        result = job.result
        code = str(result.exit_code) if result.HasField("exit_code") else "-"
        sig = f", signal {result.signal}" if result.HasField("signal") else ""
        lines.append(("Result", f"exit code {code}{sig}: {result.reason}"))
    if array_states:
        total = sum(array_states.values())
        counts = ", ".join(f"{n} {state}" for state, n in sorted(array_states.items()))
        lines.append(("Array", f"{job.array_job_id}: {total} tasks: {counts}"))
    if job.requeue_count:
        lines.append(("Requeued", f"{job.requeue_count} times"))
    if job.spec.mail_types:
        to = job.spec.mail_user or ("(hidden)" if not job.spec.script else job.user)
        lines.append(("Mail", f"{','.join(job.spec.mail_types)} to {to}"))
    if job.spec.notify_url:
        lines.append(("Notify", job.spec.notify_url))
    lines += telemetry_lines(job, capacity)
    if job.state == "pending":
        lines.append(("Waiting because", render.job_reason(job)))
        lines.append(
            ("Priority", f"{render.priority(job)} = qos+age+fairshare-nice {render.factors(job)}")
        )
        lines.append(("Estimated start", render.estimated_start(job)))
    width = max(len(k) for k, _ in lines)
    # every value is what a user, an agent or the coordinator said: escaped, one line each
    text = [f"{k.rjust(width)}: {render.printable(v)}" for k, v in lines]
    # each event: when, from -> to, its reason, and [what caused it] where that is known
    text.append("History:")
    text += [
        f"  {render.when(e.at)}  {(e.from_state.value if e.from_state else '-'):>13} -> "
        f"{e.to_state.value:<13} {render.printable(e.reason)}"
        + (f" [{render.printable(e.cause)}]" if e.cause else "")
        for e in events
    ]
    return "\n".join(text)


@click.command()
@click.argument("job_id", shell_complete=complete_ids)
@click.option(
    "--follow", "-f", is_flag=True, help="keep printing until the job ends; exit as --wait"
)
@click.option("--stderr", "-e", "errors", is_flag=True, help="the error file, if separate")
@click.pass_obj
def logs(obj: Any, /, job_id: str, follow: bool, errors: bool) -> int:
    """Print what a job (JOB or ARRAY_TASK, e.g. 40_3) wrote (its output file). With -f, exit
    with the job's end as `submit --wait` does. A started job's file that is gone: a line
    saying so, exit 1."""
    from gpuq.domain.dependencies import parse_job_ref

    parse_job_ref(job_id)
    client = obj.client()
    named = client.output_path(job_id, "stderr" if errors else "stdout")
    path = Path(named)
    offset = _copy_from(path, 0) if named else 0
    job = client.get(job_id)
    while follow and job.state.is_live:
        time.sleep(0.25)
        offset = _copy_from(path, offset) if named else offset
        job = client.get(job_id)
    if follow and named:
        offset = _copy_from(path, offset)
    code = ended_exit(job, job_id) if follow else 0
    if named and job.start_count and not path.exists() and not path.is_symlink():
        click.echo(
            f"gpuq logs: job {job_id}'s output file {render.printable(named)} is gone "
            "(removed after the job started)",
            err=True,
        )
        return code or 1
    return code


def _copy_from(path: Path, offset: int) -> int:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return offset
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    return offset + len(data)


def no_mail_program(settings: Any) -> str | None:
    """Why --mail-type will send nothing, where that can be seen from here: the coordinator
    runs on this machine (its Unix socket) and its [coordinator] mail_program, which sends
    every mail (gpuq.coordinator.notification_sending), is missing. A coordinator reached
    over TCP is on another machine: not checked."""
    if not settings.client_address().startswith("unix:"):
        return None
    program = settings.coordinator.mail_program
    if os.access(program, os.X_OK):
        return None
    return (
        f"--mail-type: no mail will be sent: this machine has no mail program "
        f"([coordinator] mail_program {program} is missing); the admin installs one (a "
        "sendmail-compatible MTA: postfix, msmtp-mta) or sets mail_program"
    )


def _defaults(obj: Any) -> dict[str, Any]:
    """A user's own defaults, GPUQ_NOTIFY and GPUQ_MAIL_TYPE in their environment (a line in
    ~/.bashrc), else the site's `[client] notify_url` and `mail_type`: used where the script
    and the command line set neither."""
    client = obj.settings().client
    found: dict[str, Any] = {}
    if notify := os.environ.get("GPUQ_NOTIFY") or client.notify_url:
        found["notify"] = notify
    if mail_type := os.environ.get("GPUQ_MAIL_TYPE") or client.mail_type:
        found["mail_type"] = mail_type
    return found


def build_spec_warning(command: str, /, **kwargs: Any) -> Any:
    """build_spec, with each of its warnings (an `#SBATCH` option gpuq does not use...) as
    one line on stderr: `gpuq submit: warning: ...`."""
    from gpuq.submission import build_spec

    notes: list[str] = []
    spec = build_spec(warnings=notes, **kwargs)
    for note in notes:
        _warn(command, note)
    return spec


def _warn(command: str, text: str) -> None:
    click.echo(f"{command}: warning: {render.printable(text)}", err=True)
