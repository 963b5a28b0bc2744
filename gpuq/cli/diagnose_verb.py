"""`gpuq diagnose JOB`: why a job ended as it did, as ranked verdicts with their evidence and a
next step (gpuq.domain.diagnosis, computed by the coordinator)."""

from __future__ import annotations

from typing import Any

import click

from gpuq.cli import render
from gpuq.cli.diagnosis_render import diagnosis_dict, diagnosis_text
from gpuq.cli.job_verbs import complete_ids


@click.command()
@click.argument("job_id", shell_complete=complete_ids)
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@click.pass_obj
def diagnose(obj: Any, /, job_id: str, as_json: bool) -> int:
    """Why JOB (or ARRAY_TASK such as 40_3) ended as it did: the verdict first, with its
    evidence and a suggested next step, then anything else found."""
    from gpuq.domain.dependencies import parse_job_ref

    parse_job_ref(job_id)  # bad input fails here, before any connection
    reply = obj.client().detail_reply(job_id, diagnose=True)
    job = reply.job
    if as_json:
        data = {"job": job.id, "state": job.state, **diagnosis_dict(reply.diagnosis)}
        click.echo(render.dumps(data))
        return 0
    click.echo(diagnosis_text(reply.diagnosis, f"Job {render.job_id_text(job)} ({job.state})"))
    return 0
