"""`gpuq slurm-shims DIR`: SLURM's command names in DIR, each a one-line shell script that
runs gpuq.slurm.commands with the Python this gpuq is installed in (so a shim works from any
PATH, without the venv activated). A file there that is not such a shim is never replaced:
DIR may be a folder of other tools, or a real SLURM's."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from gpuq.errors import InvalidInput
from gpuq.slurm.commands import COMMANDS

# the second line of every shim: how a shim is told from any other file of that name
MARK = "# gpuq slurm shim:"


def shim_text(command: str, python: str) -> str:
    """The shim for `command`: exec this Python on the module, the arguments unchanged."""
    return (
        "#!/bin/sh\n"
        f"{MARK} SLURM's {command} on gpuq (gpuq slurm-shims; never where a real SLURM runs)\n"
        f'exec {shlex.quote(python)} -m gpuq.slurm.commands {command} "$@"\n'
    )


def is_shim(path: Path) -> bool:
    """Whether `path` is a regular file that gpuq wrote as a shim."""
    if path.is_symlink() or not path.is_file():
        return False
    with path.open("rb") as handle:
        head = handle.read(512)
    return MARK.encode() in head


def write_shims(folder: Path, python: str) -> list[Path]:
    """Write (or refresh) every shim in `folder`, made if missing; mode 0755. Refuses, before
    writing any, when one of the names is taken by something that is not gpuq's shim."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / command for command in COMMANDS]
    for path in paths:
        if (path.exists() or path.is_symlink()) and not is_shim(path):
            raise InvalidInput(
                "DIR", str(path), "is not one of gpuq's shims; refusing to replace it"
            )
    for command, path in zip(COMMANDS, paths, strict=True):
        temporary = path.with_name(f".{command}.gpuq-new")
        temporary.write_text(shim_text(command, python))
        temporary.chmod(0o755)
        os.replace(temporary, path)
    return paths
