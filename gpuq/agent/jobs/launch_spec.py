"""What a supervisor needs to run one job: a LaunchSpec, built by a pure function.

The agent builds it from the coordinator's launch order, its node and the admin's policy; the
supervisor only carries it out. Keeping this pure means the job environment contract
(DESIGN.md) is tested without starting a process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuq.agent.jobs.gang_environment import (
    DEFAULT_PATH,
    Gang,
    gang_environment,
    step_worker_script,
)
from gpuq.agent.jobs.isolation import DeviceNumber, device_rules, format_cpulist
from gpuq.agent.jobs.job_account import Account
from gpuq.agent.jobs.mps_share import MpsShare, mps_environment
from gpuq.config.settings import ALLOCATOR_NAMES
from gpuq.domain.array_specs import ArraySpec
from gpuq.domain.interactive_jobs import Terminal
from gpuq.domain.model import GpuUnit, JobSpec, output_paths

MemEnforcement = Literal["auto", "cgroup", "poll"]
VisibleDevices = Literal["uuid", "index"]


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
    # the folder (relative to the memory controller's hierarchy) for the jobs' groups: every job
    # gets one (job_<id>) where the supervisor may make it, --mem or not, so that nothing the
    # job starts outlives it; without --mem it sets no limit
    cgroup_parent: str | None = None
    # the installation's key (cgroup_key): the groups are <cgroup_parent>/<key>/job_<id>, so that
    # two installations on one host never take each other's jobs for their own; None: no level
    cgroup_key: str | None = None
    # cgroup v2: the delegated subtree holding cgroup_parent (relative to the v2 mount), which
    # the agent prepared (gpuq.agent.jobs.job_cgroups): the supervisor enables controllers only
    # inside it. None: from the mount down (a host without systemd), or cgroup v1
    cgroup_delegated: str | None = None
    # cgroup v2 pids.max of the job's group ([agent] job_max_pids); 0: none
    job_max_pids: int = 0
    kill_grace: float = 30.0  # seconds between SIGTERM (or a stop's signal) and SIGKILL
    # --signal SIG@S: SIG goes warning_seconds before the time limit (at start when that is not
    # shorter than the limit; never when 0); the limit itself sends SIGTERM, then SIGKILL after
    # kill_grace. A stop (preemption) sends the signal the coordinator gives, usually this one.
    warning_signal: int = 15
    warning_seconds: float = 0.0
    # the submitter's umask: the job runs with it and its output files are created 0666 less it;
    # None: output files are created 0600 and the job inherits the agent's umask
    umask: int | None = None
    # the account the job runs as (build_launch, from an Account): the supervisor looks `user`
    # up again, checks it has `uid`, and sets its groups (initgroups) and gid before it touches
    # anything the user named. None: keep the supervisor's user (an agent that is not root
    # runs only its own user's jobs)
    user: str | None = None
    uid: int | None = None
    gid: int | None = None
    attempt: int = 0  # the coordinator's start count for this start (0: unknown)
    # device rules ("c 195:1": type, major, minor; "*" for any) the job's devices cgroup
    # denies before it starts: the GPU nodes of the node's units it was not given (computed by
    # the agent, gpuq.agent.jobs.isolation.device_rules). Empty: no rule, the job sees every device.
    # Where the machine cannot enforce them the job still runs and its result says
    # isolation "advisory: <why>".
    device_deny: tuple[str, ...] = ()
    # the job's CPUs and memory nodes as cpulists ("0-3,8"), bound by its cpuset cgroup, else by
    # sched_setaffinity (which cannot bind memory nodes); None: not bound
    cpuset: str | None = None
    mems: str | None = None
    # an interactive job's terminal ({"rows", "cols", "term", "stdin_tty", "stdout_tty"}, from
    # terminal_fields): the job runs on a pseudo-terminal that the agent relays
    # (gpuq.agent.jobs.pty_relay) instead of writing output files (stdout_path is then "").
    # None: a batch job
    terminal: dict[str, Any] | None = None
    # what only the agent reads back, for a job it adopts after a restart (the supervisor
    # ignores them): the units the job was given, and a share job's VRAM limit in bytes
    # (None: not a share job). spec.json keeps them under "extra" (EXTRA_FIELDS), as every
    # agent version has written them.
    gpus: tuple[str, ...] = ()
    share_mem: int | None = None
    # the most bytes its output files may hold (its QOS's, else the node's max_output); None:
    # no limit (gpuq.agent.output_watch)
    max_output: int | None = None
    # the supervisor's lease (gpuq.agent.fencing): it stops the job at this moment of the
    # host's monotonic clock unless its agent extends it; None: no lease
    lease_until: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """spec.json's object: the supervisor's fields, and the agent's own under "extra"."""
        data = {name: getattr(self, name) for name in self.__slots__ if name not in EXTRA_FIELDS}
        extra: dict[str, Any] = {"gpus": list(self.gpus)}
        if self.share_mem is not None:
            extra["share_mem"] = self.share_mem
        if self.max_output is not None:
            extra["max_output"] = self.max_output
        data["extra"] = extra
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchSpec:
        """A spec from spec.json's object (to_dict's, or an earlier agent's: the same)."""
        values = dict(data)
        extra = values.pop("extra", None) or {}
        values["args"] = tuple(values.get("args", ()))
        values["device_deny"] = tuple(values.get("device_deny", ()))
        values["gpus"] = tuple(str(unit) for unit in extra.get("gpus") or ())
        share_mem = extra.get("share_mem")
        values["share_mem"] = share_mem if isinstance(share_mem, int) and share_mem > 0 else None
        limit = extra.get("max_output")
        values["max_output"] = limit if isinstance(limit, int) and limit > 0 else None
        return cls(**values)


