"""gpuq: a SLURM-style batch queue for shared GPU servers.

The Python API: `Client` (submit, get, list, cancel, wait, logs), `build_spec` and `JobSpec`
(what a submission says), `Job` and `JobState` (what the queue knows), and the errors.
Everything loads on first use, so that `import gpuq` (and the CLI) stays fast: this module
imports nothing at all (not even typing: the `gpuq` command's stub is timed against a bare
interpreter, see gpuq.cli.fast.stub).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy knows the name)
if TYPE_CHECKING:
    from typing import Any

    from gpuq.client import Client
    from gpuq.domain.model import Job, JobResult, JobSpec, Resources
    from gpuq.domain.states import JobState
    from gpuq.errors import (
        GpuqError,
        InvalidInput,
        NotFound,
        PermissionDenied,
        ServerUnavailable,
        StorageUnavailable,
        Unsatisfiable,
    )
    from gpuq.executor import Executor
    from gpuq.submission import build_spec

__version__ = "0.1.0"

# gRPC (1.81 and later) restarts its pollers in every forked child while its fork support is
# on, its default: a child that then closes fds before exec (subprocess with user=, group= or
# close_fds) dies of SIGSEGV on "epoll_wait error: Bad file descriptor", now and then. No gpuq
# process uses gRPC across a fork (the CLI helper forks before gRPC starts), so it is off
# unless the caller says otherwise. gRPC reads it once, when imported: this module comes first
# in every gpuq process, and os is loaded in every interpreter (nothing is imported here).
__import__("os").environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
_WHERE = {
    "Client": "gpuq.client",
    "build_spec": "gpuq.submission",
    "Job": "gpuq.domain.model",
    "JobResult": "gpuq.domain.model",
    "JobSpec": "gpuq.domain.model",
    "Resources": "gpuq.domain.model",
    "JobState": "gpuq.domain.states",
    "GpuqError": "gpuq.errors",
    "InvalidInput": "gpuq.errors",
    "NotFound": "gpuq.errors",
    "PermissionDenied": "gpuq.errors",
    "ServerUnavailable": "gpuq.errors",
    "StorageUnavailable": "gpuq.errors",
    "Unsatisfiable": "gpuq.errors",
    "Executor": "gpuq.executor",
}
__all__ = [
    "Client",
    "Executor",
    "GpuqError",
    "InvalidInput",
    "Job",
    "JobResult",
    "JobSpec",
    "JobState",
    "NotFound",
    "PermissionDenied",
    "Resources",
    "ServerUnavailable",
    "StorageUnavailable",
    "Unsatisfiable",
    "build_spec",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'gpuq' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
