"""The files that drive fake GPUs while they run, and the calls that write them.

What a fake job calls where a real one would allocate CUDA memory or load a GPU
(claim_fake_vram, set_fake_utilization, set_fake_energy), and the folder they write in: the
FakeGpuBackend's state_dir, which the agent hands to fake jobs as GPUQ_FAKE_GPU_DIR.
FakeNvmlLibrary (fake.nvml_library) reads these files at call time.

State folder (`state_dir`, or GPUQ_FAKE_GPU_DIR), read at call time; UUID is a unit's (GPU-...
or MIG-...); a GPU's UUID also covers its MIG slices where noted:

    UUID/PID              a process using VRAM: "BYTES [compute|graphics|mps] [stuck]"; listed
                          while PID lives (a dead PID's file is deleted), or until the file is
                          removed when "stuck" (a context the driver has not torn down)
    UUID/utilization      a percent (whole GPUs; MIG slices report NotSupported -> unknown),
                          or a series "90 90 0 [every=S]": one value after the other every S
                          seconds (default 1) from the file's last write, the last one holding
    GPU-UUID/energy       the board's total-energy counter in millijoules; without it the
                          counter grows from 0 at 50 W plus 3.5 W per percent of utilisation
                          (write a smaller value to model a reset); MIG slices: NotSupported
    nodriver              nvmlInit raises DriverNotLoaded
    GPU-UUID/lost         every call on that GPU and its slices raises GpuIsLost
    errors                lines "FUNCTION ERROR [UUID]": that NVML call raises NVMLError_ERROR
                          (Unknown, GpuIsLost, NotSupported, Timeout, FunctionNotFound, ... or
                          LibraryMismatch for NVMLLibraryMismatchError), only for calls on that
                          unit (or GPU and its slices) when UUID is given. The memory call with
                          a version is named nvmlDeviceGetMemoryInfo_v2.
    UUID/xid              one XID per line; each line is delivered once by the event set (for a
                          slice's UUID: on its GPU, with the slice's GPU/compute instance ids)
    GPU-UUID/ecc          volatile uncorrected ECC error count
    GPU-UUID/remap        "pending" or "failure" (nvmlDeviceGetRemappedRows)
    GPU-UUID/fabric       NVSwitch fabric state (GPUs with NVLink only; none: completed):
                          "not started", "in progress", "completed", or an NVML error name
                          ("completed ERROR" alike): registration completed with that error;
                          read at each health poll, so rewriting it changes the state live
    GPU-UUID/mig          a new MIG layout for that GPU (the mig= value; "off": no MIG)
    GPU-UUID/compute_mode the compute mode nvmlDeviceSetComputeMode set (0 DEFAULT, 3
                          EXCLUSIVE_PROCESS: MPS); write "noperm" to refuse it (NoPermission)
    dev/, mig-minors      written by the library: when root, device nodes dev/nvidiaN
                          (195:N) and dev/nvidia-caps/nvidia-capN (237:N) for MIG slices
    proc-devices,         written by the library: the driver's /proc/devices lines and each
    capabilities/         slice's capabilities/gpuN/mig/giG[/ciC]/access (DeviceFileMinor, Mode)
    caps-late             while it exists the library makes no dev/nvidia-caps nodes (as after
                          a fresh MIG layout no CUDA program used yet): a root agent makes them
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuq.errors import InvalidInput

FAKE_GPU_DIR_ENV = "GPUQ_FAKE_GPU_DIR"
_SAFE_UUID_RE = re.compile(r"^[A-Za-z0-9-]+$")


def fake_state_dir() -> Path | None:
    """The fake GPUs' state folder named by GPUQ_FAKE_GPU_DIR, or None when it is unset."""
    value = os.environ.get(FAKE_GPU_DIR_ENV, "")
    return Path(value) if value else None


