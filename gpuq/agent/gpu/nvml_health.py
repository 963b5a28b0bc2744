"""What NVML's bad news means: XID classification, error texts and health reasons.

Pure functions only, shared by the NVML backend and its tests. What each XID means, and which
are the application's fault (and so must not drain a GPU), is gpuq.domain.xids's table.
"""

from __future__ import annotations

from gpuq.domain.xids import is_hardware_xid, xid_text

# XID that a double-bit ECC event (nvmlEventTypeDoubleBitEccError) stands for.
DBE_XID = 48

GPU_LOST_TEXT = "GPU is lost (fell off the bus, XID 79?)"

# Every reason that says a GPU needs a reset names the one order that works: nvidia-smi -r
# refuses while any process (the agent's NVML handle included) holds the GPU open.
RESET_STEPS = (
    "reset it: gpuq drain NODE --reason TEXT, systemctl stop gpuq-agent, nvidia-smi -r -i N, "
    "systemctl start gpuq-agent, gpuq resume NODE"
)


def classify_xid(xid: int) -> tuple[bool, str]:
    """(hardware, one-line text) for an XID: hardware XIDs make the unit unhealthy."""
    return is_hardware_xid(xid), xid_text(xid)


def error_name(error: BaseException) -> str:
    """NVML's short name for an error: "GpuIsLost" for NVMLError_GpuIsLost, and so on."""
    name = type(error).__name__
    if name == "NVMLLibraryMismatchError":
        return "LibraryMismatch"
    return name.removeprefix("NVMLError_") if name != "NVMLError" else "NVMLError"


def describe_error(call: str, error: BaseException) -> str:
    """One line naming the NVML call and what went wrong, for a unit's health reason."""
    name = error_name(error)
    if name == "GpuIsLost":
        return f"{call}: {GPU_LOST_TEXT}"
    text = " ".join(str(error).split()) or name
    if len(text) > 160:
        text = text[:157] + "..."
    if name == "LibraryMismatch":
        return f"{call}: NVML library mismatch ({text})"
    return f"{call}: {text} ({name})" if text != name else f"{call}: {name}"


def ecc_reason(uncorrected_volatile: int) -> str:
    """The health reason for volatile uncorrected ECC errors; "" when there are none."""
    if uncorrected_volatile <= 0:
        return ""
    return (
        f"{uncorrected_volatile} uncorrected ECC error(s) since the driver loaded "
        f"(nvmlDeviceGetTotalEccErrors): needs a reset; {RESET_STEPS}"
    )


def remap_reason(pending: int, failure: int) -> str:
    """The health reason from nvmlDeviceGetRemappedRows' pending and failure flags; "" if fine."""
    if failure:
        return "row remapping failed (nvmlDeviceGetRemappedRows): the GPU needs service"
    if pending:
        return f"row remapping pending (nvmlDeviceGetRemappedRows): needs a reset; {RESET_STEPS}"
    return ""


# NVML's GPU fabric states (nvmlGpuFabricState_t)
FABRIC_NOT_SUPPORTED, FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS, FABRIC_COMPLETED = 0, 1, 2, 3
_FABRIC_WAITING = {FABRIC_NOT_STARTED: "not started", FABRIC_IN_PROGRESS: "in progress"}


def fabric_waiting(state: int) -> bool:
    """Whether an NVSwitch GPU is still waiting for its fabric (not started, in progress)."""
    return state in _FABRIC_WAITING


def fabric_reason(state: int, status: int, status_name: str, waited: float, grace: float) -> str:
    """The health reason from nvmlDeviceGetGpuFabricInfo; "" when the GPU may run jobs.

    Registration that completed with an error is a fault at once. A fabric still "not started"
    or "in progress" is normal for a minute after boot, but past `grace` seconds (`waited`:
    since the agent first saw it so) it means nvidia-fabricmanager is not running: every CUDA
    program on the GPU would fail at start (error 802, "system not yet initialized"), so the
    GPU must not be given out. Non-NVSwitch GPUs report FABRIC_NOT_SUPPORTED: fine.
    """
    if state == FABRIC_COMPLETED and status != 0:
        return (
            f"NVSwitch fabric registration failed ({status_name}) (nvmlDeviceGetGpuFabricInfo): "
            "see journalctl -u nvidia-fabricmanager"
        )
    if not fabric_waiting(state) or waited < grace:
        return ""
    return (
        f"fabric manager not running: NVSwitch fabric {_FABRIC_WAITING[state]} for "
        f"{waited:.0f} s (nvmlDeviceGetGpuFabricInfo), CUDA jobs would fail with error 802; "
        "start it: systemctl enable --now nvidia-fabricmanager"
    )
