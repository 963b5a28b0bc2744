"""One typed settings object, read from TOML, then environment, then command-line flags.

Where things live: `GPUQ_HOME` (default `/var/lib/gpuq` for root, `~/.local/share/gpuq`
otherwise) holds the SQLite database, the Unix socket, the auth token and the agent's state.
The config file is the first of `--config`, `$GPUQ_CONFIG`, `$GPUQ_HOME/config.toml`,
`/etc/gpuq/config.toml` that exists; every setting has a default, so none is needed.
"""

from __future__ import annotations

import hashlib
import os
import socket
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from gpuq.errors import InvalidInput

DEFAULT_TCP_PORT = 7817
TMPFS = Path("/dev/shm")  # where a root agent keeps job folders by default
DEFAULT_JOB_ENV = {
    # a fragmented PyTorch cache is the commonest avoidable OOM; JAX and TF grab all VRAM unless
    # told not to, which turns a shared GPU into a first-come-first-served one
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "PYTORCH_ALLOC_CONF": "expandable_segments:True",
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    "TF_FORCE_GPU_ALLOW_GROWTH": "true",
}


def default_home() -> Path:
    if env := os.environ.get("GPUQ_HOME"):
        return Path(env).expanduser().absolute()
    if os.geteuid() == 0:
        return Path("/var/lib/gpuq")
    return Path.home() / ".local" / "share" / "gpuq"


@dataclass(frozen=True, slots=True)
class QosTier:
    name: str
    priority: int = 0  # weight added to every job's priority
    preemptible: bool = False  # may jobs of higher tiers preempt these
    max_running_gpus: int | None = None  # per user
    max_running_jobs: int | None = None  # per user
    max_submitted_jobs: int | None = None  # per user, pending + running
    default_time: int | None = None  # seconds; for jobs without --time
    max_time: int | None = None  # seconds; longer requests are refused at submit


DAY = 86400


def default_qos_tiers() -> dict[str, QosTier]:
    """Without a config file: jobs without --time get a day (backfill needs every job to
    have an end), nobody asks for more than a week, and low can be preempted by the others."""
    return {
        "high": QosTier("high", priority=2000, default_time=DAY, max_time=7 * DAY),
        "normal": QosTier("normal", priority=1000, default_time=DAY, max_time=7 * DAY),
        "low": QosTier("low", priority=0, preemptible=True, default_time=DAY, max_time=7 * DAY),
    }


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """Multifactor priority (as SLURM's priority/multifactor) and what the scheduler does with
    jobs that can never run."""

    weight_age: float = 500.0  # reached after max_age in the queue
    max_age: float = 7 * DAY
    weight_fairshare: float = 2000.0  # a user with no recent usage gets all of it
    fairshare_half_life: float = 7 * DAY  # how fast past GPU-seconds are forgiven
    priority_interval: float = 30.0  # seconds between full priority recalculations
    cancel_unsatisfiable: bool = True  # cancel jobs whose dependency can never be met
    explain_limit: int = 1000  # pending jobs that get an estimated start time


@dataclass(frozen=True, slots=True)
class CoordinatorSettings:
    database_url: str | None = None  # None: SQLite file gpuq.db in GPUQ_HOME
    listen: str | None = f"127.0.0.1:{DEFAULT_TCP_PORT}"  # TCP; None: Unix socket only
    sqlite_synchronous: str = "NORMAL"
    heartbeat_interval: float = 5.0
    heartbeat_timeout: float = 30.0
    kill_grace: float = 30.0
    default_qos: str = "normal"
    qos: dict[str, QosTier] = field(default_factory=default_qos_tiers)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)


@dataclass(frozen=True, slots=True)
class AgentSettings:
    node_name: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    coordinator: str | None = None  # "unix:PATH" or "HOST:PORT"; None: this home's socket
    run_dir: str | None = None  # job folders (<run_dir>/<node>); None: see Settings.agent_run_root
    fake_gpus: str | None = None
    cpus: int | None = None  # CPUs offered to jobs; None: every CPU of the machine
    mem: str | None = None  # host memory offered to jobs, e.g. "200G"; None: all of it
    mem_enforcement: str = "auto"  # auto | cgroup | poll
    cgroup_parent: str = "gpuq"
    visible_devices: str = "uuid"  # uuid | index: how CUDA_VISIBLE_DEVICES names GPUs
    job_env: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_JOB_ENV))