# the LaunchSpec fields spec.json holds in its "extra" object
EXTRA_FIELDS = ("gpus", "share_mem", "max_output")


@dataclass(frozen=True, slots=True)
class LaunchOrder:
    """What the coordinator tells an agent to start."""

    job_id: int
    spec: JobSpec
    gpus: tuple[str, ...]  # unit UUIDs given to the job
    user: str
    time_limit: int | None = None  # effective (the QOS default filled in)
    kill_grace: float = 30.0
    array_job_id: int | None = None
    array_task_id: int | None = None
    requeue_count: int = 0
    attempt: int = 0  # the job's start count: which start of the job this is
    max_output: int | None = None  # its QOS's max_output (None: the node's applies)
    # where the job runs: every node (the first runs the script), each one's address, and
    # which of them this is; MASTER_PORT and the step secret of this start (gpuq.steps)
    gang: Gang | None = None


@dataclass(frozen=True, slots=True)
class NodePolicy:
    """The node's side of a launch: its units and what the admin configured."""

    node: str
    units: Mapping[str, GpuUnit]  # by UUID
    visible_devices: VisibleDevices = "uuid"
    # the admin's defaults (allocator settings), the full map (config merges [agent.job_env]
    # over the built-in defaults); a value the user set wins
    job_env: Mapping[str, str] = field(default_factory=dict)
    mem_enforcement: MemEnforcement = "auto"
    cgroup_parent: str | None = "gpuq"
    extra_env: Mapping[str, str] = field(default_factory=dict)  # e.g. GPUQ_FAKE_GPU_DIR
    # each unit's device nodes as (type, major, minor), by UUID (gpuq.agent.jobs.isolation.
    # device_numbers): what the job's device rules deny of the units it was not given. Empty:
    # no device rules (e.g. fake GPUs, which have no device nodes)
    devices: Mapping[str, tuple[DeviceNumber, ...]] = field(default_factory=dict)
    cgroup_key: str | None = None  # the installation's (cgroup_key): groups go below it
    cgroup_delegated: str | None = None  # the prepared delegated subtree (job_cgroups)
    job_max_pids: int = 0  # [agent] job_max_pids
    # the agent is root: a job runs as its submitter's account (uid, gid, groups), which the
    # supervisor switches to; False: the agent's own user (it runs only that user's jobs)
    switch_user: bool = False
    # the interpreter step workers and the srun shim run with (the agent's own), and the
    # folder of the srun and scontrol shims put first on jobs' PATH ("": no shims)
    python: str = ""
    shim_dir: str = ""
    # the coordinator this agent reaches: a job's `gpuq` commands (srun's FailJob) go there too
    coordinator: str = ""
    max_output: int | None = None  # [agent] max_output: a job's QOS may say otherwise


# inherited variables that would contradict the allocation if carried over
_DROPPED_PREFIXES = ("GPUQ_", "CUDA_MPS_", "SLURM_")
_DROPPED = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "OMP_NUM_THREADS",
    }
)


