"""The `gpuq` command group: each verb lives in a module of its own (gpuq.cli.verbs names
them); this one wires them together and turns every error into one line on stderr, never a
traceback. `run(argv)` is the one implementation of a CLI call, whether it runs in the `gpuq`
process itself or in a child of the CLI helper (gpuq.cli.fast). Exit codes:

    0    done
    1    the command ran but did not succeed as asked (a job that failed under `submit --wait`
         exits with the job's own code instead; a file or system error)
    2    bad input: a usage error, an invalid value or config setting, no such job, not allowed
    3    unavailable, retry later: no coordinator answers, the store cannot be reached, or
         another coordinator already serves this GPUQ_HOME or database
    4    internal error: a bug in gpuq (GPUQ_DEBUG=1 shows the traceback)
    130  interrupted (Ctrl-C)

Nothing here imports grpc or the store at import time: `gpuq --help` and friends stay fast, and
the client commands load only the client.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import click

from gpuq.cli.verbs import VERBS
from gpuq.errors import GpuqError, ServerUnavailable, StorageUnavailable

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130
DEBUG_VAR = "GPUQ_DEBUG"


class Context:
    """What every command needs: settings and, lazily, a client."""

    def __init__(self, home: Path | None, config: Path | None) -> None:
        self.home = home
        self.config = config
        self._client: Any = None
        self._settings: Any = None

    def settings(self) -> Any:
        """Read once per command: a command and its client see one reading of the file."""
        if self._settings is None:
            from gpuq.config.loading import load_settings

            self._settings = load_settings(self.config, self.home)
        return self._settings

    def client(self) -> Any:
        if self._client is None:
            settings = self.settings()
            # a client a CLI helper's spare connected while it waited, if any
            from gpuq.cli.fast.warm_client import client_for

            self._client = client_for(settings)
        return self._client


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(VERBS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = VERBS.get(name)
        if module is None:
            return None
        command = getattr(importlib.import_module(module), name.replace("-", "_"))
        assert isinstance(command, click.Command)
        return command


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="Exit codes: 0 done, 1 did not succeed, 2 bad input or config, 3 unavailable "
    "(no coordinator, or the store cannot be reached: retry later), 4 internal error "
    "(GPUQ_DEBUG=1 shows the traceback), 130 interrupted.",
)
@click.option(
    "--home",
    # not readable by others when a root coordinator's: its sockets are reached by name
    type=click.Path(path_type=Path, readable=False),
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


def run(argv: list[str] | None = None) -> int:
    """Run one CLI call; its exit code (every error already said in one line on stderr)."""
    # grpc's own log lines (a failed TLS handshake) would make a one-line error two; the
    # daemons set their logging up themselves
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        result = cli.main(args=argv, prog_name="gpuq", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("gpuq: aborted", err=True)
        return EXIT_INTERRUPTED
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        return EXIT_BAD_INPUT
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "gpuq"
        click.echo(f"{command}: error: {printable(exc.format_message())}", err=True)
        return EXIT_BAD_INPUT
    except click.ClickException as exc:
        click.echo(f"gpuq: error: {printable(exc.format_message())}", err=True)
        return exc.exit_code
    except (ServerUnavailable, StorageUnavailable) as exc:
        click.echo(f"gpuq: {printable(exc)}", err=True)
        return EXIT_UNAVAILABLE
    except GpuqError as exc:
        click.echo(f"gpuq: error: {printable(exc)}", err=True)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 141
    except OSError as exc:  # the system said no: a file, a folder, a permission
        _debug_traceback()
        click.echo(f"gpuq: error: {printable(_os_error(exc))}", err=True)
        return EXIT_FAILED
    except Exception as exc:  # a bug: one line, and where to find the details
        _debug_traceback()
        hint = "" if os.environ.get(DEBUG_VAR) else f" (set {DEBUG_VAR}=1 to see the traceback)"
        line = printable(f"{type(exc).__name__}: {_one_line(exc)}")
        click.echo(f"gpuq: internal error: {line}{hint}", err=True)
        return EXIT_INTERNAL
    return result if isinstance(result, int) else EXIT_OK


def printable(text: object) -> str:
    """An error message as printed: what a user, a server or an agent put in it escaped
    (gpuq.cli.render.printable), imported only when an error is printed."""
    from gpuq.cli.render import printable as escaped

    return escaped(text)


def _debug_traceback() -> None:
    """The traceback with GPUQ_DEBUG=1, or in a daemon's log at --log-level debug."""
    if os.environ.get(DEBUG_VAR):
        traceback.print_exc(file=sys.stderr)
    elif logging.getLogger().handlers:
        logging.getLogger("gpuq").debug("the traceback", exc_info=True)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:500] + "..." if len(text) > 500 else text


def _os_error(exc: OSError) -> str:
    """`Permission denied: /var/lib/gpuq` rather than `[Errno 13] Permission denied: '...'`."""
    if exc.strerror is None:
        return _one_line(exc)
    names = [n for n in (exc.filename, exc.filename2) if n is not None]
    where = " -> ".join(os.fsdecode(n) for n in names)
    return f"{exc.strerror}: {where}" if where else exc.strerror
