"""What a supervisor needs to run one job: a LaunchSpec, built by a pure function.

The agent builds it from the coordinator's launch order, its node and the admin's policy; the
supervisor only carries it out. Keeping this pure means the job environment contract
(DESIGN.md) is tested without starting a process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

MemEnforcement = Literal["auto", "cgroup", "poll"]


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    job_id: int
    script: str  # the script text; the supervisor writes it to job_dir/script (mode 0700)
    args: tuple[str, ...]  # arguments after the script
    env: dict[str, str]  # the job's complete environment
    cwd: str
    stdout_path: str
    stderr_path: str  # equal to stdout_path: one file receives both
    open_mode: Literal["truncate", "append"] = "truncate"  # append after a requeue
    time_limit: float | None = None  # seconds from start; then state timeout
    mem_limit: int | None = None  # bytes of host memory for the whole tree
    mem_enforcement: MemEnforcement = "auto"  # auto: a cgroup when possible, else poll
    cgroup_parent: str | None = None  # cgroup folder (relative to the hierarchy) for job groups
    kill_grace: float = 30.0  # seconds between the warning signal and SIGKILL
    warning_signal: int = 15  # sent first when stopping, and before the time limit
    warning_seconds: float = 0.0  # how long before the time limit the warning goes
    uid: int | None = None  # None: keep the supervisor's user (until user identity lands)
    gid: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchSpec:
        values = dict(data)
        values["args"] = tuple(values.get("args", ()))
        return cls(**values)