def build_launch(
    order: LaunchOrder,
    policy: NodePolicy,
    *,
    cpus: Sequence[int] = (),
    mems: Sequence[int] = (),
    account: Account | None = None,
    mps: MpsShare | None = None,
) -> LaunchSpec:
    """`cpus`, `mems`: the CPUs and memory nodes the agent chose for the job
    (gpuq.agent.jobs.isolation.choose_cpus); empty: not bound. `account`: the submitter's
    (checked by launch_refusal first); it sets HOME, USER, LOGNAME and SHELL whatever the
    submitter sent, and who the job runs as when the policy switches users. `mps`: a share
    job's MPS daemon and limits (gpuq.agent.jobs.mps_daemons), which its environment names;
    the spec keeps its VRAM limit, and the job's units, for an agent that adopts the job."""
    spec = order.spec
    array = (
        (order.array_job_id, order.array_task_id)
        if order.array_job_id is not None and order.array_task_id is not None
        else None
    )
    stdout, stderr = output_paths(spec, order.job_id, order.user, policy.node, array)
    if spec.terminal is not None:
        stdout = stderr = ""  # the terminal receives both
    script, args, terminal = spec.script, spec.args, spec.terminal
    if order.gang is not None and not order.gang.leads:
        # another node of a multi-node job: a step worker, whose tasks' output goes to srun
        # (an interactive job's terminal is on its first node)
        script, args, terminal = step_worker_script(policy.python), (), None
        stdout = stderr = "/dev/null"
    warning = spec.signal
    run_as = account if policy.switch_user else None
    return LaunchSpec(
        job_id=order.job_id,
        script=script,
        args=args,
        env=job_environment(order, policy, account, mps),
        cwd=spec.workdir,
        stdout_path=stdout,
        stderr_path=stderr,
        open_mode="append" if order.requeue_count > 0 else "truncate",
        time_limit=float(order.time_limit) if order.time_limit else None,
        mem_limit=spec.resources.mem,
        mem_enforcement=policy.mem_enforcement,
        cgroup_parent=policy.cgroup_parent,
        cgroup_key=policy.cgroup_key,
        cgroup_delegated=policy.cgroup_delegated,
        job_max_pids=policy.job_max_pids,
        kill_grace=order.kill_grace,
        warning_signal=warning.signal if warning else 15,
        warning_seconds=float(warning.seconds) if warning else 0.0,
        umask=spec.umask,
        user=run_as.name if run_as else None,
        uid=run_as.uid if run_as else None,
        gid=run_as.gid if run_as else None,
        attempt=order.attempt,
        device_deny=device_rules(policy.devices, order.gpus),
        cpuset=format_cpulist(cpus) or None,
        mems=format_cpulist(mems) or None,
        terminal=terminal_fields(terminal),
        gpus=order.gpus,
        share_mem=mps.mem_limit if mps is not None else None,
        max_output=order.max_output or policy.max_output,
    )


def terminal_fields(terminal: Terminal | None) -> dict[str, Any] | None:
    """The launch spec's (and so spec.json's) form of an interactive job's terminal."""
    if terminal is None:
        return None
    return {
        "rows": terminal.rows,
        "cols": terminal.cols,
        "term": terminal.term,
        "stdin_tty": terminal.stdin_tty,
        "stdout_tty": terminal.stdout_tty,
    }


def job_environment(
    order: LaunchOrder,
    policy: NodePolicy,
    account: Account | None = None,
    mps: MpsShare | None = None,
) -> dict[str, str]:
    """The submitter's environment, the admin's allocator defaults where the user set none,
    then the account's HOME, USER, LOGNAME and SHELL and the contract variables, which nobody
    overrides (DESIGN.md, job environment); for a share job (`mps`) its MPS variables."""
    spec = order.spec
    env = {
        key: value
        for key, value in spec.env.items()
        if key not in _DROPPED and not key.startswith(_DROPPED_PREFIXES)
    }
    _allocator_settings(env, policy.job_env)
    env.update(policy.extra_env)
    if account is not None:
        env.update(HOME=account.home, USER=account.name, LOGNAME=account.name, SHELL=account.shell)
    devices = visible_devices(order.gpus, policy)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": cuda_visible_devices(devices, policy, mps),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "NVIDIA_VISIBLE_DEVICES": devices or "none",
            "GPUQ_JOB_ID": str(order.job_id),
            "GPUQ_JOB_NAME": spec.name,
            "GPUQ_NODE": policy.node,
            "GPUQ_GPUS": str(len(order.gpus)),
            "GPUQ_CPUS": str(spec.resources.cpus),
            "GPUQ_SUBMIT_DIR": spec.workdir,
            "GPUQ_RESTART_COUNT": str(order.requeue_count),
            "SLURM_RESTART_COUNT": str(order.requeue_count),
            "SLURM_JOB_USER": order.user,
            "OMP_NUM_THREADS": str(spec.resources.cpus),
        }
    )
    if order.array_job_id is not None:
        env.update(array_environment(order.array_job_id, order.array_task_id, spec.array))
    if order.gang is not None:
        env.update(gang_environment(order.job_id, spec, len(order.gpus), order.gang, policy.python))
        if policy.coordinator:
            env["GPUQ_COORDINATOR"] = policy.coordinator
        if policy.shim_dir:
            env["PATH"] = f"{policy.shim_dir}:{env.get('PATH') or DEFAULT_PATH}"
    if mps is not None:
        env.update(mps_environment(mps))
    if spec.terminal is not None and spec.terminal.term:
        env["TERM"] = spec.terminal.term  # the submitter's terminal type, not the agent's
    return env


