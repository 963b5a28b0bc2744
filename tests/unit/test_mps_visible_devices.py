"""What a share job's CUDA sees: its MPS server numbers its one GPU 0, so index visibility
must name 0 (not the host index); UUIDs name the GPU anywhere; the fake resolves as CUDA does."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuq.agent.fake.gpu_state import fake_cuda_devices
from gpuq.agent.jobs.launch_spec import LaunchOrder, NodePolicy, job_environment
from gpuq.agent.jobs.mps_share import MpsShare
from gpuq.domain.model import GpuUnit, JobSpec
from gpuq.errors import InvalidInput

UNITS = {
    f"GPU-{i}": GpuUnit(uuid=f"GPU-{i}", index=i, name="fake", memory=1 << 30, pci_bus_id=f"0:{i}")
    for i in range(2)
}
SHARE = MpsShare("/run/mps/pipe", "/run/mps/log", 50, 20 << 30)


def env(visible: str, mps: MpsShare | None) -> dict[str, str]:
    spec = JobSpec(name="j", script="#!/bin/sh\ntrue\n", workdir="/tmp")
    order = LaunchOrder(job_id=1, spec=spec, gpus=("GPU-1",), user="u")
    policy = NodePolicy(node="n1", units=UNITS, visible_devices=visible)  # type: ignore[arg-type]
    return job_environment(order, policy, None, mps)


@pytest.mark.parametrize(
    ("visible", "mps", "cuda", "nvidia"),
    [
        ("index", SHARE, "0", "1"),  # the MPS server's device 0; the host's GPU 1
        ("index", None, "1", "1"),
        ("uuid", SHARE, "GPU-1", "GPU-1"),
        ("uuid", None, "GPU-1", "GPU-1"),
    ],
)
def test_a_share_jobs_device_is_named_as_its_mps_server_numbers_it(
    visible: str, mps: MpsShare | None, cuda: str, nvidia: str
) -> None:
    found = env(visible, mps)
    assert found["CUDA_VISIBLE_DEVICES"] == cuda
    assert found["NVIDIA_VISIBLE_DEVICES"] == nvidia


def test_the_fake_resolves_devices_through_its_mps_server(tmp_path: Path) -> None:
    (tmp_path / "devices").write_text("GPU-1\n")  # what the fake MPS daemon writes
    mps = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}
    assert fake_cuda_devices({**mps, "CUDA_VISIBLE_DEVICES": "0"}) == ["GPU-1"]
    assert fake_cuda_devices({**mps, "CUDA_VISIBLE_DEVICES": "1"}) == []  # no such device
    assert fake_cuda_devices({**mps, "CUDA_VISIBLE_DEVICES": "GPU-1"}) == ["GPU-1"]
    assert fake_cuda_devices({"CUDA_VISIBLE_DEVICES": "GPU-0,GPU-1"}) == ["GPU-0", "GPU-1"]
    with pytest.raises(InvalidInput):
        fake_cuda_devices({"CUDA_VISIBLE_DEVICES": "1"})
