"""Which GPU backend an agent uses: NVML, or the fakes an admin asked for (never as a fallback)."""

from __future__ import annotations

from pathlib import Path

from gpuq.agent.fake.gpu_backend import FakeGpuBackend
from gpuq.agent.gpu.backend import GpuBackend
from gpuq.agent.gpu.nvml_backend import DEFAULT_FABRIC_GRACE, NvmlGpuBackend


def select_backend(
    fake_spec: str | None,
    node_name: str,
    *,
    state_dir: Path | None = None,
    fabric_grace: float = DEFAULT_FABRIC_GRACE,
) -> tuple[GpuBackend, str | None]:
    """The backend an agent should use, and a warning to show the admin (or None).

    With fake_spec the admin asked for fakes (`--fake-gpus`, `gpuq serve`): fake GPUs in
    state_dir, no warning. Otherwise always NVML, never fakes: where NVML cannot be used (no
    driver, library not found, driver not loaded, any init failure) the backend has no units,
    its inventory().problem says why, and that text is the warning. The node then runs CPU jobs
    only; the backend tries NVML again on refresh() (a driver loaded later brings its GPUs).
    """
    if fake_spec is not None:
        fake = FakeGpuBackend(fake_spec, node_name, state_dir=state_dir, fabric_grace=fabric_grace)
        return fake, None
    backend = NvmlGpuBackend(fabric_grace=fabric_grace)
    return backend, backend.inventory().problem or None
