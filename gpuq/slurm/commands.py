"""`python -m gpuq.slurm.commands NAME ARGS...`: what each shim that `gpuq slurm-shims`
writes runs. One place turns every outcome into SLURM's: a line on stderr prefixed with the
command's name (`sbatch: error: ...`) and exit code 1 for anything that did not work (SLURM's
commands use 1 for bad options, unknown jobs and an unreachable controller alike), never a
traceback.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Sequence

from gpuq.errors import GpuqError
from gpuq.slurm.arguments import Refused
from gpuq.slurm.formats import FormatError

EXIT_ERROR = 1


def _handlers() -> dict[str, Callable[[Sequence[str]], int]]:
    from gpuq.slurm import job_commands, listing_commands

    return {
        "sbatch": job_commands.sbatch,
        "scancel": job_commands.scancel,
        "scontrol": job_commands.scontrol,
        "srun": job_commands.srun,
        "salloc": job_commands.salloc,
        "squeue": listing_commands.squeue,
        "sacct": listing_commands.sacct,
        "sinfo": listing_commands.sinfo,
    }


COMMANDS = ("sbatch", "squeue", "scancel", "sinfo", "sacct", "srun", "salloc", "scontrol")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one SLURM command: `argv` is its name, then its arguments."""
    words = list(sys.argv[1:] if argv is None else argv)
    if not words or words[0] not in COMMANDS:
        sys.stderr.write(f"gpuq.slurm: give one of {', '.join(COMMANDS)}\n")
        return EXIT_ERROR
    name, args = words[0], words[1:]
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        return _handlers()[name](args)
    except Refused as exc:
        return _say(name, str(exc))
    except FormatError as exc:
        return _say(name, f"error: {exc}")
    except GpuqError as exc:
        return _say(name, f"error: {_printable(exc)}")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 141
    except OSError as exc:
        return _say(name, f"error: {_printable(exc.strerror or exc)}: {exc.filename or ''}")
    except Exception as exc:  # a bug: one line, as gpuq's own CLI says it (gpuq.cli.group)
        if os.environ.get("GPUQ_DEBUG"):
            traceback.print_exc()
        return _say(name, f"internal error: {type(exc).__name__}: {_printable(exc)}")


def _say(name: str, line: str) -> int:
    sys.stderr.write(f"{name}: {line}\n")
    return EXIT_ERROR


def _printable(text: object) -> str:
    from gpuq.cli.render import printable

    return printable(text)


if __name__ == "__main__":
    sys.exit(main())
