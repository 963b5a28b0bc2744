"""`gpuq completion bash|zsh|fish`: the shell's completion script, and job ids that complete.

The script is click's own (shell_completion): the shell calls `gpuq` again with
`_GPUQ_COMPLETE=<shell>_complete` and the words typed so far, and click answers with the
candidates. The script is printed from here, in this process (no second `gpuq` run).

Job ids complete from one ListJobs call for the caller's live jobs, with a short deadline:
completion runs on every Tab, so it never prints an error and never waits on a coordinator
that is down; no coordinator means no candidates, at once.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import click
from click.shell_completion import CompletionItem, get_completion_class

PROG = "gpuq"
COMPLETE_VAR = "_GPUQ_COMPLETE"
SHELLS = ("bash", "zsh", "fish")
TIMEOUT = 1.0  # seconds for the one ListJobs call a Tab makes
MAX_CANDIDATES = 500

INSTALL = {
    "bash": 'eval "$(gpuq completion bash)"  # in ~/.bashrc',
    "zsh": 'eval "$(gpuq completion zsh)"  # in ~/.zshrc, after compinit',
    "fish": "gpuq completion fish > ~/.config/fish/completions/gpuq.fish",
}


def script(shell: str) -> str:
    """The completion script for `shell`, as `_GPUQ_COMPLETE=<shell>_source gpuq` prints it
    (the script names only the program and the variable, so any command object will do)."""
    cls = get_completion_class(shell)
    if cls is None:  # click.Choice has already refused it
        raise click.BadParameter(f"no completion for {shell}", param_hint="SHELL")
    return cls(click.Command(PROG), {}, PROG, COMPLETE_VAR).source()


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> int:
    """Print the Tab-completion script for SHELL (commands, options, your job ids).

    \b
    bash:  eval "$(gpuq completion bash)"     (in ~/.bashrc)
    zsh:   eval "$(gpuq completion zsh)"      (in ~/.zshrc, after compinit)
    fish:  gpuq completion fish > ~/.config/fish/completions/gpuq.fish
    """
    click.echo(script(shell), nl=False)
    return 0


def _settings(ctx: click.Context) -> Any:
    """The settings the command line names (--home, --config, or their variables): during
    completion the root command's callback does not run, so ctx.obj is not there yet."""
    from gpuq.config.loading import load_settings

    root = ctx.find_root()
    obj = root.obj
    if obj is not None and hasattr(obj, "settings"):
        return obj.settings()
    home = root.params.get("home") or os.environ.get("GPUQ_HOME") or None
    config = root.params.get("config") or os.environ.get("GPUQ_CONFIG") or None
    from pathlib import Path

    return load_settings(Path(config) if config else None, Path(home).absolute() if home else None)


def job_candidates(jobs: Any, incomplete: str) -> list[CompletionItem]:
    """Ids a user can type for these jobs (`42`, `40_3`, `40` for an array's waiting
    tasks), the ones that start with `incomplete`, with the job's name as help."""
    from gpuq.cli.render import printable

    found: dict[str, str] = {}
    for job in jobs:
        if job.array_tasks:  # a collapsed array: the array's id stands for its tasks
            ident = str(job.array_job_id)
        elif job.HasField("array_job_id"):
            ident = f"{job.array_job_id}_{job.array_task_id}"
        else:
            ident = str(job.id)
        if ident.startswith(incomplete) and ident not in found:
            found[ident] = printable(f"{job.spec.name} ({job.state})")
    return [CompletionItem(i, help=h) for i, h in list(found.items())[:MAX_CANDIDATES]]


def complete_job_ids(ctx: click.Context, param: Any, incomplete: str) -> list[CompletionItem]:
    """shell_complete= for job id arguments: the caller's live jobs, from one ListJobs call
    with a TIMEOUT deadline; silent and empty on any error (no coordinator, no permission,
    a bad config): a Tab must never print or hang."""
    import getpass

    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    client = None
    try:
        from gpuq.client import Client

        client = Client(settings=_settings(ctx), timeout=TIMEOUT)
        jobs = client.list_raw(users=[getpass.getuser()])
        return job_candidates(jobs, incomplete)
    except Exception:  # completion says nothing, whatever went wrong
        return []
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