def fake_cuda_devices(env: Mapping[str, str] | None = None) -> list[str]:
    """The fake units a CUDA program with environment env (default: this process's) sees, in
    CUDA's device order: what a fake job should claim on.

    CUDA_VISIBLE_DEVICES names UUIDs or indices. A client of a fake MPS server (its folder in
    CUDA_MPS_PIPE_DIRECTORY) sees only the server's GPUs, renumbered from 0 as the real server
    does: index 1 there names no device when the server serves one GPU. Without a server an
    index cannot be resolved here (InvalidInput): fake jobs are given UUIDs.
    """
    env = os.environ if env is None else env
    wanted = [w.strip() for w in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if w.strip()]
    served = _mps_served(env.get("CUDA_MPS_PIPE_DIRECTORY", ""))
    if served is None:
        if any(w.isdigit() for w in wanted):
            raise InvalidInput("CUDA_VISIBLE_DEVICES", ",".join(wanted), "fake GPUs need UUIDs")
        return wanted
    found: list[str] = []
    for word in wanted:
        if word.isdigit():
            if int(word) >= len(served):
                break  # CUDA stops at the first device it cannot find
            found.append(served[int(word)])
        elif word in served:
            found.append(word)
    return found


def _mps_served(pipe: str) -> list[str] | None:
    """The UUIDs the fake MPS server in folder pipe serves; None where there is no server."""
    if not pipe:
        return None
    try:
        text = (Path(pipe) / "devices").read_text()
    except OSError:
        return None
    return [w.strip() for w in text.split(",") if w.strip()]


def claim_fake_vram(
    uuid: str,
    nbytes: int,
    pid: int | None = None,
    state_dir: Path | None = None,
    *,
    kind: str = "compute",
    stuck: bool = False,
) -> Path:
    """Say that pid (default: this process) uses nbytes of VRAM on fake unit uuid; 0 releases.

    What a fake job calls where a real one would allocate CUDA memory. kind: "compute",
    "graphics" or "mps" (the NVML list it shows in); stuck: listed even after pid died, until
    released (a straggler that will not die). The file appears whole (written aside, then
    renamed), so the library never reads half a line. Returns the file.
    """
    folder = _unit_dir(uuid, state_dir)
    owner = os.getpid() if pid is None else pid
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise InvalidInput("nbytes", nbytes, "must be a whole number of bytes, 0 or more")
    if kind not in ("compute", "graphics", "mps"):
        raise InvalidInput("kind", kind, "must be compute, graphics or mps")
    path = folder / str(owner)
    if nbytes == 0:
        path.unlink(missing_ok=True)
        return path
    folder.mkdir(parents=True, exist_ok=True)
    words = [str(nbytes)] + ([kind] if kind != "compute" else []) + (["stuck"] if stuck else [])
    partial = folder / f".{owner}.{os.getpid()}.partial"
    partial.write_text(" ".join(words) + "\n")
    os.replace(partial, path)
    return path


def set_fake_utilization(
    uuid: str,
    percent: int | Sequence[int],
    state_dir: Path | None = None,
    *,
    every: float = 1.0,
) -> None:
    """Set what usage() reports as fake unit uuid's utilisation (0 to 100): one value, or a
    series whose values follow each other every `every` seconds from now, the last holding."""
    values = [percent] if isinstance(percent, int) else list(percent)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise InvalidInput("percent", percent, "must be a percent or a series of percents")
    if not every > 0:
        raise InvalidInput("every", every, "must be more than 0 seconds")
    text = " ".join(str(v) for v in values) + (f" every={every:g}" if len(values) > 1 else "")
    _write_unit_file(uuid, "utilization", text, state_dir)


def set_fake_energy(uuid: str, millijoules: int | None, state_dir: Path | None = None) -> None:
    """Set fake GPU uuid's total-energy counter (millijoules); None: back to the simulated one."""
    if millijoules is None:
        (_unit_dir(uuid, state_dir) / "energy").unlink(missing_ok=True)
        return
    _write_unit_file(uuid, "energy", str(int(millijoules)), state_dir)


def _write_unit_file(uuid: str, name: str, text: str, state_dir: Path | None) -> None:
    folder = _unit_dir(uuid, state_dir)
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{name}.{os.getpid()}.partial"
    partial.write_text(f"{text}\n")
    os.replace(partial, folder / name)


def _unit_dir(uuid: str, state_dir: Path | None) -> Path:
    base = state_dir if state_dir is not None else fake_state_dir()
    if base is None:
        raise InvalidInput(FAKE_GPU_DIR_ENV, "", "is not set and no state_dir was given")
    if not _SAFE_UUID_RE.match(uuid):
        raise InvalidInput("uuid", uuid, "expected a fake GPU or MIG UUID")
    return base / uuid
