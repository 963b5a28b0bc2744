"""The `gpuq` command. Each verb group lives in its own module; this one wires them together and
turns every error into one line on stderr: exit 2 for bad input (like any usage error), 1 when
the coordinator cannot be reached (the line says how to start it).

Nothing here imports grpc or the store at import time: `gpuq --help` and friends stay fast, and
the client commands load only the client.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

import click

from gpuq.errors import GpuqError, ServerUnavailable


class Context:
    """What every command needs: settings and, lazily, a client."""

    def __init__(self, home: Path | None, config: Path | None) -> None:
        self.home = home
        self.config = config
        self._client: Any = None

    def settings(self) -> Any:
        from gpuq.config import load_settings

        return load_settings(self.config, self.home)

    def client(self) -> Any:
        if self._client is None:
            from gpuq.client import Client

            self._client = Client(settings=self.settings())
        return self._client


# each command's module loads only when that command runs (the CLI must start fast)
COMMANDS = {
    "submit": "gpuq.cli.jobs",
    "status": "gpuq.cli.listings",
    "queue": "gpuq.cli.listings",
    "show": "gpuq.cli.jobs",
    "cancel": "gpuq.cli.jobs",
    "hold": "gpuq.cli.jobs",
    "release": "gpuq.cli.jobs",
    "logs": "gpuq.cli.jobs",
    "history": "gpuq.cli.listings",
    "nodes": "gpuq.cli.listings",
    "cron": "gpuq.cli.cron",
    "serve": "gpuq.cli.daemons",
    "coordinator": "gpuq.cli.daemons",
    "agent": "gpuq.cli.daemons",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = COMMANDS.get(name)
        if module is None:
            return None
        command = getattr(importlib.import_module(module), name)
        assert isinstance(command, click.Command)
        return command


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--home",
    type=click.Path(path_type=Path),
    envvar="GPUQ_HOME",
    help="state folder (default ~/.local/share/gpuq, or /var/lib/gpuq for root)",
)
@click.option(
    "--config",
    type=click.Path(path_type=Path),
    envvar="GPUQ_CONFIG",
    help="config file (default GPUQ_HOME/config.toml, then /etc/gpuq/config.toml)",
)
@click.version_option(package_name="lab-gpu-queue", prog_name="gpuq")
@click.pass_context
def cli(ctx: click.Context, home: Path | None, config: Path | None) -> None:
    """gpuq: a batch queue for shared GPU servers (SLURM's discipline, without its weight)."""
    ctx.obj = Context(home.absolute() if home else None, config)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the command, one line per error, then leave at once (a client
    command has nothing to clean up, and tearing grpc down costs a visible 30 ms)."""
    code = run(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(argv: list[str] | None = None) -> int:
    try:
        result = cli.main(args=argv, prog_name="gpuq", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("gpuq: aborted", err=True)
        return 130
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        return 2
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "gpuq"
        click.echo(f"{command}: error: {exc.format_message()}", err=True)
        return 2
    except click.ClickException as exc:
        click.echo(f"gpuq: error: {exc.format_message()}", err=True)
        return exc.exit_code
    except ServerUnavailable as exc:
        click.echo(f"gpuq: {exc}", err=True)
        return 1
    except GpuqError as exc:
        click.echo(f"gpuq: error: {exc}", err=True)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 141
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    main()
