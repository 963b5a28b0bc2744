"""Fake GPUs: a fake NVML library under the real NVML backend, for tests and `--fake-gpus`.

FakeGpuBackend is the NVML backend (gpu.nvml_backend.NvmlGpuBackend) over a FakeNvmlLibrary
(fake.nvml_library), so fakes and real GPUs share every line of backend code: error handling,
MIG, health, events. What GPUs it has comes from a spec (fake.gpu_spec's grammar); what they do
while it runs, from the files in its state folder (fake.gpu_state).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gpuq.agent.fake.gpu_spec import parse_fake_models
from gpuq.agent.fake.gpu_state import fake_state_dir
from gpuq.agent.fake.nvml_library import FakeNvmlLibrary
from gpuq.agent.gpu.backend import GpuInventory
from gpuq.agent.gpu.nvml_backend import DEFAULT_FABRIC_GRACE, NvmlGpuBackend


class FakeGpuBackend(NvmlGpuBackend):
    """The NVML backend over a FakeNvmlLibrary built from a spec; files in state_dir drive it."""

    def __init__(
        self,
        spec: str,
        node_name: str,
        state_dir: Path | None = None,
        *,
        use_environment: bool = True,
        health_every: int = 10,
        reinit_interval: float = 30.0,
        fabric_grace: float = DEFAULT_FABRIC_GRACE,
        make_caps: bool = True,
    ) -> None:
        """state_dir None: the folder GPUQ_FAKE_GPU_DIR names; neither: no process uses VRAM.

        The agent should hand state_dir to fake jobs (as GPUQ_FAKE_GPU_DIR) so they can claim.
        """
        if state_dir is None and use_environment:
            state_dir = fake_state_dir()
        self.state_dir = state_dir
        self.library: FakeNvmlLibrary = FakeNvmlLibrary(
            parse_fake_models(spec), node_name, state_dir, spec.strip()
        )
        if not make_caps:  # only look (the doctor): make no missing MIG caps nodes
            box = self.library.box
            box.device_paths = dataclasses.replace(box.device_paths, make_caps=False)
            self.library.gpuq_device_paths = box.device_paths
        super().__init__(
            self.library,
            health_every=health_every,
            reinit_interval=reinit_interval,
            fabric_grace=fabric_grace,
        )


def parse_fake_spec(text: str, node_name: str) -> GpuInventory:
    """The inventory a FakeGpuBackend on node_name offers for spec text (in fake.gpu_spec's
    grammar)."""
    parse_fake_models(text)  # the spec's own error before any backend exists
    backend = FakeGpuBackend(text, node_name, state_dir=None, use_environment=False)
    try:
        return backend.inventory()
    finally:
        backend.close()
