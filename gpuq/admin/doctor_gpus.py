"""The doctor's GPU checks: what only shows on a real machine and makes GPU jobs fail or run
unisolated (issue 24): the driver, NVSwitch's fabric manager, MPS, and MIG's caps nodes.

They read the GPUs through the backend the agent would use (NVML, or the fakes the config
names) and every file through the context's roots, so tests point them at fakes. The backend
is opened only to look: it makes no missing MIG caps nodes (the agent does, as root).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpuq.admin.checks import Check, DoctorContext
from gpuq.agent.fake.gpu_backend import FakeGpuBackend
from gpuq.agent.gpu.device_paths import DevicePaths
from gpuq.agent.gpu.nvml_backend import MIN_DRIVER, NvmlGpuBackend, older_driver
from gpuq.agent.gpu.nvml_health import FABRIC_COMPLETED, fabric_waiting
from gpuq.agent.jobs.mps_node_scan import DEFAULT_PIPE_DIR, node_wide_mps
from gpuq.domain.model import GpuUnit

NVIDIA_VENDOR = "0x10de"
MPS_CONTROL = "nvidia-cuda-mps-control"
START_FABRIC = "systemctl enable --now nvidia-fabricmanager (the same version as the driver)"


def gpu_checks(ctx: DoctorContext) -> list[Check]:
    """The driver, fabric manager, MPS and MIG checks, in that order."""
    with _backend(ctx) as backend:
        checks = [_driver(ctx, backend)]
        checks.append(_fabric(backend))
        checks += _mps(ctx)
        checks += _mig(backend)
    return checks


@contextmanager
def _backend(ctx: DoctorContext) -> Iterator[NvmlGpuBackend]:
    agent = ctx.settings.agent
    backend: NvmlGpuBackend
    if agent.fake_gpus is not None:
        state = Path(ctx.extra.get("fake_gpu_dir") or ctx.settings.agent_state_dir / "fake-gpus")
        backend = FakeGpuBackend(agent.fake_gpus, agent.node_name, state, make_caps=False)
    else:
        backend = NvmlGpuBackend(paths=_device_paths(ctx))
    try:
        yield backend
    finally:
        backend.close()


def _device_paths(ctx: DoctorContext) -> DevicePaths:
    return DevicePaths(
        dev_root=ctx.dev,
        mig_minors=ctx.proc / "driver" / "nvidia-caps" / "mig-minors",
        pci_devices=ctx.sys / "bus" / "pci" / "devices",
        proc_devices=ctx.proc / "devices",
        capabilities=ctx.proc / "driver" / "nvidia" / "capabilities",
        make_caps=False,
    )


def _driver(ctx: DoctorContext, backend: NvmlGpuBackend) -> Check:
    """A node without a driver runs CPU jobs only: fine on a CPU machine, a failure on one
    with NVIDIA GPUs in it (its GPUs would silently go unused)."""
    inventory = backend.inventory()
    if inventory.fake:
        return Check("driver", "skip", f"fake GPUs ({ctx.settings.agent.fake_gpus}): no driver")
    if inventory.problem:
        boards = _nvidia_boards(ctx.sys)
        if not boards:
            return Check("driver", "skip", f"no NVIDIA GPU in this machine: {inventory.problem}")
        return Check(
            "driver",
            "fail",
            f"{len(boards)} NVIDIA device(s) on the PCI bus, but {inventory.problem}",
            "install or load the NVIDIA driver (nvidia-smi must list the GPUs), then restart "
            "gpuq-agent; nvidia-ml-py must be installed beside gpuq",
        )
    count = len({u.parent_uuid or u.uuid for u in inventory.units})
    detail = f"NVIDIA driver {inventory.driver}, NVML {backend.nvml_version()}, {count} GPU(s)"
    if older_driver(inventory.driver, MIN_DRIVER):
        return Check("driver", "warn", detail, f"upgrade the driver to {MIN_DRIVER} or newer")
    return Check("driver", "ok", detail)


def _nvidia_boards(sys_root: Path) -> list[str]:
    """PCI devices of NVIDIA's vendor id (GPUs and NVSwitches), by sysfs."""
    found = []
    try:
        entries = sorted((sys_root / "bus" / "pci" / "devices").iterdir())
    except OSError:
        return []
    for entry in entries:
        try:
            if (entry / "vendor").read_text().strip().lower() == NVIDIA_VENDOR:
                found.append(entry.name)
        except OSError:
            continue
    return found


