"""`gpuq admin doctor`: check this machine (gpuq.admin.doctor does the work and the printing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


@click.command()
@click.option("--json", "as_json", is_flag=True, help="print the checks as JSON")
@click.option(
    "--root",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    hidden=True,
    help="read /proc, /sys, /dev and /run below this folder (a fake machine, for tests)",
)
@click.pass_obj
def doctor(obj: Any, /, as_json: bool, root: Path | None) -> int:
    """Check this machine: its configuration, clock, coordinator, certificates, key files,
    run folder, GPUs and cgroups. One line per check (ok, warn, FAIL, skip) with how to fix
    what is wrong. Exit status 1 when a check fails (jobs would fail or run unisolated
    here), else 0."""
    from gpuq.admin.doctor import doctor_context, exit_status, render_json, render_text, run_checks

    checks = run_checks(doctor_context(obj.config, obj.home, root))
    click.echo(render_json(checks) if as_json else render_text(checks))
    return exit_status(checks)
