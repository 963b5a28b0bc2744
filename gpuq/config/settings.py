"""The settings themselves: one frozen dataclass per section and the paths derived from them.

Where things live: `GPUQ_HOME` (default `/var/lib/gpuq` for root, `~/.local/share/gpuq`
otherwise) holds the SQLite database, the Unix socket, the auth token and the agent's state.
Every setting has a default here, so no config file is needed; gpuq.config.loading reads one
over these defaults.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from gpuq.domain.gpu_history import DEFAULT_HISTORY_DAYS
from gpuq.domain.partitions import Partition
from gpuq.domain.policy import QosTier, SchedulerSettings, default_qos_tiers
from gpuq.run_root import recorded_root

DEFAULT_TCP_PORT = 7817
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


# the machine's gpuq home: root's default, and the installed coordinator's (gpuq admin install)
SYSTEM_HOME = Path("/var/lib/gpuq")


def default_home() -> Path:
    if env := os.environ.get("GPUQ_HOME"):
        return Path(env).expanduser().absolute()
    if os.geteuid() == 0:
        return SYSTEM_HOME
    return Path.home() / ".local" / "share" / "gpuq"


# what `[coordinator] private_data` may hide from other users, as SLURM's PrivateData:
# "names": others' job names show as "(hidden)" (listings, show, pending reasons, Watch, the
# dashboard); "usage": others' usage (report rows, fair share, GPUs held per user, and the
# per-user metrics families, which nobody signs in to read). Who holds a job is never hidden.
PRIVATE_DATA = ("names", "usage")


@dataclass(frozen=True, slots=True)
class CoordinatorSettings:
    database_url: str | None = None  # None: SQLite file gpuq.db in GPUQ_HOME
    listen: str | None = f"127.0.0.1:{DEFAULT_TCP_PORT}"  # TCP; None: Unix socket only
    sqlite_synchronous: str = "NORMAL"
    heartbeat_interval: float = 5.0
    # a node silent this long is marked down and its jobs node_fail (SLURM's SlurmdTimeout
    # is of this order: an agent restart or a short network cut costs no job); at least
    # [agent] fence_time + kill_grace + 1 s (gpuq.domain.policy.fence_wait), so that its jobs
    # have certainly been stopped by their own supervisors before they are requeued
    heartbeat_timeout: float = 300.0
    kill_grace: float = 30.0
    # the longest a user's write (submit, update, cancel, hold, release, requeue) waits for
    # the job store: one it cannot take (disk full, database down) answers "storage
    # unavailable" within this many seconds instead of waiting for it to come back
    store_write_timeout: float = 5.0
    # a user's queued and running jobs, an array counting every task not yet ended: what
    # one person may keep in the coordinator's memory (about 76 bytes a waiting array task)
    max_queued_per_user: int = 200_000
    # and what they may hold in the coordinator's memory: scripts, environments and arguments
    # (a job may send 6 MiB of them; without this, 200,000 such jobs would be 1.2 TB)
    max_queued_bytes_per_user: int = 2 << 30
    # the most jobs one ListJobs reply (a page) carries; callers page on for the rest (the
    # CLI and gpuq.Client do, to the end), so that no listing holds the coordinator long.
    # Each reply costs the coordinator ~0.7 ms of gRPC on 2 CPUs whatever its size, so a
    # `gpuq queue` of 500 jobs costs 2.1 ms in pages of 250, 0.7 ms in one page of 1,000
    # (bench/queue_cpu_bench.py, issue 27). Others' calls under four listers of 50,000 jobs
    # (bench/listing_bench.py --nice 19): ListNodes median / p95 2.45 / 4.58 ms with 250,
    # 2.15 / 3.83 ms with 1,000, while the listers listed 57 % more; without --nice the
    # listers' extra work takes the CPU from everything on a 2-CPU machine (p95 4.6 -> 5.9 ms)
    list_page_size: int = 1000
    default_qos: str = "normal"
    # PostgreSQL only: wait while another coordinator holds the store, and take over when it
    # goes (instead of exiting with code 3)
    standby: bool = False
    # identity and trust (README "Security"): members of this Unix group are admins (see every
    # job's script and environment, cancel anyone's jobs, drain nodes); root and the
    # coordinator's own user always are
    admin_group: str = "gpuq-admin"
    # the system user the coordinator runs as under systemd (`gpuq admin install` makes
    # "gpuq"): a coordinator running as exactly this user serves every user of the machine, as
    # a root one does, and a root agent treats its socket and key files as the coordinator's;
    # None: only root serves everyone (a user's own coordinator serves only that user)
    service_user: str | None = None
    allow_root_jobs: bool = False  # may root submit jobs (they would run as root)
    # what other users do not see of a user's jobs (README "Security"; the one rule:
    # gpuq.coordinator.access.permissions.sees): "names" (shown as "(hidden)"), "usage"
    # (report rows, fair share, per-user metrics); (): a lab server's default, every job's
    # user and name visible to all. The old `hide_job_names = true` means ["names"]
    private_data: tuple[str, ...] = ()
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
    # days of per-GPU history the dashboard's heat map can show (5-minute buckets of each
    # GPU's utilisation and memory, and who held it); older buckets are pruned every hour
    gpu_history_days: float = DEFAULT_HISTORY_DAYS
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
    # an admin's failure signatures for `gpuq diagnose` (a TOML file of [[signature]] entries,
    # gpuq.domain.log_signatures), over gpuq's own; read when the coordinator starts
    diagnosis_signatures: str | None = None
    qos: dict[str, QosTier] = field(default_factory=default_qos_tiers)
    # [partitions.NAME], in the file's order; none: --partition is a node feature
    partitions: dict[str, Partition] = field(default_factory=dict)
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
    # the most processes and threads one job may have (cgroup v2 pids.max; a fork past it fails
    # with EAGAIN): a generous ceiling that stops a fork bomb before it takes the node's pid
    # space from every other job; 0: none
    job_max_pids: int = 32768
    visible_devices: str = "uuid"  # uuid | index: how CUDA_VISIBLE_DEVICES names GPUs
    job_env: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_JOB_ENV))
    # a job's supervisor stops it (node_fail, "fenced: ...") this long after the coordinator
    # last confirmed hearing from this node, whether the agent is dead, frozen or cut off, so
    # that a job the coordinator requeues never runs in two places (gpuq.agent.fencing); the
    # coordinator's heartbeat_timeout must be at least this + kill_grace + 1 s
    fence_time: float = 240.0
    # seconds between two reads of the GPU inventory (a MIG change, a reset GPU); it is also
    # read again at once after NVML errors
    gpu_rescan: float = 60.0
    # seconds an NVSwitch GPU's fabric may stay "not started" or "in progress" (from when the
    # agent first saw it so) before its units are unhealthy: "fabric manager not running"
    fabric_grace: float = 120.0
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
    # the IP address other nodes reach this node's jobs at (MASTER_ADDR, step workers); "":
    # the address the coordinator sees this agent's connection come from
    address: str = ""
    # `srun` and `scontrol` first on jobs' PATH (gpuq's shims: scripts written for SLURM run
    # unchanged); false where gpuq runs beside a real SLURM whose commands jobs should find
    slurm_shims: bool = True
    # where jobs' own `gpuq` commands reach the coordinator (GPUQ_COORDINATOR in every job; srun
    # ends a job whose task failed through it); "": this agent's coordinator address when that
    # is a Unix socket (users may use it too), else none (users' own configuration applies)
    job_coordinator: str = ""
    # the most bytes a job's output files (stdout and stderr) may hold, from a size such as
    # "10G": over it, the agent ends the job failed, "output limit: ..." (checked at each
    # sample); a job's QOS max_output overrides it; None: no limit
    max_output: int | None = None


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How `gpuq` commands and gpuq.Client reach a coordinator over TCP (a Unix socket needs
    none of this: the kernel says who calls)."""

    # where `gpuq` commands and gpuq.Client reach the coordinator: "unix:PATH" or "HOST:PORT"
    # (its listen port; several comma-separated: a leader and its standbys). None: [agent]
    # coordinator where set (the older place for it), else a coordinator on this machine
    # (Settings.client_address)
    coordinator: str | None = None
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
        # a random name per installation, remembered in the state folder (gpuq.run_root):
        # a fixed name in world-writable /dev/shm could be taken first by any user
        return recorded_root(self.agent_state_dir.parent) or self.agent_state_dir / "no-run-root"

    @property
    def coordinator_address(self) -> str:
        """Where this machine's agent reaches the coordinator (several addresses are
        separated by commas: see split_addresses)."""
        return self.agent.coordinator or f"unix:{self.socket_path}"

    def client_address(self) -> str:
        """Where `gpuq` commands and gpuq.Client reach the coordinator: [client] coordinator,
        else [agent] coordinator (where configs said it before [client] had it), else this
        home's socket where a coordinator listens on it (`gpuq serve`), else the machine's
        (SYSTEM_HOME, the installed coordinator's) where one listens there: a user with no
        config of their own finds the machine's queue. Else this home's socket (nothing
        listens: the error says how to start one)."""
        if address := self.client.coordinator or self.agent.coordinator:
            return address
        system = SYSTEM_HOME / self.socket_path.name
        if not self.socket_path.exists() and system.exists():
            return f"unix:{system}"
        return f"unix:{self.socket_path}"


def how_to_start(address: str) -> str:
    """What to do about an address where no coordinator answers: the machine's queue (its
    socket in /var/lib/gpuq, or a configured TCP address) is an admin's to start; a socket of
    the user's own home is a private queue they may start themselves."""
    addresses = address.split(",")
    private = all(
        a.startswith("unix:") and not a.startswith(f"unix:{SYSTEM_HOME}/") for a in addresses
    )
    if private:
        return (
            "no queue runs here for you: start your own with `gpuq serve` (a private one), or "
            "point [client] coordinator at your site's"
        )
    return (
        "the machine's queue is not running: an admin starts it (`systemctl start "
        "gpuq-coordinator`; `gpuq admin doctor` says what is wrong)"
    )


def auth_socket_for(socket_path: Path) -> Path:
    """The handshake socket beside a coordinator's gRPC socket."""
    return socket_path.with_name(socket_path.name + ".auth")


def split_addresses(address: str) -> list[str]:
    """The addresses in a coordinator address: a leader and its standbys, comma-separated, in
    the order they are tried. A single address is a list of one."""
    return [part.strip() for part in address.split(",") if part.strip()] or [address]