@dataclass(frozen=True, slots=True)
class Settings:
    home: Path = field(default_factory=default_home)
    coordinator: CoordinatorSettings = field(default_factory=CoordinatorSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)

    @property
    def socket_path(self) -> Path:
        return self.home / "gpuq.sock"

    @property
    def token_path(self) -> Path:
        return self.home / "auth.token"

    @property
    def database_url(self) -> str:
        return self.coordinator.database_url or f"sqlite:///{self.home / 'gpuq.db'}"

    @property
    def agent_state_dir(self) -> Path:
        return self.home / "agent" / self.agent.node_name

    @property
    def agent_run_root(self) -> Path:
        """Where a root agent keeps job folders and the supervisors' socket, one per node.

        They matter only while supervisors run, and a reboot ends those, so by default they
        live in a private folder on tmpfs, keyed by this home: a job costs no disk writes (and
        no fsync behind a busy disk). The agent uses agent_state_dir instead when it is not root
        (systemd-logind removes a user's /dev/shm files at logout) or /dev/shm is missing or
        mounted noexec (a job's script runs from its folder).
        """
        if self.agent.run_dir:
            return Path(self.agent.run_dir).expanduser()
        key = hashlib.sha256(str(self.home).encode()).hexdigest()[:12]
        return TMPFS / f"gpuq-{os.geteuid()}" / key

    @property
    def coordinator_address(self) -> str:
        """Where clients and a local agent reach the coordinator."""
        return self.agent.coordinator or f"unix:{self.socket_path}"


def find_config_file(explicit: Path | None, home: Path) -> Path | None:
    candidates = [explicit] if explicit else []
    if env := os.environ.get("GPUQ_CONFIG"):
        candidates.append(Path(env))
    candidates += [home / "config.toml", Path("/etc/gpuq/config.toml")]
    for path in candidates:
        if path is not None and path.is_file():
            return path
    if explicit is not None:
        raise InvalidInput("--config", str(explicit), "no such file")
    return None


def load_settings(config: Path | None = None, home: Path | None = None) -> Settings:
    """Defaults, then the config file, then GPUQ_* environment variables."""
    base = Settings(home=home or default_home())
    path = find_config_file(config, base.home)
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidInput("config", str(path), str(exc)) from exc
    unknown = set(data) - {"home", "coordinator", "agent", "qos", "scheduler"}
    if unknown:
        raise InvalidInput("config", str(path), f"unknown section(s) {sorted(unknown)}")
    settings = replace(
        base,
        home=Path(data["home"]) if "home" in data and home is None else base.home,
        coordinator=_coordinator_settings(
            data.get("coordinator", {}), data.get("qos"), data.get("scheduler", {}), path
        ),
        agent=_section(AgentSettings, data.get("agent", {}), "agent", path),
    )
    return _apply_env(settings)


def _coordinator_settings(
    raw: dict[str, Any], qos: dict[str, Any] | None, scheduler: dict[str, Any], path: Path | None
) -> CoordinatorSettings:
    settings: CoordinatorSettings = _section(CoordinatorSettings, raw, "coordinator", path)
    settings = replace(
        settings, scheduler=_section(SchedulerSettings, scheduler, "scheduler", path)
    )
    if qos is not None:
        tiers = {
            name: _section(QosTier, {**values, "name": name}, f"qos.{name}", path)
            for name, values in qos.items()
        }
        settings = replace(settings, qos=tiers)
    if settings.default_qos not in settings.qos:
        raise InvalidInput("coordinator.default_qos", settings.default_qos, "no such qos tier")
    return settings


def _section(cls: type[Any], raw: dict[str, Any], name: str, path: Path | None) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = set(raw) - known
    if unknown:
        raise InvalidInput(f"config [{name}]", str(path), f"unknown setting(s) {sorted(unknown)}")
    return cls(**raw)


def _apply_env(settings: Settings) -> Settings:
    coordinator, agent = settings.coordinator, settings.agent
    if url := os.environ.get("GPUQ_DATABASE_URL"):
        coordinator = replace(coordinator, database_url=url)
    if address := os.environ.get("GPUQ_COORDINATOR"):
        agent = replace(agent, coordinator=address)
    return replace(settings, coordinator=coordinator, agent=agent)
