"""`gpuq web`: a one-time link that signs you in to the coordinator's web dashboard."""

from __future__ import annotations

import time
from typing import Any

import click

from gpuq.cli import render


@click.command()
@click.option("--open", "open_browser", is_flag=True, help="open the link in a web browser")
@click.pass_obj
def web(obj: Any, /, open_browser: bool) -> int:
    """Print a link that signs you in to the web dashboard (cluster, queue, your jobs). The
    link works once, within a minute; the session it opens lasts 12 hours. Keep it to
    yourself: whoever opens it first is signed in as you."""
    reply = obj.client().web_login()
    url = render.printable(reply.url)
    seconds = max(0, round(reply.expires - time.time()))
    click.echo(url)
    click.echo(f"(works once, for the next {seconds} s)", err=True)
    if open_browser:
        import webbrowser

        if not webbrowser.open(reply.url):
            click.echo("gpuq: no web browser could be started; open the link above", err=True)
    return 0
