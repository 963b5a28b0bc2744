"""XID classification and the one-line reasons a unhealthy unit carries."""

from __future__ import annotations

import pynvml
import pytest

from gpuq.agent.gpu.nvml_health import (
    classify_xid,
    describe_error,
    ecc_reason,
    error_name,
    fabric_reason,
    remap_reason,
)
from gpuq.domain.xids import APPLICATION_XIDS


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS))
def test_application_xids_do_not_drain(xid: int) -> None:
    hardware, text = classify_xid(xid)
    assert not hardware and text.startswith(f"XID {xid} (")


@pytest.mark.parametrize(
    ("xid", "words"),
    [
        (48, "double-bit ECC"),
        (63, "row remapping"),
        (64, "row remapping failed"),
        (74, "NVLink"),
        (79, "fallen off the bus"),
        (92, "single-bit"),
        (94, "contained ECC"),
        (95, "uncontained ECC"),
        (119, "GSP"),
        (120, "GSP"),
    ],
)
def test_hardware_xids_drain_and_say_what_they_are(xid: int, words: str) -> None:
    hardware, text = classify_xid(xid)
    assert hardware and words in text


def test_an_unknown_xid_is_hardware_with_a_plain_text() -> None:
    assert classify_xid(1234) == (True, "XID 1234")


def test_errors_are_named_in_one_line() -> None:
    lost = describe_error(
        "nvmlDeviceGetMemoryInfo", pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    )
    assert lost == "nvmlDeviceGetMemoryInfo: GPU is lost (fell off the bus, XID 79?)"
    unknown = describe_error("nvmlDeviceGetUUID", pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN))
    assert unknown == "nvmlDeviceGetUUID: Unknown Error (Unknown)"
    mismatch = pynvml.NVMLLibraryMismatchError("Unversioned function called\nand more")
    assert error_name(mismatch) == "LibraryMismatch"
    assert "\n" not in describe_error("x", mismatch) and "library mismatch" in describe_error(
        "x", mismatch
    )


def test_health_reasons() -> None:
    assert ecc_reason(0) == "" and "2 uncorrected ECC" in ecc_reason(2)
    assert remap_reason(0, 0) == ""
    assert "pending" in remap_reason(1, 0) and "failed" in remap_reason(1, 1)
    assert fabric_reason(2, 0, "", waited=10, grace=120) == ""  # still registering
    assert fabric_reason(0, 0, "", waited=999, grace=120) == ""  # no NVSwitch
    assert fabric_reason(3, 0, "", waited=0, grace=120) == ""
    assert "Unknown" in fabric_reason(3, 999, "Unknown", waited=0, grace=120)
    late = fabric_reason(1, 0, "", waited=130, grace=120)
    assert late.startswith("fabric manager not running") and "not started for 130 s" in late
    assert "systemctl enable --now nvidia-fabricmanager" in late
    assert "in progress" in fabric_reason(2, 0, "", waited=120, grace=120)


def test_reset_reasons_say_to_stop_the_agent_before_nvidia_smi() -> None:
    for reason in (ecc_reason(1), remap_reason(1, 0)):
        steps = ["gpuq drain", "systemctl stop gpuq-agent", "nvidia-smi -r -i", "gpuq resume"]
        where = [reason.index(step) for step in steps]
        assert where == sorted(where), reason
