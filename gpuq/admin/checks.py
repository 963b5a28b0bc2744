"""The result of one doctor check, and what every check reads the machine through.

A check is a function `(DoctorContext) -> list[Check]`; it never raises for what it finds (a
missing file is a finding). The roots in DoctorContext let tests point every check at a fake
tree (a fake /proc, /sys, /dev and /run) instead of this machine's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gpuq.config.settings import Settings

# ok: fine; warn: works, but worse than it should (say why); fail: jobs would fail or run
# unisolated (doctor exits non-zero); skip: does not apply on this machine (say why)
Status = Literal["ok", "warn", "fail", "skip"]


@dataclass(frozen=True, slots=True)
class Check:
    name: str  # short and stable: "driver", "fabric manager", "cgroup delegation", ...
    status: Status
    detail: str  # what was found, in words
    fix: str = ""  # how to fix it (empty for ok and skip)


@dataclass(frozen=True, slots=True)
class DoctorContext:
    settings: Settings
    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    dev: Path = Path("/dev")
    run: Path = Path("/run")
    # the systemd unit the agent runs as ("gpuq-agent.service"); the one holding job cgroups
    agent_unit: str = "gpuq-agent.service"
    jobs_unit: str = "gpuq-jobs.service"
    extra: dict[str, str] = field(default_factory=dict)  # test hooks, by name
    # the config file the settings came from (None: none, defaults only), and why it did not
    # load ("" when it did; settings are then the defaults, and checks of configured files
    # skip rather than check the wrong ones)
    config_file: Path | None = None
    config_error: str = ""
    # what this machine is, from its config and GPUQ_HOME (gpuq.admin.doctor.machine_roles):
    # "coordinator", "agent", both, or neither (a client)
    roles: frozenset[str] = frozenset({"coordinator", "agent"})
