"""What an XID means, and what to do about it: the one table, used by the agent (which XIDs
take a GPU out of service, the one-line text its reports carry) and by a job's diagnosis (the
meaning and the next step it shows).

Meanings follow NVIDIA's "XID Errors" catalogue. Which XIDs are the application's fault (and
so must not drain a GPU) follows NVIDIA's Kubernetes device plugin, which ignores 13, 31, 43,
45, 68 and 109 when it decides whether a GPU is healthy: they are raised by a faulting program
(an illegal address, a kernel timeout, a killed context) and the GPU works for the next job.
Pure data.
"""

from __future__ import annotations

import re

# XIDs caused by the running program, not the hardware (NVIDIA k8s-device-plugin's defaults).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

# A short description for the XIDs an admin meets most; others are "XID N".
XID_TEXT: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault (MMU fault)",
    32: "invalid or corrupted push buffer stream",
    38: "driver firmware error",
    43: "GPU stopped processing",
    45: "preemptive cleanup after a fault",
    48: "double-bit ECC error (DBE)",
    61: "internal micro-controller breakpoint or warning",
    62: "internal micro-controller halt",
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

_RESET = "the GPU needs a reset before it takes jobs again (an admin's `nvidia-smi -r`)"
_RESUBMIT = "not the job's fault: resubmit it (it runs on another GPU)"

# What a job's owner should do after each XID (its diagnosis's next step).
XID_ADVICE: dict[int, str] = {
    13: "the job's own kernels faulted (an out-of-range index, an illegal instruction): rerun "
    "with CUDA_LAUNCH_BLOCKING=1 to see which call, or under compute-sanitizer",
    31: "the job's kernels touched memory they do not own (an illegal address): rerun with "
    "CUDA_LAUNCH_BLOCKING=1 or under compute-sanitizer; rarely, a driver bug",
    32: f"a driver or PCIe problem, {_RESUBMIT}; an admin should check the node's PCIe errors",
    38: f"a driver firmware problem, {_RESUBMIT}; an admin should update the driver",
    43: "the job's context was stopped after a fault of its own (often with XID 13 or 31): "
    "look for a CUDA error in its output",
    45: "the job's context was cleaned up after an earlier fault or a kill: look for the "
    "first error in its output",
    48: f"an uncorrectable memory error on the GPU, {_RESUBMIT}; {_RESET}",
    61: f"the GPU's firmware stopped, {_RESUBMIT}; {_RESET}",
    62: f"the GPU's firmware halted, {_RESUBMIT}; {_RESET}",
    63: f"the GPU retired a memory row, {_RESUBMIT}; {_RESET} to apply it",
    64: f"the GPU could not retire a bad memory row, {_RESUBMIT}; an admin should consider an RMA",
    68: "the job's video decoding faulted: check its NVDEC use",
    74: f"an NVLink error between GPUs, {_RESUBMIT}; an admin should check the links "
    "(nvidia-smi nvlink -s) and reset the GPUs",
    79: f"the GPU dropped off the PCIe bus (power, heat or the slot), {_RESUBMIT}; an admin "
    "must reset or reboot the node",
    92: f"the GPU corrects many memory errors, {_RESUBMIT}; an admin should watch its ECC counts",
    94: f"an ECC error the GPU contained to this job, {_RESUBMIT}; {_RESET}",
    95: f"an uncontained ECC error (every job on the GPU is affected), {_RESUBMIT}; {_RESET}",
    109: "a context switch timed out, often a job's kernel that never yields: look at its long "
    "kernels; rarely the hardware",
    119: f"the GPU's GSP firmware stopped answering, {_RESUBMIT}; {_RESET} (or a driver update)",
    120: f"the GPU's GSP firmware failed, {_RESUBMIT}; {_RESET}",
}

_XID = re.compile(r"\bXID (\d{1,4})\b")


def xid_text(xid: int) -> str:
    """One line: "XID 79 (GPU has fallen off the bus)", or "XID N" for one not in the table."""
    known = XID_TEXT.get(xid)
    return f"XID {xid} ({known})" if known else f"XID {xid}"


def is_hardware_xid(xid: int) -> bool:
    """True when the XID takes its GPU out of service (not the running program's fault)."""
    return xid not in APPLICATION_XIDS


def xid_advice(xid: int) -> str:
    """The next step for a job that met `xid`."""
    if xid in XID_ADVICE:
        return XID_ADVICE[xid]
    if is_hardware_xid(xid):
        return f"a GPU fault, {_RESUBMIT}; an admin should look the XID up in NVIDIA's catalogue"
    return "the job's own fault on the GPU: look for a CUDA error in its output"


def xids_in(text: str) -> list[int]:
    """The XIDs a reason names ("... XID 48 (double-bit ECC error) on GPU 0"), in order."""
    return [int(found) for found in _XID.findall(text)]
