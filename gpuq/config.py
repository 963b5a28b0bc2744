"""One typed settings object, read from TOML, then environment, then command-line flags.

Where things live: `GPUQ_HOME` (default `/var/lib/gpuq` for root, `~/.local/share/gpuq`
otherwise) holds the SQLite database, the Unix socket, the auth token and the agent's state.
The config file is the first of `--config`, `$GPUQ_CONFIG`, `$GPUQ_HOME/config.toml`,
`/etc/gpuq/config.toml` that exists; every setting has a default, so none is needed.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
import socket
import tomllib
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

from gpuq.domain.notify import check_mail_user, check_notify_url, parse_mail_types
from gpuq.errors import ConfigError, InvalidInput

DEFAULT_TCP_PORT = 7817
TMPFS = Path("/dev/shm")  # where a root agent keeps job folders by default
DEFAULT_JOB_ENV = {
    # a fragmented PyTorch cache is the commonest avoidable OOM; JAX and TF grab all VRAM unless
    # told not to, which turns a shared GPU into a first-come-first-served one
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "PYTORCH_ALLOC_CONF": "expandable_segments:True",
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    # a dead peer ends the job (NCCL's watchdog raises) instead of hanging it on all its GPUs
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}


# PyTorch's allocator setting under its old and its new name: one setting (gpuq.agent.launch)
ALLOCATOR_NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


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
    # how many times a job lost with its node (node_fail) goes back to the queue; 0: never
    requeue_on_node_fail: int = 1
    # a running job whose GPUs all stay below idle_threshold percent busy for idle_window
    # seconds is flagged idle ("unknown" utilisation never counts as idle); idle_action "cancel"
    # then cancels it with that reason
    idle_threshold: float = 5.0
    idle_window: int = 1800
    idle_action: str = "flag"  # flag | cancel
    # a job on 2+ GPUs whose GPUs all keep one utilisation and one memory figure, and that
    # writes no output, for hung_window seconds is flagged "possibly hung (NCCL?)"; 0: never
    hung_window: int = 1800


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
    # a node silent this long is marked down and its jobs node_fail (SLURM's SlurmdTimeout
    # is of this order: an agent restart or a short network cut costs no job)
    heartbeat_timeout: float = 300.0
    kill_grace: float = 30.0
    # a user's queued and running jobs, an array counting every task not yet ended: what
    # one person may keep in the coordinator's memory (about 76 bytes a waiting array task)
    max_queued_per_user: int = 200_000
    # and what they may hold in the coordinator's memory: scripts, environments and arguments
    # (a job may send 6 MiB of them; without this, 200,000 such jobs would be 1.2 TB)
    max_queued_bytes_per_user: int = 2 << 30
    default_qos: str = "normal"
    # PostgreSQL only: wait while another coordinator holds the store, and take over when it
    # goes (instead of exiting with code 3)
    standby: bool = False
    # identity and trust (README "Security"): members of this Unix group are admins (see every
    # job's script and environment, cancel anyone's jobs, drain nodes); root and the
    # coordinator's own user always are
    admin_group: str = "gpuq-admin"
    allow_root_jobs: bool = False  # may root submit jobs (they would run as root)
    hide_job_names: bool = False  # listings show other users' job names as "(hidden)"
    # TLS for the TCP port: the coordinator's certificate and key (PEM files); the CA that
    # signed the nodes' client certificates (agents on agent_listen must present one)
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    # a TCP port for agents only, with mutual TLS (needs tls_cert, tls_key and tls_ca)
    agent_listen: str | None = None
    # plaintext TCP on an address other than loopback: refused unless this is true
    insecure_tcp: bool = False
    # the nodes that may register: one key file per node, <nodes_dir>/<node>.key
    # (`gpuq admin node-key NODE`); None: GPUQ_HOME/nodes
    nodes_dir: str | None = None
    # calls in progress at once, streams included (more are refused RESOURCE_EXHAUSTED); one
    # user keeps at most 128 submit and watch streams open
    max_concurrent_rpcs: int = 2048
    # Prometheus metrics (README "Metrics"): HOST:PORT of a plain-HTTP /metrics endpoint; None:
    # off. Anything but loopback needs tls_cert (then it is HTTPS) or insecure_tcp
    metrics_listen: str | None = None
    # the web dashboard (README "Dashboard"): HOST:PORT; None: off. HTTPS with tls_cert/tls_key;
    # plaintext only on loopback unless insecure_tcp, as for listen
    web_listen: str | None = None
    # the dashboard's address as browsers reach it (a proxy, a DNS name), for `gpuq web`'s
    # links; None: from web_listen
    web_url: str | None = None
    # notifications (README "Notifications"): the local MTA, called as `mail_program -oi --
    # RECIPIENT` with the message on stdin, as SLURM's MailProg
    mail_program: str = "/usr/sbin/sendmail"
    mail_from: str | None = None  # None: gpuq@<this host>
    # networks a user's --notify webhook may reach besides public addresses (CIDRs): loopback,
    # private and link-local addresses are refused unless listed, so that a job cannot make the
    # coordinator call services only it can reach
    notify_allow: tuple[str, ...] = ()
    notify_retries: int = 5  # further attempts of a failed webhook or mail, backing off
    # URLs told of node and GPU health changes (an admin's own: any address)
    admin_webhooks: tuple[str, ...] = ()
    qos: dict[str, QosTier] = field(default_factory=default_qos_tiers)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)


@dataclass(frozen=True, slots=True)
class AgentSettings:
    node_name: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    # "unix:PATH" or "HOST:PORT", or several comma-separated (a leader and its standbys, tried
    # in order); None: this home's socket
    coordinator: str | None = None
    run_dir: str | None = None  # job folders (<run_dir>/<node>); None: see Settings.agent_run_root
    fake_gpus: str | None = None
    cpus: int | None = None  # CPUs offered to jobs; None: every CPU of the machine
    mem: str | None = None  # host memory offered to jobs, e.g. "200G"; None: all of it
    mem_enforcement: str = "auto"  # auto | cgroup | poll
    cgroup_parent: str = "gpuq"
    visible_devices: str = "uuid"  # uuid | index: how CUDA_VISIBLE_DEVICES names GPUs
    job_env: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_JOB_ENV))
    # an agent that cannot reach the coordinator this long stops its jobs itself (they end
    # node_fail), so that a job the coordinator requeues never runs in two places; shorter than
    # the coordinator's heartbeat_timeout, by more than the jobs' kill grace
    fence_time: float = 240.0
    # seconds between two reads of the GPU inventory (a MIG change, a reset GPU); it is also
    # read again at once after NVML errors
    gpu_rescan: float = 60.0
    # seconds a job's processes may stay in NVML's process list after the job ended before its
    # units are marked dirty (not given out) until they clear
    handover_timeout: float = 10.0
    # a process on a GPU that belongs to no job holding it: "report" (flag it in gpuq nodes and
    # the log; a free unit is not given out while it is there) or "kill" (SIGKILL it too)
    foreign_processes: str = "report"
    # seconds between two samples of each job's GPUs (utilisation, memory, energy)
    sample_interval: float = 5.0
    # GPUs jobs may share through MPS (--gpu-share PCT --gpu-mem SIZE): "all", or GPU indices
    # and UUIDs, comma-separated; "": none (every job gets whole GPUs or MIG slices)
    shared_gpus: str = ""
    # may this node run jobs as root (only for a root coordinator that allows root jobs too)
    allow_root_jobs: bool = False
    # this node's key (the coordinator's <nodes_dir>/<node>.key, copied here); None:
    # GPUQ_HOME/nodes/<node_name>.key
    node_key: str | None = None
    # TLS towards a coordinator at HOST:PORT: the site CA (verifies the coordinator), and this
    # node's client certificate and key (mutual TLS on the coordinator's agent_listen port)
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    # labels --constraint (and --partition) match, e.g. ["nvlink", "ib", "debug"]; the
    # types of the node's GPUs (a100, h100...) match too without being listed
    features: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How `gpuq` commands and gpuq.Client reach a coordinator over TCP (a Unix socket needs
    none of this: the kernel says who calls)."""

    tls_ca: str | None = None  # the site CA that signed the coordinator's certificate
    # a per-user token an admin issued (`gpuq admin token USER`); None: ~/.config/gpuq/token
    token_file: str | None = None
    # defaults for `gpuq submit` where the script and the command line say nothing: a webhook
    # for every job (--notify) and mail types (--mail-type, e.g. "END,FAIL")
    notify_url: str | None = None
    mail_type: str | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    home: Path = field(default_factory=default_home)
    coordinator: CoordinatorSettings = field(default_factory=CoordinatorSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    client: ClientSettings = field(default_factory=ClientSettings)

    @property
    def socket_path(self) -> Path:
        return self.home / "gpuq.sock"

    @property
    def auth_socket_path(self) -> Path:
        """Where a local caller proves its uid (gpuq.identity: SO_PEERCRED)."""
        return auth_socket_for(self.socket_path)

    @property
    def key_path(self) -> Path:
        """The coordinator's secret for the credentials it signs (mode 0600)."""
        return self.home / "auth.key"

    @property
    def nodes_dir(self) -> Path:
        return (
            Path(self.coordinator.nodes_dir) if self.coordinator.nodes_dir else self.home / "nodes"
        )

    @property
    def node_key_path(self) -> Path:
        if self.agent.node_key:
            return Path(self.agent.node_key)
        return self.home / "nodes" / f"{self.agent.node_name}.key"

    @property
    def token_file(self) -> Path:
        if self.client.token_file:
            return Path(self.client.token_file).expanduser()
        return Path.home() / ".config" / "gpuq" / "token"

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
        live in a folder of this installation on tmpfs: a job costs no disk writes (and
        no fsync behind a busy disk). The agent uses agent_state_dir instead when it is not root
        (systemd-logind removes a user's /dev/shm files at logout) or /dev/shm is missing or
        mounted noexec (a job's script runs from its folder).
        """
        if self.agent.run_dir:
            return Path(self.agent.run_dir).expanduser()
        # a random name per installation, remembered in the state folder (gpuq/agent/rundir):
        # a fixed name in world-writable /dev/shm could be taken first by any user
        from gpuq.run_root import recorded_root

        return recorded_root(self.agent_state_dir.parent) or self.agent_state_dir / "no-run-root"

    @property
    def coordinator_address(self) -> str:
        """Where clients and a local agent reach the coordinator (several addresses are
        separated by commas: see split_addresses)."""
        return self.agent.coordinator or f"unix:{self.socket_path}"


def auth_socket_for(socket_path: Path) -> Path:
    """The handshake socket beside a coordinator's gRPC socket."""
    return socket_path.with_name(socket_path.name + ".auth")


def split_addresses(address: str) -> list[str]:
    """The addresses in a coordinator address: a leader and its standbys, comma-separated, in
    the order they are tried. A single address is a list of one."""
    return [part.strip() for part in address.split(",") if part.strip()] or [address]


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
    """Defaults, then the config file, then GPUQ_* environment variables. Every value is
    checked here, so a wrong one stops a command at once with one line naming it (ConfigError)
    instead of failing later, somewhere else."""
    base = Settings(home=home or default_home())
    path = find_config_file(config, base.home)
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise InvalidInput("config", str(path), str(exc)) from exc
    source = f"config {path}"
    for key in data:
        if key not in TOP_LEVEL:
            raise ConfigError(source, key, data[key], _unknown("section", key, TOP_LEVEL))
    for name in ("coordinator", "agent", "client", "scheduler"):
        _table(data.get(name, {}), source, f"[{name}]")
    settings = replace(
        base,
        home=_check_home(data["home"], source) if "home" in data and home is None else base.home,
        coordinator=_coordinator_settings(
            data.get("coordinator", {}), data.get("qos"), data.get("scheduler", {}), source
        ),
        agent=_section(AgentSettings, data.get("agent", {}), "agent", source),
        client=_section(ClientSettings, data.get("client", {}), "client", source),
    )
    _check_fence(settings, data.get("agent", {}), source)
    return _apply_env(settings)


def _check_fence(settings: Settings, raw: dict[str, Any], source: str) -> None:
    """An agent's fence_time set in the file must be shorter than the node timeout (the
    file's, else the default): an agent that fences later than the coordinator gives its jobs
    up would let a requeued job run twice."""
    timeout = settings.coordinator.heartbeat_timeout
    if "fence_time" in raw and settings.agent.fence_time >= timeout:
        raise ConfigError(
            source,
            "[agent] fence_time",
            raw["fence_time"],
            f"must be shorter than [coordinator] heartbeat_timeout ({timeout:g} s)",
        )


def check_setting(section: str, key: str, value: Any, source: str, label: str = "") -> Any:
    """`value` for `[section] key` checked and normalised, or ConfigError naming it (as `label`
    where given): for values that do not come from the config file, such as flags."""
    return RULES[section][key](value, source, label or f"[{section}] {key}")


# ---- the rules: a type and a range for every setting ------------------------------------------

TOP_LEVEL = ("home", "coordinator", "agent", "client", "qos", "scheduler")
YEAR = 365 * DAY
MAX_TIME_LIMIT = 366 * DAY  # as for --time
MAX_CPUS = 65536  # as for --cpus
MAX_MEM = 1 << 50  # 1 PiB: far beyond any machine, and well inside the wire's 64 bits
MAX_WEIGHT = 1e9
MAX_COUNT = 10_000_000
Check = Callable[[Any, str, str], Any]  # (value, source, key) -> the value, normalised

_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_SHARED_GPUS = re.compile(r"|all|[A-Za-z0-9_.:-]{1,96}(,[A-Za-z0-9_.:-]{1,96}){0,1023}")
_GROUP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_TIER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_CGROUP_PART = re.compile(r"[A-Za-z0-9_.@:-]{1,100}")
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})")
_DATABASE_SCHEMES = ("sqlite", "sqlite+pysqlite", "postgresql", "postgresql+psycopg")


def _kind(value: Any) -> str:
    """What TOML made of a value, in words."""
    kinds = {bool: "a boolean", str: "a string", int: "a whole number", float: "a number"}
    kinds |= {dict: "a table", list: "a list"}
    return kinds.get(type(value), "a date or time")


def _seconds(low: float, high: float) -> Check:
    return _number(low, high, "seconds")


def _number(low: float, high: float, unit: str = "") -> Check:
    def check(value: Any, source: str, key: str) -> float:
        what = f"a number{f' of {unit}' if unit else ''} from {low:g} to {high:g}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(source, key, value, f"expected {what}, not {_kind(value)}")
        if not math.isfinite(value) or not low <= value <= high:
            raise ConfigError(source, key, value, f"expected {what}")
        return float(value)

    return check


def _integer(low: int, high: int, unit: str = "") -> Check:
    def check(value: Any, source: str, key: str) -> int:
        what = f"a whole number{f' of {unit}' if unit else ''} from {low} to {high}"
        number = int(value) if isinstance(value, float) and value.is_integer() else value
        if isinstance(number, bool) or not isinstance(number, int):
            raise ConfigError(source, key, value, f"expected {what}, not {_kind(value)}")
        if not low <= number <= high:
            raise ConfigError(source, key, value, f"expected {what}")
        return number

    return check


def _boolean(value: Any, source: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(source, key, value, f"expected true or false, not {_kind(value)}")
    return value


def _choice(*options: str, upper: bool = False) -> Check:
    def check(value: Any, source: str, key: str) -> str:
        if isinstance(value, str) and (value.upper() if upper else value) in options:
            return value.upper() if upper else value
        _fail(source, key, value, f"expected one of {', '.join(options)}")

    return check


def _string(value: Any, source: str, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(source, key, value, f"expected a string, not {_kind(value)}")
    if "\0" in value:
        raise ConfigError(source, key, value, "contains a NUL character")
    return value


def _pattern(regex: re.Pattern[str], what: str) -> Check:
    def check(value: Any, source: str, key: str) -> str:
        if not regex.fullmatch(_string(value, source, key)):
            raise ConfigError(source, key, value, f"expected {what}")
        return str(value)

    return check


def _fail(source: str, key: str, value: Any, problem: str) -> NoReturn:
    if not isinstance(value, str):
        problem = f"{problem}, not {_kind(value)}"
    raise ConfigError(source, key, value, problem)


def _absolute_path(value: Any, source: str, key: str) -> str:
    text = _string(value, source, key)
    if not text or not Path(text).expanduser().is_absolute():
        raise ConfigError(source, key, value, "expected an absolute path")
    return text


def _check_home(value: Any, source: str) -> Path:
    return Path(_absolute_path(value, source, "home")).expanduser()


def _host_port(value: str, source: str, key: str, *, any_port: bool) -> str:
    match = _HOST_PORT.fullmatch(value)
    low = 0 if any_port else 1
    if match is None or not low <= int(match.group(2)) <= 65535:
        raise ConfigError(source, key, value, f"expected HOST:PORT with a port from {low} to 65535")
    return value


def _listen(value: Any, source: str, key: str) -> str | None:
    """HOST:PORT (port 0: any free port), or "" for the Unix socket only."""
    text = _string(value, source, key)
    return _host_port(text, source, key, any_port=True) if text else None


MAX_ADDRESSES = 16  # a leader and its standbys


def _coordinator_address(value: Any, source: str, key: str) -> str:
    """unix:PATH or HOST:PORT, or several of them separated by commas (a leader and its
    standbys, tried in that order); normalised to no spaces around the commas."""
    text = _string(value, source, key)
    parts = [part.strip() for part in text.split(",")] if "," in text else [text]
    what = "expected unix:PATH or HOST:PORT, or several separated by commas"
    if len(parts) > MAX_ADDRESSES:
        raise ConfigError(source, key, value, f"{what} (at most {MAX_ADDRESSES})")
    for part in parts:
        if part.startswith("unix:"):
            if len(part) > len("unix:"):
                continue
            raise ConfigError(source, key, value, what)
        try:
            _host_port(part, source, key, any_port=False)
        except ConfigError:
            raise ConfigError(source, key, value, what) from None
    return ",".join(parts)


def redact_url(url: str) -> str:
    """A database URL fit to print: the password, if any, replaced by ***."""
    return re.sub(r"^([^:/]+://[^:/@]*):[^@]*@", r"\1:***@", url)


def _database_url(value: Any, source: str, key: str) -> str:
    """Only the shape here (the store checks the rest when it connects): the CLI must start
    fast, and a client command has no use for SQLAlchemy."""
    url = _string(value, source, key)
    scheme, sep, rest = url.partition("://")
    shown = redact_url(url)
    if not sep or scheme not in _DATABASE_SCHEMES:
        hint = (
            "; write postgresql:// (gpuq uses psycopg 3)" if scheme.startswith("postgres") else ""
        )
        raise ConfigError(
            source, key, shown, f"expected sqlite:///PATH or postgresql://USER@HOST/DATABASE{hint}"
        )
    if scheme.startswith("sqlite"):
        path = rest[1:].partition("?")[0] if rest.startswith("/") else ""
        if not path or path == ":memory:":
            raise ConfigError(
                source, key, shown, "expected sqlite:///PATH (an in-memory store loses the queue)"
            )
    elif not rest:
        raise ConfigError(source, key, shown, "expected postgresql://USER@HOST/DATABASE")
    return url


def _size(value: Any, source: str, key: str) -> str:
    from gpuq.domain.units import format_size, parse_size

    if not isinstance(value, str):
        raise ConfigError(
            source, key, value, f'expected a size such as "200G" (quoted), not {_kind(value)}'
        )
    try:
        size = parse_size(value, key)
    except InvalidInput as exc:
        raise ConfigError(source, key, value, exc.problem) from None
    if size > MAX_MEM:
        raise ConfigError(source, key, value, f"expected at most {format_size(MAX_MEM)}")
    return value


def _cgroup_parent(value: Any, source: str, key: str) -> str:
    text = _string(value, source, key)
    parts = text.strip("/").split("/")
    if len(text) > 255 or not all(
        _CGROUP_PART.fullmatch(p) and p not in {".", ".."} for p in parts
    ):
        raise ConfigError(
            source, key, value, "expected a cgroup path such as gpuq or system.slice/gpuq"
        )
    return text


def _fake_gpus(value: Any, source: str, key: str) -> str:
    """The shape only: `gpuq agent` and `gpuq serve` parse the spec before they start."""
    text = _string(value, source, key)
    if not text.strip() or len(text) > 1000:
        raise ConfigError(source, key, value, "expected a spec such as 4 or 8xA100-80GB")
    return text


def _job_env(value: Any, source: str, key: str) -> dict[str, str]:
    table = _table(value, source, key)
    if len(table) > 256:
        raise ConfigError(source, key, value, "more than 256 variables")
    for name, text in table.items():
        where = f"[agent.job_env] {name}"
        if not _ENV_NAME.fullmatch(name):
            raise ConfigError(source, where, text, "not an environment variable name")
        if len(_string(text, source, where)) > 4096:
            raise ConfigError(source, where, text, "longer than 4096 characters")
    # merged over the defaults: an admin adds or changes one variable without restating the
    # rest; an empty value removes a default
    merged = {**DEFAULT_JOB_ENV, **table}
    # PyTorch's old and new names for the allocator settings are one setting
    given = [table[name] for name in ALLOCATOR_NAMES if name in table]
    for name in ALLOCATOR_NAMES:
        if given and name not in table:
            merged[name] = given[0]
    return {name: text for name, text in merged.items() if text != ""}


def _features(value: Any, source: str, key: str) -> tuple[str, ...]:
    """A list of node features: labels of gpuq.domain.placement's FEATURE_RE."""
    from gpuq.domain.placement import check_node_features

    if not isinstance(value, list):
        raise ConfigError(
            source, key, value, f'expected a list such as ["nvlink", "ib"], not {_kind(value)}'
        )
    try:
        return check_node_features(value, key)
    except InvalidInput as exc:
        raise ConfigError(source, key, exc.value, exc.problem) from None


def _web_url(value: Any, source: str, key: str) -> str:
    text = _string(value, source, key)
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ConfigError(source, key, value, "expected http(s)://HOST[:PORT][/PATH]")
    return text.rstrip("/")


def _mail_from(value: Any, source: str, key: str) -> str:
    text = _string(value, source, key)
    try:
        check_mail_user(text)
    except InvalidInput:
        raise ConfigError(source, key, value, "expected an address like gpuq@example.org") from None
    return text


def _networks(value: Any, source: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(source, key, value, 'expected a list of networks, e.g. ["10.0.0.0/8"]')
    found = []
    for item in value:
        try:
            found.append(str(ipaddress.ip_network(item, strict=False)))
        except (TypeError, ValueError):
            raise ConfigError(source, key, item, "not a network (e.g. 10.0.0.0/8)") from None
    return tuple(found)


def _webhooks(value: Any, source: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(source, key, value, 'expected a list of URLs, e.g. ["https://..."]')
    found = []
    for item in value:
        try:
            check_notify_url(item)
        except InvalidInput as exc:
            raise ConfigError(source, key, item, str(exc)) from None
        found.append(item)
    return tuple(found)


def _notify_url(value: Any, source: str, key: str) -> str:
    text = _string(value, source, key)
    try:
        check_notify_url(text)
    except InvalidInput as exc:
        raise ConfigError(source, key, value, exc.problem) from None
    return text


def _mail_type(value: Any, source: str, key: str) -> str:
    text = _string(value, source, key)
    try:
        parse_mail_types(text)
    except InvalidInput as exc:
        raise ConfigError(source, key, value, exc.problem) from None
    return text


def _table(value: Any, source: str, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(source, key, value, f"expected a table (a section), not {_kind(value)}")
    return value


RULES: dict[str, dict[str, Check]] = {
    "coordinator": {
        "database_url": _database_url,
        "listen": _listen,
        "sqlite_synchronous": _choice("OFF", "NORMAL", "FULL", "EXTRA", upper=True),
        "heartbeat_interval": _seconds(0.05, 3600),
        "heartbeat_timeout": _seconds(0.1, DAY),
        "kill_grace": _seconds(0, DAY),
        "max_queued_per_user": _integer(1, 100_000_000),
        "max_queued_bytes_per_user": _integer(1 << 20, 1 << 50, "bytes"),
        "default_qos": _pattern(_TIER_NAME, "the name of a [qos.NAME] tier"),
        "standby": _boolean,
        "admin_group": _pattern(_GROUP_NAME, "a Unix group name"),
        "allow_root_jobs": _boolean,
        "hide_job_names": _boolean,
        "tls_cert": _absolute_path,
        "tls_key": _absolute_path,
        "tls_ca": _absolute_path,
        "agent_listen": _listen,
        "insecure_tcp": _boolean,
        "nodes_dir": _absolute_path,
        "max_concurrent_rpcs": _integer(8, 100_000),
        "metrics_listen": _listen,
        "web_listen": _listen,
        "web_url": _web_url,
        "mail_program": _absolute_path,
        "mail_from": _mail_from,
        "notify_allow": _networks,
        "notify_retries": _integer(0, 20),
        "admin_webhooks": _webhooks,
    },
    "scheduler": {
        "weight_age": _number(0, MAX_WEIGHT),
        "max_age": _seconds(1, 10 * YEAR),
        "weight_fairshare": _number(0, MAX_WEIGHT),
        "fairshare_half_life": _seconds(1, 10 * YEAR),
        "priority_interval": _seconds(0.1, DAY),
        "cancel_unsatisfiable": _boolean,
        "explain_limit": _integer(0, 1_000_000),
    },
    "qos": {
        "priority": _integer(-1_000_000, 1_000_000),
        "preemptible": _boolean,
        "max_running_gpus": _integer(0, MAX_COUNT),
        "max_running_jobs": _integer(0, MAX_COUNT),
        "max_submitted_jobs": _integer(0, MAX_COUNT),
        "default_time": _integer(1, MAX_TIME_LIMIT, "seconds"),
        "max_time": _integer(1, MAX_TIME_LIMIT, "seconds"),
        "requeue_on_node_fail": _integer(0, 1000),
        "idle_threshold": _number(0, 100, "percent"),
        "idle_window": _integer(1, MAX_TIME_LIMIT, "seconds"),
        "idle_action": _choice("flag", "cancel"),
        "hung_window": _integer(0, MAX_TIME_LIMIT, "seconds"),
    },
    "agent": {
        "node_name": _pattern(
            _NODE_NAME, "a name of letters, digits, '.', '_' and '-' (at most 63)"
        ),
        "coordinator": _coordinator_address,
        "run_dir": _absolute_path,
        "fake_gpus": _fake_gpus,
        "cpus": _integer(1, MAX_CPUS),
        "mem": _size,
        "mem_enforcement": _choice("auto", "cgroup", "poll"),
        "cgroup_parent": _cgroup_parent,
        "visible_devices": _choice("uuid", "index"),
        "job_env": _job_env,
        "fence_time": _seconds(0.1, DAY),
        "gpu_rescan": _seconds(1, DAY),
        "handover_timeout": _seconds(0.1, 3600),
        "foreign_processes": _choice("report", "kill"),
        "sample_interval": _seconds(0.1, 3600),
        "shared_gpus": _pattern(_SHARED_GPUS, '"all", or GPU indices and UUIDs, comma-separated'),
        "allow_root_jobs": _boolean,
        "node_key": _absolute_path,
        "tls_ca": _absolute_path,
        "tls_cert": _absolute_path,
        "tls_key": _absolute_path,
        "features": _features,
    },
    "client": {
        "tls_ca": _absolute_path,
        "token_file": _absolute_path,
        "notify_url": _notify_url,
        "mail_type": _mail_type,
    },
}
# the sections' names for RULES (a [qos.NAME] section has the rules of "qos")
_SECTION_CLASSES: dict[type[Any], str] = {
    CoordinatorSettings: "coordinator",
    SchedulerSettings: "scheduler",
    QosTier: "qos",
    AgentSettings: "agent",
    ClientSettings: "client",
}


def _unknown(what: str, key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f"; did you mean {close[0]}?" if close else f"; known: {', '.join(sorted(known))}"
    return f"unknown {what}{hint}"


def _coordinator_settings(
    raw: dict[str, Any], qos: Any, scheduler: dict[str, Any], source: str
) -> CoordinatorSettings:
    settings: CoordinatorSettings = _section(CoordinatorSettings, raw, "coordinator", source)
    settings = replace(
        settings, scheduler=_section(SchedulerSettings, scheduler, "scheduler", source)
    )
    if settings.heartbeat_timeout <= settings.heartbeat_interval:
        raise ConfigError(
            source,
            "[coordinator] heartbeat_timeout",
            raw.get("heartbeat_timeout", settings.heartbeat_timeout),
            f"must be longer than heartbeat_interval ({settings.heartbeat_interval:g} s)",
        )
    if qos is not None:
        tiers = {}
        for name, values in _table(qos, source, "[qos]").items():
            if not _TIER_NAME.fullmatch(name):
                raise ConfigError(source, f"[qos.{name}]", values, "not a usable tier name")
            _table(values, source, f"[qos.{name}]")
            tiers[name] = _section(QosTier, values, f"qos.{name}", source, name=name)
        settings = replace(settings, qos=tiers)
    if settings.default_qos not in settings.qos:
        raise ConfigError(
            source,
            "[coordinator] default_qos",
            settings.default_qos,
            f"no such qos tier (tiers: {', '.join(settings.qos) or 'none'})",
        )
    return settings


def _section(cls: type[Any], raw: dict[str, Any], section: str, source: str, **extra: Any) -> Any:
    rules = RULES[_SECTION_CLASSES[cls]]
    values = dict(extra)
    for key, value in raw.items():
        if key not in rules:
            raise ConfigError(source, f"[{section}] {key}", value, _unknown("setting", key, rules))
        values[key] = rules[key](value, source, f"[{section}] {key}")
    made = cls(**values)
    if isinstance(made, QosTier):
        limit, default = made.max_time, made.default_time
        if limit is not None and default is not None and default > limit:
            raise ConfigError(
                source,
                f"[{section}] default_time",
                default,
                f"longer than this tier's max_time ({limit})",
            )
    return made


def _apply_env(settings: Settings) -> Settings:
    coordinator, agent = settings.coordinator, settings.agent
    if url := os.environ.get("GPUQ_DATABASE_URL"):
        url = _database_url(url, "environment", "GPUQ_DATABASE_URL")
        coordinator = replace(coordinator, database_url=url)
    if address := os.environ.get("GPUQ_COORDINATOR"):
        address = _coordinator_address(address, "environment", "GPUQ_COORDINATOR")
        agent = replace(agent, coordinator=address)
    return replace(settings, coordinator=coordinator, agent=agent)
