"""Admin verbs: drain and resume a node or one of its GPUs (SLURM's drain: running jobs
continue, no new work goes there)."""

from __future__ import annotations

from typing import Any

import click

from gpuq.cli import render


@click.command()
@click.argument("target", metavar="NODE[:GPU]")
@click.option("--reason", required=True, help="why (shown in gpuq nodes and pending reasons)")
@click.pass_obj
def drain(obj: Any, /, target: str, reason: str) -> int:
    """Take a node, or one GPU of it, out of service: no new jobs start there, running jobs
    continue. GPU: its index as gpuq nodes shows it (every MIG slice of that GPU), or a GPU or
    MIG UUID. Kept until gpuq resume, also across coordinator restarts."""
    reply = obj.client().drain(target, reason)
    click.echo(render.printable(reply.message))
    return 0


@click.command()
@click.argument("target", metavar="NODE[:GPU]")
@click.pass_obj
def resume(obj: Any, /, target: str) -> int:
    """Undo gpuq drain of a node or a GPU. A GPU its agent reports unhealthy or dirty stays
    out of service until the agent says it is ok (the message says so)."""
    reply = obj.client().resume(target)
    click.echo(render.printable(reply.message))
    return 0
