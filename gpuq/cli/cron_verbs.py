"""`gpuq cron` (add, list, remove): recurring jobs (SLURM's scrontab)."""

from __future__ import annotations

from typing import Any

import click

from gpuq.cli import render
from gpuq.cli.job_verbs import build_spec_warning, submit_options


@click.group()
def cron() -> None:
    """Recurring jobs: submit a script at times given in cron syntax.

    A fire missed while the coordinator was down is made up once when it starts (one job,
    however many fires were missed)."""


@cron.command("add")
@click.argument("schedule")
@click.argument("script", required=False)
@click.argument("args", nargs=-1)
@click.option("--wrap", metavar="CMD", help="run CMD with /bin/sh instead of a script")
@submit_options
@click.pass_obj
def add(
    obj: Any,
    /,
    schedule: str,
    script: str | None,
    args: tuple[str, ...],
    wrap: str | None,
    **options: Any,
) -> int:
    """Add an entry: SCHEDULE is five cron fields (minute hour day month weekday, 0 or 7 is
    Sunday), e.g. "0 3 * * *" for 03:00 every day; then the script and the options of
    `gpuq submit`. The script is copied now, as with submit."""
    if (script is None) == (wrap is None):
        raise click.UsageError('give a script to run, or --wrap "CMD"')
    spec = build_spec_warning("gpuq cron add", script=script, args=args, wrap=wrap, **options)
    entry = obj.client().add_cron(schedule, spec)
    click.echo(f"Added cron entry {entry.id}: next run {render.when(entry.next_fire)}")
    return 0


@cron.command("list")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@click.pass_obj
def list_entries(obj: Any, /, as_json: bool) -> int:
    """The entries, with their next run."""
    entries = obj.client().cron_entries()
    rows = [
        {
            "id": e.id,
            "user": e.user,
            "schedule": e.schedule,
            "name": e.spec.name,
            "source": e.spec.source,
            "last_run": e.last_fire if e.HasField("last_fire") else None,
            "next_run": e.next_fire if e.HasField("next_fire") else None,
        }
        for e in entries
    ]
    if as_json:
        click.echo(render.dumps(rows))
        return 0
    click.echo(
        render.table(
            ("ID", "SCHEDULE", "NAME", "NEXT RUN", "SCRIPT"),
            [
                (r["id"], r["schedule"], r["name"], render.when(r["next_run"]), r["source"])
                for r in rows
            ],
        )
    )
    return 0


@cron.command("remove")
@click.argument("entry_ids", nargs=-1, required=True, type=click.IntRange(1, 2**63 - 1))
@click.pass_obj
def remove(obj: Any, /, entry_ids: tuple[int, ...]) -> int:
    """Remove entries (jobs they already submitted stay)."""
    for entry_id in entry_ids:
        obj.client().remove_cron(entry_id)
        click.echo(f"Removed cron entry {entry_id}")
    return 0
