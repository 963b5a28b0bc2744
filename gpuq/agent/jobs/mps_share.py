"""What GPU sharing through MPS means for a job: which GPUs are shared, and what a share job sees.

An admin shares GPUs with `[agent] shared_gpus` ("all", or indices and UUIDs; whole GPUs only,
a MIG slice is never shared). A share job (`--gpu-share PCT --gpu-mem SIZE`) gets one such GPU
and runs as a client of that GPU's MPS control daemon (gpuq.agent.jobs.mps_daemons); its
environment names the daemon's folders and its limits (mps_environment).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuq.domain.model import GpuUnit

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class MpsShare:
    """What a share job's environment says: its daemon's folders and its limits."""

    pipe_dir: str
    log_dir: str
    percent: int  # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
    mem_limit: int  # bytes of VRAM (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, in MiB)


def mps_environment(share: MpsShare) -> dict[str, str]:
    """The contract variables of a share job (it sees one GPU: device ordinal 0)."""
    mib = max(1, share.mem_limit // MIB)
    return {
        "CUDA_MPS_PIPE_DIRECTORY": share.pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": share.log_dir,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(share.percent),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={mib}M",
    }


def shared_units(units: Iterable[GpuUnit], setting: str) -> tuple[frozenset[str], list[str]]:
    """The UUIDs of the units `[agent] shared_gpus` names ("all", or indices and UUIDs,
    comma-separated), whole GPUs only; and the entries that name no whole GPU here."""
    whole = [u for u in units if not (u.parent_uuid or u.mig_profile)]
    text = setting.strip()
    if not text:
        return frozenset(), []
    if text.lower() == "all":
        return frozenset(u.uuid for u in whole), []
    chosen: set[str] = set()
    unknown: list[str] = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        found = [u for u in whole if u.uuid.lower() == entry.lower() or str(u.index) == entry]
        if found:
            chosen.update(u.uuid for u in found)
        else:
            unknown.append(entry)
    return frozenset(chosen), unknown