def array_environment(
    array_job_id: int, task_id: int | None, array: ArraySpec | None
) -> dict[str, str]:
    """An array task's variables, gpuq's and sbatch's (a script written for SLURM reads
    SLURM_ARRAY_TASK_ID): the array's id, the task's index and, from the array's indices,
    how many there are, the lowest, the highest and their step (1 where they are not evenly
    spaced: there is none then, and 1 is what scripts assume when it is unset)."""
    task = "" if task_id is None else str(task_id)
    env = {
        "GPUQ_ARRAY_JOB_ID": str(array_job_id),
        "GPUQ_ARRAY_TASK_ID": task,
        "SLURM_ARRAY_JOB_ID": str(array_job_id),
        "SLURM_ARRAY_TASK_ID": task,
    }
    if array is not None:
        count, low, high, step = _array_shape(array.indices)
        env.update(
            SLURM_ARRAY_TASK_COUNT=str(count),
            SLURM_ARRAY_TASK_MIN=str(low),
            SLURM_ARRAY_TASK_MAX=str(high),
            SLURM_ARRAY_TASK_STEP=str(step),
        )
    return env


def _array_shape(indices: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(count, lowest, highest, step) of an array's indices, which are distinct (ArraySpec):
    `count` of them spanning (count - 1) steps are the whole progression when each is on it,
    and a step of 1 needs no look at each (an array's launch may carry 100,000 indices)."""
    count, low, high = len(indices), min(indices), max(indices)
    step, rest = divmod(high - low, count - 1) if count > 1 else (1, 0)
    if rest or (step > 1 and any((index - low) % step for index in indices)):
        return count, low, high, 1
    return count, low, high, step


def _allocator_settings(env: dict[str, str], defaults: Mapping[str, str]) -> None:
    """The admin's defaults where the user set nothing, in place. The allocator names count as
    one setting: a value the user gave under either name is copied to the other (both given:
    each kept as given), and the admin's default (under either name) applies to both names only
    when the user set neither."""
    user_set_allocator = any(name in env for name in ALLOCATOR_NAMES)
    for key, value in defaults.items():
        if key not in ALLOCATOR_NAMES or not user_set_allocator:
            env.setdefault(key, value)
    _one_setting(env)


def _one_setting(env: dict[str, str]) -> None:
    given = [env[name] for name in ALLOCATOR_NAMES if name in env]
    if given:
        for name in ALLOCATOR_NAMES:
            env.setdefault(name, given[0])


def visible_devices(gpus: tuple[str, ...], policy: NodePolicy) -> str:
    """CUDA_VISIBLE_DEVICES in PCI order: UUIDs by default, NVML indices if the admin asks.

    MIG slices are always named by UUID: an index cannot name a slice.
    """
    units = sorted((policy.units[uuid] for uuid in gpus), key=lambda u: (u.pci_bus_id, u.uuid))
    if policy.visible_devices == "index" and not any(u.parent_uuid for u in units):
        return ",".join(str(u.index) for u in units)
    return ",".join(u.uuid for u in units)


def cuda_visible_devices(devices: str, policy: NodePolicy, mps: MpsShare | None) -> str:
    """CUDA_VISIBLE_DEVICES as the job's CUDA numbers devices. A share job is a client of an
    MPS server that sees its one GPU only, as device 0: a host index (GPU 1) would name no
    device there, so with `visible_devices = "index"` it gets 0; a UUID names the GPU anywhere.
    NVIDIA_VISIBLE_DEVICES keeps the host's names (container runtimes read them on the host)."""
    if mps is not None and policy.visible_devices == "index" and devices.isdigit():
        return "0"
    return devices


def cgroup_key(run_dir: str, node: str) -> str:
    """The installation's key for its job cgroups on this node: 12 hex digits of a hash of its
    run folder (one per installation, GPUQ_HOME, and node) and the node's name."""
    return hashlib.sha256(f"{run_dir}\0{node}".encode()).hexdigest()[:12]
