"""Faults injected through the fake NVML library's files, as the NVML backend meets them.

Every NVML error becomes a unit's health with a reason, never an exception; version fallbacks,
memory v2, re-initialisation, refresh after MIG changes and lost GPUs, and health polling.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pynvml
import pytest

from gpuq.agent.fake.gpu_backend import FakeGpuBackend
from gpuq.agent.fake.gpu_spec import GIB
from gpuq.agent.fake.gpu_state import claim_fake_vram
from gpuq.agent.fake.nvml_library import FAKE_DRIVER_RESERVED
from gpuq.agent.gpu.backend import GpuProcess, UnitUsage
from gpuq.agent.gpu.choose_backend import select_backend

MIB = 1024**2
ERROR_NAMES = sorted(
    type(pynvml.NVMLError(code)).__name__.removeprefix("NVMLError_")
    for code in pynvml.NVMLError._valClassMapping
)
MISSING = {"NotSupported", "FunctionNotFound", "ArgumentVersionMismatch"}


def make(tmp_path: Path, spec: str = "2", **options: object) -> FakeGpuBackend:
    options.setdefault("health_every", 1)
    options.setdefault("reinit_interval", 0.0)
    return FakeGpuBackend(spec, "node-a", state_dir=tmp_path, **options)  # type: ignore[arg-type]


def inject(tmp_path: Path, *lines: str) -> None:
    (tmp_path / "errors").write_text("".join(f"{line}\n" for line in lines))


def by_uuid(backend: FakeGpuBackend) -> dict[str, UnitUsage]:
    return {u.uuid: u for u in backend.usage()}


def uuids(backend: FakeGpuBackend) -> list[str]:
    return [u.uuid for u in backend.inventory().units]


@pytest.mark.parametrize("name", [n for n in ERROR_NAMES if n not in MISSING] + ["LibraryMismatch"])
def test_every_nvml_error_makes_one_unit_unhealthy(tmp_path: Path, name: str) -> None:
    backend = make(tmp_path)
    first, second = uuids(backend)
    for version in ("_v3", "_v2", ""):
        inject_line = f"nvmlDeviceGetComputeRunningProcesses{version} {name} {first}"
        with (tmp_path / "errors").open("a") as errors:
            errors.write(inject_line + "\n")
    usage = by_uuid(backend)
    assert usage[first].health == "unhealthy"
    assert usage[first].reason.startswith("nvmlDeviceGetComputeRunningProcesses")
    assert "\n" not in usage[first].reason
    assert usage[second].health == "ok" and usage[second].reason == ""
    assert backend.needs_refresh


@pytest.mark.parametrize(
    "call",
    [
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetGpuFabricInfo",
    ],
)
def test_unknown_errors_on_any_call_never_raise(tmp_path: Path, call: str) -> None:
    backend = make(tmp_path)
    inject(tmp_path, f"{call} Unknown", f"{call}_v2 Unknown", f"{call}_v3 Unknown")
    for _ in range(3):
        assert len(backend.usage()) == 2
    assert backend.refresh() is False
    assert backend.wait_events(0.01) == []


def test_a_lost_gpu_stays_unhealthy_and_comes_back_after_a_reset(tmp_path: Path) -> None:
    backend = make(tmp_path, "2")
    lost, fine = uuids(backend)
    (tmp_path / lost).mkdir()
    (tmp_path / lost / "lost").touch()
    usage = by_uuid(backend)
    assert usage[lost].health == "unhealthy"
    assert "GPU is lost (fell off the bus, XID 79?)" in usage[lost].reason
    assert usage[fine].health == "ok"
    assert backend.needs_refresh
    assert backend.refresh() is False, "a lost GPU does not vanish"
    assert uuids(backend) == [lost, fine]
    assert backend.usage()[0].health == "unhealthy"
    assert "GPU is lost" in backend.usage()[0].reason
    (tmp_path / lost / "lost").unlink()  # the GPU was reset
    assert backend.refresh() is False
    assert [u.health for u in backend.usage()] == ["ok", "ok"]


def test_the_memory_query_prefers_v2_without_reserved_memory(tmp_path: Path) -> None:
    backend = make(tmp_path, "1xH100-80GB")
    (unit,) = uuids(backend)
    claim_fake_vram(unit, 1 * GIB, state_dir=tmp_path)
    assert backend.usage()[0].memory_used == 1 * GIB
    inject(tmp_path, "nvmlDeviceGetMemoryInfo_v2 FunctionNotFound")  # a driver before R510
    reserved = int(81_559 * MIB * FAKE_DRIVER_RESERVED) // MIB * MIB
    (usage,) = backend.usage()
    assert usage.memory_used == 1 * GIB + reserved and usage.health == "ok"
    inject(tmp_path)
    assert backend.usage()[0].memory_used == 1 * GIB + reserved, "v1 is remembered"


@pytest.mark.parametrize("error", ["LibraryMismatch", "FunctionNotFound"])
def test_process_queries_fall_back_to_older_versions(tmp_path: Path, error: str) -> None:
    backend = make(tmp_path, "1")
    (unit,) = uuids(backend)
    claim_fake_vram(unit, 2 * GIB, state_dir=tmp_path)
    claim_fake_vram(unit, 1 * GIB, pid=1, state_dir=tmp_path, kind="graphics")
    inject(
        tmp_path,
        f"nvmlDeviceGetComputeRunningProcesses_v3 {error}",
        f"nvmlDeviceGetGraphicsRunningProcesses_v3 {error}",
        f"nvmlDeviceGetGraphicsRunningProcesses_v2 {error}",
    )
    (usage,) = backend.usage()
    assert usage.health == "ok", usage.reason
    assert set(usage.processes) == {
        GpuProcess(1, 1 * GIB, "graphics"),
        GpuProcess(__import__("os").getpid(), 2 * GIB, "compute"),
    }
    assert backend._processes["compute"].current == "nvmlDeviceGetComputeRunningProcesses_v2"
    assert backend._processes["graphics"].current == "nvmlDeviceGetGraphicsRunningProcesses"


def test_without_any_compute_process_query_the_unit_is_unhealthy(tmp_path: Path) -> None:
    backend = make(tmp_path, "1")
    inject(
        tmp_path,
        *(f"nvmlDeviceGetComputeRunningProcesses{v} LibraryMismatch" for v in ("_v3", "_v2", "")),
    )
    (usage,) = backend.usage()
    assert usage.health == "unhealthy" and "library mismatch" in usage.reason


def test_unknown_on_every_unit_re_initialises_nvml(tmp_path: Path) -> None:
    backend = make(tmp_path, "2")
    assert backend.library.inits == 1
    inject(tmp_path, "nvmlDeviceGetUtilizationRates Unknown")
    assert {u.health for u in backend.usage()} == {"unhealthy"}
    assert backend.needs_refresh
    inject(tmp_path)
    assert backend.refresh() is False
    assert backend.library.inits == 2 and not backend.needs_refresh
    assert {u.health for u in backend.usage()} == {"ok"}


def test_re_initialisation_is_rate_limited(tmp_path: Path) -> None:
    backend = make(tmp_path, "1", reinit_interval=3600.0)
    inject(tmp_path, "nvmlDeviceGetCount Uninitialized")
    assert backend.refresh() is False  # cannot list GPUs: the unit is kept, unhealthy
    (usage,) = backend.usage()
    assert usage.health == "unhealthy" and "cannot list GPUs" in usage.reason
    assert backend.library.inits == 1, "no second nvmlInit within the interval"


def test_a_mig_change_is_seen_by_refresh(tmp_path: Path) -> None:
    backend = make(tmp_path, "1xA100-80GB:mig=3g.40gb+3g.40gb")
    before = backend.inventory().units
    parent = before[0].parent_uuid
    assert parent is not None
    (tmp_path / parent).mkdir()
    (tmp_path / parent / "mig").write_text("7g.80gb\n")
    assert {u.health for u in backend.usage()} == {"unhealthy"}, "stale handles"
    assert backend.needs_refresh
    assert backend.refresh() is True
    (unit,) = backend.inventory().units
    assert (unit.mig_profile, unit.memory, unit.parent_uuid) == ("7g.80gb", 80 * GIB, parent)
    assert unit.uuid not in {u.uuid for u in before}
    assert backend.usage()[0].health == "ok"
    (tmp_path / parent / "mig").write_text("off\n")
    assert backend.refresh() is True
    assert [(u.uuid, u.mig_profile) for u in backend.inventory().units] == [(parent, None)]
    (tmp_path / parent / "mig").unlink()
    assert backend.refresh() is True
    assert backend.inventory().units == before, "the spec's layout has the spec's UUIDs"
    assert backend.refresh() is False


def test_compute_instances_sharing_memory_count_it_once(tmp_path: Path) -> None:
    backend = make(tmp_path, "1xA100-80GB:mig=1c.3g.40gb/2c.3g.40gb")
    first, second = uuids(backend)
    claim_fake_vram(first, 4 * GIB, pid=1, state_dir=tmp_path)
    claim_fake_vram(second, 2 * GIB, state_dir=tmp_path)
    usage = by_uuid(backend)
    assert usage[first].memory_used + usage[second].memory_used == 6 * GIB
    assert usage[first].processes == (GpuProcess(1, 4 * GIB),)
    assert [p.used for p in usage[second].processes] == [2 * GIB]
    assert usage[first].utilization is None, "MIG: unknown, never 0"


@pytest.mark.parametrize(
    ("file", "content", "words"),
    [
        ("ecc", "3", "3 uncorrected ECC error(s)"),
        ("remap", "pending", "row remapping pending"),
        ("remap", "failure", "row remapping failed"),
        ("fabric", "Unknown", "NVSwitch fabric registration failed (Unknown)"),
    ],
)
def test_health_polling(tmp_path: Path, file: str, content: str, words: str) -> None:
    backend = make(tmp_path, "2xH100-80GB:mig=3g.40gb+3g.40gb,1xH100-80GB")
    units = backend.inventory().units
    parent = units[0].parent_uuid
    assert parent is not None
    (tmp_path / parent).mkdir()
    (tmp_path / parent / file).write_text(content)
    usage = backend.usage()
    assert [u.health for u in usage] == ["unhealthy", "unhealthy", "ok", "ok", "ok"]
    assert all(words in u.reason for u in usage[:2])
    (tmp_path / parent / file).unlink()
    assert {u.health for u in backend.usage()} == {"ok"}


def test_a_fabric_left_waiting_past_its_grace_is_unhealthy_until_it_completes(
    tmp_path: Path,
) -> None:
    clock = [1000.0]
    backend = make(tmp_path, "2xH100-80GB", fabric_grace=60.0)
    first, second = uuids(backend)
    (tmp_path / first).mkdir()
    fabric = tmp_path / first / "fabric"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("gpuq.agent.gpu.nvml_backend.time.monotonic", lambda: clock[0])
        for state in ("not started", "in progress"):  # waiting, counted from the first sight
            fabric.write_text(state)
            assert {u.health for u in backend.usage()} == {"ok"}
            clock[0] += 30
        fabric.write_text("in progress")
        usage = by_uuid(backend)
        assert usage[first].health == "unhealthy" and usage[second].health == "ok"
        assert usage[first].reason.startswith("fabric manager not running"), usage[first].reason
        assert "in progress for 60 s" in usage[first].reason
        fabric.write_text("completed")
        assert {u.health for u in backend.usage()} == {"ok"}
        fabric.write_text("not started")  # a restarted fabric manager: a new grace
        clock[0] += 59
        assert {u.health for u in backend.usage()} == {"ok"}
        fabric.write_text("completed Unknown")
        assert "registration failed (Unknown)" in by_uuid(backend)[first].reason


def test_boards_without_ecc_or_fabric_are_healthy(tmp_path: Path) -> None:
    backend = make(tmp_path, "1xRTX4090-24GB,1xL4-24GB")
    for unit in uuids(backend):
        (tmp_path / unit).mkdir()
        (tmp_path / unit / "fabric").write_text("Unknown")
    rtx = uuids(backend)[0]
    (tmp_path / rtx / "ecc").write_text("5")
    assert {u.health for u in backend.usage()} == {"ok"}


def test_health_is_polled_every_nth_call(tmp_path: Path) -> None:
    backend = make(tmp_path, "1", health_every=3)
    (unit,) = uuids(backend)
    assert backend.usage()[0].health == "ok"  # polled: fine
    (tmp_path / unit).mkdir()
    (tmp_path / unit / "ecc").write_text("1")
    assert backend.usage()[0].health == "ok"
    assert backend.usage()[0].health == "ok"
    assert backend.usage()[0].health == "unhealthy"


def test_the_fake_honours_nodriver(tmp_path: Path) -> None:
    (tmp_path / "nodriver").touch()
    backend = make(tmp_path, "2")
    inventory = backend.inventory()
    assert inventory.units == ()
    assert inventory.problem.startswith("no NVIDIA driver: nvmlInit: Driver Not Loaded")
    assert backend.usage() == [] and backend.wait_events(0.01) == []
    (tmp_path / "nodriver").unlink()
    assert backend.refresh() is True and len(backend.inventory().units) == 2


def test_a_fake_spec_is_always_fake_gpus(tmp_path: Path) -> None:
    (tmp_path / "nodriver").touch()  # only the fake library reads it; select_backend ignores it
    backend, warning = select_backend("1", "node-a", state_dir=tmp_path / "other")
    assert warning is None and len(backend.inventory().units) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="making device nodes needs root")
def test_a_fresh_mig_layouts_missing_caps_nodes_are_made_as_nvidia_modprobe_would(
    tmp_path: Path,
) -> None:
    (tmp_path / "caps-late").write_text("")  # no CUDA program has used the slices yet
    backend = make(tmp_path, "1xA100-80GB:mig=3g.40gb+3g.40gb")
    devices = backend.inventory().devices
    assert len(devices) == 2, devices  # both slices isolable, without waiting for first use
    caps = sorted((tmp_path / "dev" / "nvidia-caps").iterdir())
    assert len(caps) == 4  # each slice's GPU instance and compute instance access nodes
    for node in caps:
        info = node.stat()
        assert stat.S_ISCHR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o444
        assert os.major(info.st_rdev) == 237
        assert f"nvidia-cap{os.minor(info.st_rdev)}" == node.name
    for node in caps:
        node.unlink()
    (tmp_path / "proc-devices").write_text("195 nvidia-frontend\n")  # no nvidia-caps major
    assert not backend.refresh() and backend.inventory().devices == {}