def _fabric(backend: NvmlGpuBackend) -> Check:
    states = backend.fabric_states()
    if not states:
        return Check("fabric manager", "skip", "no NVSwitch fabric (or a driver before R530)")
    waiting = sorted(uuid for uuid, (state, _) in states.items() if fabric_waiting(state))
    failed = {u: e for u, (state, e) in states.items() if state == FABRIC_COMPLETED and e}
    if waiting:
        return Check(
            "fabric manager",
            "fail",
            f"fabric manager not running: the NVSwitch fabric of {len(waiting)} GPU(s) is not "
            "registered (not started or in progress); CUDA jobs fail at start (error 802)",
            START_FABRIC,
        )
    if failed:
        errors = ", ".join(sorted(set(failed.values())))
        return Check(
            "fabric manager",
            "fail",
            f"NVSwitch fabric registration failed on {len(failed)} GPU(s) ({errors})",
            "see journalctl -u nvidia-fabricmanager; restart it, and reset the GPUs if it persists",
        )
    return Check("fabric manager", "ok", f"NVSwitch fabric registered on {len(states)} GPU(s)")


def _mps(ctx: DoctorContext) -> list[Check]:
    """The MPS control binary (for [agent] shared_gpus) and a node-wide daemon (any node)."""
    agent = ctx.settings.agent
    checks: list[Check] = []
    if not agent.shared_gpus.strip():
        checks.append(Check("MPS binary", "skip", "no GPU is shared ([agent] shared_gpus)"))
    elif agent.fake_gpus is not None:
        checks.append(Check("MPS binary", "skip", "fake GPUs use the fake MPS daemon"))
    elif found := shutil.which(MPS_CONTROL, path=ctx.extra.get("path")):
        checks.append(Check("MPS binary", "ok", found))
    else:
        checks.append(
            Check(
                "MPS binary",
                "fail",
                f"{MPS_CONTROL} is not on PATH, but [agent] shared_gpus shares GPUs: share "
                "jobs cannot start",
                "install the NVIDIA driver's utilities (nvidia-utils / nvidia-compute-utils), "
                "or clear [agent] shared_gpus",
            )
        )
    pipe = Path(ctx.extra.get("mps_pipe") or DEFAULT_PIPE_DIR)
    # the agent's own daemons keep their pipes in its run folder (<run folder>/mps/<gpu>/pipe)
    folders = (agent.run_dir, ctx.settings.agent_run_root, ctx.settings.agent_state_dir)
    roots = tuple(str(folder) for folder in folders if folder)
    problem = node_wide_mps(
        lambda pid: _agents_mps(ctx.proc, pid, roots), proc=ctx.proc, default_pipe=pipe
    )
    if problem is None:
        checks.append(Check("node-wide MPS", "ok", "no MPS daemon outside gpuq runs"))
    else:
        detail, _, fix = problem.removeprefix("misconfigured: ").partition("; ")
        checks.append(Check("node-wide MPS", "fail", f"{detail}; the node takes no work", fix))
    return checks


def _agents_mps(proc: Path, pid: int, roots: tuple[str, ...]) -> bool:
    """Whether pid is an MPS daemon the agent started: its pipe folder is under the agent's."""
    try:
        environ = (proc / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return False
    for entry in environ:
        key, _, value = entry.decode(errors="replace").partition("=")
        if key == "CUDA_MPS_PIPE_DIRECTORY":
            return any(value.startswith(root.rstrip("/") + "/") for root in roots)
    return False


def _mig(backend: NvmlGpuBackend) -> list[Check]:
    """MIG mode per GPU, and whether each slice's /dev/nvidia-caps nodes exist (without them
    its job's device rules cannot be made and jobs on the node run unisolated)."""
    inventory = backend.inventory()
    slices: dict[str, list[GpuUnit]] = {}
    for unit in inventory.units:
        if unit.parent_uuid is not None:
            slices.setdefault(unit.parent_uuid, []).append(unit)
    if not slices:
        return [Check("MIG", "skip", "no GPU in MIG mode")]
    if inventory.fake and os.geteuid() != 0:
        return [Check("MIG", "skip", "fake GPUs have device nodes only when run as root")]
    checks = []
    for units in slices.values():
        index = units[0].index
        missing = [u for u in units if not inventory.devices.get(u.uuid)]
        profiles = ", ".join(u.mig_profile or "?" for u in units)
        if not missing:
            checks.append(Check(f"MIG GPU {index}", "ok", f"{len(units)} slices ({profiles})"))
            continue
        checks.append(
            Check(
                f"MIG GPU {index}",
                "fail",
                f"{len(missing)} of {len(units)} slices have no /dev/nvidia-caps access nodes "
                f"(a fresh MIG layout: nvidia-modprobe makes them at first use): jobs there "
                "would run unisolated",
                "run gpuq-agent as root (it makes them at its next GPU rescan), or run a CUDA "
                "program or nvidia-smi on each slice once",
            )
        )
    return checks
