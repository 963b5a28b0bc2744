"""Calling `gpuq` as a user's shell does, for the CLI helper's tests (the Python stub's and the
C stub's), in a private runtime folder of the test's own (conftest's `runtime` fixture)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from e2e_cluster import Cluster


def call(
    command: list[str],
    cluster: Cluster,
    runtime: Path,
    *args: str,
    mode: str = "",
    cwd: Path | None = None,
    extra: dict[str, str] | None = None,
    stdin: str | None = None,
    stdout: int = subprocess.PIPE,
) -> subprocess.CompletedProcess[str]:
    """`command` (the C stub, or the Python entry) with `args`, GPUQ_CLI_HELPER=`mode`;
    `stdout`: where its output goes (captured unless an fd is given)."""
    env = {**cluster.env, "XDG_RUNTIME_DIR": str(runtime), "GPUQ_CLI_HELPER": mode}
    return subprocess.run(
        [*command, *args],
        cwd=cwd or cluster.root,
        env={**env, **(extra or {})},
        input=stdin,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=30,
    )
