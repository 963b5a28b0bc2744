"""What NVML's bad news means: XID classification, error texts and health reasons.

Pure functions only, shared by the NVML backend and its tests. The XID list follows NVIDIA's
"XID Errors" catalogue; which XIDs are the application's fault (and so must not drain a GPU)
follows NVIDIA's Kubernetes device plugin, which ignores 13, 31, 43, 45, 68 and 109 when it
decides whether a GPU is healthy: they are raised by a faulting program (an illegal address,
a kernel timeout, a killed context) and the GPU works for the next job.
"""

from __future__ import annotations

# XIDs caused by the running program, not the hardware (NVIDIA k8s-device-plugin's defaults).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

# A short description for the XIDs an admin meets most; others are "XID N".
XID_TEXT: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault (MMU fault)",
    43: "GPU stopped processing",
    45: "preemptive cleanup after a fault",
    48: "double-bit ECC error (DBE)",
    63: "row remapping recorded (ECC page retirement)",
    64: "row remapping failed",
    68: "video processor exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}

# XID that a double-bit ECC event (nvmlEventTypeDoubleBitEccError) stands for.
DBE_XID = 48

GPU_LOST_TEXT = "GPU is lost (fell off the bus, XID 79?)"


def classify_xid(xid: int) -> tuple[bool, str]:
    """(hardware, one-line text) for an XID: hardware XIDs make the unit unhealthy."""
    known = XID_TEXT.get(xid)
    text = f"XID {xid} ({known})" if known else f"XID {xid}"
    return xid not in APPLICATION_XIDS, text


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
        "(nvmlDeviceGetTotalEccErrors); the GPU needs a reset"
    )


def remap_reason(pending: int, failure: int) -> str:
    """The health reason from nvmlDeviceGetRemappedRows' pending and failure flags; "" if fine."""
    if failure:
        return "row remapping failed (nvmlDeviceGetRemappedRows): the GPU needs service"
    if pending:
        return "row remapping pending (nvmlDeviceGetRemappedRows): the GPU needs a reset"
    return ""


def fabric_reason(state: int, status: int, completed_state: int, status_name: str) -> str:
    """The reason when NVSwitch fabric registration completed with an error; "" otherwise.

    A fabric still registering (not started, in progress) is not a fault: the GPU is not
    usable for NVLink jobs yet, but NVIDIA's fabric manager finishes within minutes.
    """
    if state != completed_state or status == 0:
        return ""
    return f"NVSwitch fabric registration failed ({status_name}) (nvmlDeviceGetGpuFabricInfo)"
