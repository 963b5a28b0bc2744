"""The NVML backend, driven through a small hand-written fake of an old NVML binding.

There is no GPU here, so the pynvml module's functions are replaced by FakeNvml's, and every
pynvml function FakeNvml lacks is removed: this is an old binding (no versioned calls, no
`version` keyword), which the backend must cope with. The fake behaves like NVML where the
backend depends on it: opaque handles, calls before nvmlInit fail, NotSupported for features a
board lacks, NotFound for empty MIG slots, InvalidArgument past the last NVLink, usedGpuMemory
None, and bytes instead of str in old bindings. Errors are pynvml's own classes. The richer fake
library (nvml_fake, fault files) is tested in test_gpu_*.py. The last tests use the real pynvml
against this machine, which has no driver.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from helpers import needs

from gpuq.agent.fake.gpu_backend import FakeGpuBackend
from gpuq.agent.gpu.backend import GpuInventory, GpuProcess, UnitUsage
from gpuq.agent.gpu.choose_backend import select_backend
from gpuq.agent.gpu.nvml_backend import NvmlGpuBackend, normalize_bus_id
from gpuq.domain.model import (
    DISTANCE_HOST_BRIDGE,
    DISTANCE_NUMA_NODE,
    DISTANCE_NVLINK,
    DISTANCE_PCIE_SWITCH,
    DISTANCE_SAME_BOARD,
    DISTANCE_SYSTEM,
    GpuUnit,
)

GIB = 1024**3
A100 = "NVIDIA A100-SXM4-80GB"


@dataclass
class FakeDevice:
    """One GPU or MIG slice as the driver knows it."""

    uuid: str
    name: str
    bus: str
    total: int = 80 * GIB
    used: int = 0
    utilization: int | None = 0  # None: NotSupported (as for MIG slices)
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    mig_mode: int | None = None  # None: NotSupported (no MIG on this board)
    mig_slots: list[FakeDevice | None] = field(default_factory=list)
    links: list[str | None] | None = None  # remote bus per link (None: inactive); None: no NVLink
    is_mig: bool = False


class Handle:
    """Opaque, like c_nvmlDevice_t: the backend can only hand it back to NVML."""

    __slots__ = ("_device",)

    def __init__(self, device: FakeDevice) -> None:
        self._device = device


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # pynvml maps the code to its subclass, as NVML calls do


class FakeNvml:
    """The part of pynvml that gpuq uses, over a list of FakeDevice."""

    def __init__(
        self,
        devices: list[FakeDevice],
        levels: dict[frozenset[int], int] | None = None,
        *,
        as_bytes: bool = False,
        init_error: int | None = None,
    ) -> None:
        self.devices = devices
        self.levels = levels or {}  # {frozenset({i, j}): NVML_TOPOLOGY_*}; default SYSTEM
        self.as_bytes = as_bytes
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0
        self.running = False

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
        """Replace pynvml's functions by ours, and remove the ones we lack (an old binding)."""
        for name in dir(pynvml):
            value = getattr(pynvml, name)
            if name.startswith("nvml") and callable(value) and not isinstance(value, type):
                monkeypatch.setattr(pynvml, name, getattr(self, name, None))
        return self

    def _string(self, text: str) -> str | bytes:
        return text.encode() if self.as_bytes else text

    def _device(self, handle: object, *, mig_ok: bool = True) -> FakeDevice:
        if not self.running:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        if not isinstance(handle, Handle):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if handle._device.is_mig and not mig_ok:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return handle._device

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error is not None:
            raise nvml_error(self.init_error)
        self.running = True

    def nvmlShutdown(self) -> None:
        if not self.running:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        self.running = False
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        return self._string("550.54.15")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        if not self.running:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        if not 0 <= index < len(self.devices):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return Handle(self.devices[index])

    def nvmlDeviceGetUUID(self, handle: object) -> str | bytes:
        return self._string(self._device(handle).uuid)

    def nvmlDeviceGetName(self, handle: object) -> str | bytes:
        return self._string(self._device(handle).name)

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> SimpleNamespace:
        device = self._device(handle)
        return SimpleNamespace(
            total=device.total, used=device.used, free=device.total - device.used
        )

    def nvmlDeviceGetPciInfo(self, handle: object) -> SimpleNamespace:
        return SimpleNamespace(busId=self._string(self._device(handle, mig_ok=False).bus))

    def nvmlDeviceGetMigMode(self, handle: object) -> list[int]:
        device = self._device(handle, mig_ok=False)
        if device.mig_mode is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [device.mig_mode, device.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: object) -> int:
        device = self._device(handle, mig_ok=False)
        if device.mig_mode is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return len(device.mig_slots)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, index: int) -> Handle:
        device = self._device(handle, mig_ok=False)
        if device.mig_mode != pynvml.NVML_DEVICE_MIG_ENABLE or index >= len(device.mig_slots):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        slot = device.mig_slots[index]
        if slot is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return Handle(slot)

    def nvmlDeviceGetTopologyCommonAncestor(self, first: object, second: object) -> int:
        a = self.devices.index(self._device(first, mig_ok=False))
        b = self.devices.index(self._device(second, mig_ok=False))
        if a == b:
            return int(pynvml.NVML_TOPOLOGY_INTERNAL)
        return self.levels.get(frozenset({a, b}), int(pynvml.NVML_TOPOLOGY_SYSTEM))

    def _link(self, handle: object, link: int) -> str | None:
        device = self._device(handle, mig_ok=False)
        if device.links is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(device.links):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return device.links[link]

    def nvmlDeviceGetNvLinkState(self, handle: object, link: int) -> int:
        active = self._link(handle, link) is not None
        return int(pynvml.NVML_FEATURE_ENABLED if active else pynvml.NVML_FEATURE_DISABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: object, link: int) -> SimpleNamespace:
        remote = self._link(handle, link)
        if remote is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(busId=self._string(remote))

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> SimpleNamespace:
        device = self._device(handle)
        if device.utilization is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=device.utilization, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0, computeInstanceId=0)
            for pid, used in self._device(handle).processes
        ]


def gpu(index: int, **fields: Any) -> FakeDevice:
    values: dict[str, Any] = {
        "uuid": f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        "name": A100,
        "bus": bus(index),
    }
    values.update(fields)
    return FakeDevice(**values)


def bus(index: int) -> str:
    return f"00000000:{0x10 * (index + 1):02X}:00.0"


def mig(parent: int, slot: int, profile: str, gib: int, **fields: Any) -> FakeDevice:
    return FakeDevice(
        uuid=f"MIG-{parent}000000{slot}-aaaa-bbbb-cccc-dddddddddddd",
        name=f"{A100} MIG {profile}",
        bus=bus(parent),
        total=gib * GIB,
        utilization=None,
        is_mig=True,
        **fields,
    )


def link(inventory: GpuInventory, a: str, b: str) -> int:
    first, second = sorted((a, b))
    found = [d for x, y, d in inventory.topology if (x, y) == (first, second)]
    assert len(found) == 1, f"expected one link for {first}, {second}"
    return found[0]


def check_topology_complete(inventory: GpuInventory) -> None:
    uuids = {u.uuid for u in inventory.units}
    pairs = [(a, b) for a, b, _ in inventory.topology]
    assert all(a < b for a, b in pairs)
    assert len(set(pairs)) == len(pairs) == len(uuids) * (len(uuids) - 1) // 2
    assert {x for pair in pairs for x in pair} <= uuids


# --- discovery -------------------------------------------------------------------------------


@pytest.mark.parametrize("as_bytes", [False, True], ids=["str", "bytes"])
def test_whole_gpus_are_discovered(monkeypatch: pytest.MonkeyPatch, as_bytes: bool) -> None:
    devices = [gpu(0), gpu(1, name="NVIDIA L4", total=24 * GIB)]
    FakeNvml(devices, as_bytes=as_bytes).install(monkeypatch)
    inventory = NvmlGpuBackend().inventory()
    assert inventory.units == (
        GpuUnit(devices[0].uuid, 0, A100, 80 * GIB, "00000000:10:00.0"),
        GpuUnit(devices[1].uuid, 1, "NVIDIA L4", 24 * GIB, "00000000:20:00.0"),
    )
    assert not inventory.fake
    assert inventory.driver == "550.54.15"


def test_mig_slices_replace_their_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    enable, disable = pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_DISABLE
    slices = [mig(0, 0, "3g.40gb", 40), mig(0, 2, "1g.10gb", 10)]
    devices = [
        gpu(0, mig_mode=enable, mig_slots=[slices[0], None, slices[1], None, None, None, None]),
        gpu(1, name="NVIDIA L4"),  # no MIG: NotSupported
        gpu(2, mig_mode=disable, mig_slots=[None] * 7),
        gpu(3, mig_mode=enable, mig_slots=[None] * 7),  # MIG mode, nothing configured yet
    ]
    FakeNvml(devices).install(monkeypatch)
    units = NvmlGpuBackend().inventory().units
    assert [u.uuid for u in units] == [slices[0].uuid, slices[1].uuid, gpu(1).uuid, gpu(2).uuid]
    assert units[0] == GpuUnit(
        slices[0].uuid, 0, f"{A100} MIG 3g.40gb", 40 * GIB, bus(0), gpu(0).uuid, "3g.40gb"
    )
    assert (units[1].mig_profile, units[1].memory, units[1].parent_uuid) == (
        "1g.10gb",
        10 * GIB,
        gpu(0).uuid,
    )
    assert gpu(0).uuid not in {u.uuid for u in units}, "never both a GPU and its slices"


def test_a_mig_name_without_a_profile_leaves_it_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    odd = mig(0, 0, "", 20)
    odd.name = "Some future name"
    devices = [gpu(0, mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE, mig_slots=[odd])]
    FakeNvml(devices).install(monkeypatch)
    (unit,) = NvmlGpuBackend().inventory().units
    assert (unit.name, unit.mig_profile, unit.parent_uuid) == (odd.name, None, gpu(0).uuid)


def test_bus_ids_are_normalized() -> None:
    assert normalize_bus_id(b"0000:1b:00.0") == "00000000:1B:00.0"
    assert normalize_bus_id("00000000:1B:00.0\x00") == "00000000:1B:00.0"
    assert normalize_bus_id("odd") == "ODD"


# --- topology --------------------------------------------------------------------------------


def test_pcie_levels_map_to_distances(monkeypatch: pytest.MonkeyPatch) -> None:
    devices = [gpu(i) for i in range(5)]
    levels = {
        frozenset({0, 1}): pynvml.NVML_TOPOLOGY_SINGLE,
        frozenset({0, 2}): pynvml.NVML_TOPOLOGY_MULTIPLE,
        frozenset({0, 3}): pynvml.NVML_TOPOLOGY_HOSTBRIDGE,
        frozenset({0, 4}): pynvml.NVML_TOPOLOGY_NODE,
        frozenset({1, 2}): pynvml.NVML_TOPOLOGY_INTERNAL,
        frozenset({1, 3}): 77,  # a level this gpuq does not know
    }
    FakeNvml(devices, levels).install(monkeypatch)
    inventory = NvmlGpuBackend().inventory()
    check_topology_complete(inventory)
    uuid = [d.uuid for d in devices]
    assert link(inventory, uuid[0], uuid[1]) == DISTANCE_SAME_BOARD
    assert link(inventory, uuid[0], uuid[2]) == DISTANCE_PCIE_SWITCH
    assert link(inventory, uuid[0], uuid[3]) == DISTANCE_HOST_BRIDGE
    assert link(inventory, uuid[0], uuid[4]) == DISTANCE_NUMA_NODE
    assert link(inventory, uuid[1], uuid[2]) == DISTANCE_SAME_BOARD
    assert link(inventory, uuid[1], uuid[3]) == DISTANCE_SYSTEM
    assert link(inventory, uuid[3], uuid[4]) == DISTANCE_SYSTEM


def test_a_direct_nvlink_bridge_makes_a_pair_closest(monkeypatch: pytest.MonkeyPatch) -> None:
    devices = [
        gpu(0, links=[bus(1), None, "0000:20:00.0"]),  # legacy spelling of GPU 1's bus
        gpu(1, links=[bus(0), bus(0)]),
        gpu(2, links=[None, None]),  # has NVLink, none active
        gpu(3),  # no NVLink at all
    ]
    levels = {frozenset({0, 1}): pynvml.NVML_TOPOLOGY_NODE}
    FakeNvml(devices, levels).install(monkeypatch)
    inventory = NvmlGpuBackend().inventory()
    check_topology_complete(inventory)
    uuid = [d.uuid for d in devices]
    assert link(inventory, uuid[0], uuid[1]) == DISTANCE_NVLINK
    assert link(inventory, uuid[0], uuid[2]) == DISTANCE_SYSTEM
    assert link(inventory, uuid[2], uuid[3]) == DISTANCE_SYSTEM


def test_gpus_on_one_nvswitch_are_all_linked(monkeypatch: pytest.MonkeyPatch) -> None:
    switches = ["00000000:C4:00.0", "00000000:C5:00.0"]
    devices = [gpu(i, links=list(switches)) for i in range(4)]
    devices.append(gpu(4, links=[None] * 12))  # its links are down: PCIe only
    FakeNvml(devices).install(monkeypatch)
    inventory = NvmlGpuBackend().inventory()
    check_topology_complete(inventory)
    uuid = [d.uuid for d in devices]
    linked = [link(inventory, uuid[i], uuid[j]) for i in range(4) for j in range(i + 1, 4)]
    assert linked == [DISTANCE_NVLINK] * 6
    assert {link(inventory, uuid[i], uuid[4]) for i in range(4)} == {DISTANCE_SYSTEM}


def test_mig_slices_take_their_parents_distance(monkeypatch: pytest.MonkeyPatch) -> None:
    slices = [mig(0, 0, "3g.40gb", 40), mig(0, 1, "3g.40gb", 40)]
    devices = [
        gpu(0, mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE, mig_slots=list(slices), links=[bus(1)]),
        gpu(1, links=[bus(0)]),
        gpu(2),
    ]
    FakeNvml(devices, {frozenset({0, 2}): pynvml.NVML_TOPOLOGY_MULTIPLE}).install(monkeypatch)
    inventory = NvmlGpuBackend().inventory()
    check_topology_complete(inventory)
    assert link(inventory, slices[0].uuid, slices[1].uuid) == DISTANCE_SAME_BOARD
    assert link(inventory, slices[1].uuid, gpu(1).uuid) == DISTANCE_NVLINK
    assert link(inventory, slices[0].uuid, gpu(2).uuid) == DISTANCE_PCIE_SWITCH
    assert link(inventory, gpu(1).uuid, gpu(2).uuid) == DISTANCE_SYSTEM


# --- usage and lifecycle ---------------------------------------------------------------------


def test_usage_reports_memory_utilization_and_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    slices = [mig(0, 0, "3g.40gb", 40, used=5 * GIB, processes=[(4242, None)])]
    devices = [
        gpu(0, mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE, mig_slots=slices),
        gpu(1, used=12 * GIB, utilization=93, processes=[(900, 8 * GIB), (12, 4 * GIB)]),
    ]
    FakeNvml(devices).install(monkeypatch)
    backend = NvmlGpuBackend()
    assert backend.usage() == [
        UnitUsage(slices[0].uuid, 5 * GIB, None, (GpuProcess(4242, 0),)),
        UnitUsage(gpu(1).uuid, 12 * GIB, 93, (GpuProcess(12, 4 * GIB), GpuProcess(900, 8 * GIB))),
    ]
    devices[1].used = 0
    devices[1].processes.clear()
    assert backend.usage()[1] == UnitUsage(gpu(1).uuid, 0, 93, ())


def test_the_energy_counter_is_read_for_whole_gpus_only(monkeypatch: pytest.MonkeyPatch) -> None:
    slices = [mig(0, 0, "3g.40gb", 40)]
    devices = [gpu(0, mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE, mig_slots=slices), gpu(1), gpu(2)]
    nvml = FakeNvml(devices).install(monkeypatch)
    asked: list[str] = []

    def energy(handle: object) -> int:
        device = nvml._device(handle)
        asked.append(device.uuid)
        if device.uuid == gpu(2).uuid:
            raise nvml_error(pynvml.NVML_ERROR_UNKNOWN)
        return 987_654_321

    monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption", energy)
    found = {u.uuid: u for u in NvmlGpuBackend().usage()}
    assert found[slices[0].uuid].energy_mj is None  # the board's counter: not a slice's
    assert found[gpu(1).uuid].energy_mj == 987_654_321
    # an error makes the counter unknown, never the unit unhealthy
    assert found[gpu(2).uuid].energy_mj is None
    assert found[gpu(2).uuid].health == "ok"
    assert slices[0].uuid not in asked


def test_close_shuts_nvml_down_once(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml([gpu(0)]).install(monkeypatch)
    backend = NvmlGpuBackend()
    assert nvml.running
    backend.close()
    backend.close()
    assert (nvml.inits, nvml.shutdowns, nvml.running) == (1, 1, False)


def test_a_driver_gone_under_us_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml([gpu(0)]).install(monkeypatch)
    backend = NvmlGpuBackend(reinit_interval=0)
    nvml.running = False  # e.g. the driver went away under us
    (usage,) = backend.usage()
    assert usage.health == "unhealthy" and "Uninitialized" in usage.reason
    assert backend.needs_refresh
    assert backend.refresh() is False  # re-initialised: the same unit is back
    assert nvml.inits == 2 and nvml.running
    assert backend.usage()[0].health == "ok"


# --- choosing a backend ----------------------------------------------------------------------


def test_a_fake_spec_never_touches_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml([gpu(0)]).install(monkeypatch)
    backend, warning = select_backend("2xL4-24GB", "node-a")
    assert isinstance(backend, FakeGpuBackend) and warning is None
    assert len(backend.inventory().units) == 2
    assert nvml.inits == 0


def test_a_working_driver_gives_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml([gpu(0)]).install(monkeypatch)
    backend, warning = select_backend(None, "node-a")
    assert isinstance(backend, NvmlGpuBackend) and warning is None
    assert [u.uuid for u in backend.inventory().units] == [gpu(0).uuid]


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED]
)
def test_no_driver_gives_no_units_and_says_why(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    FakeNvml([], init_error=code).install(monkeypatch)
    backend, warning = select_backend(None, "node-a")
    assert isinstance(backend, NvmlGpuBackend) and not isinstance(backend, FakeGpuBackend)
    inventory = backend.inventory()
    assert inventory.units == () and not inventory.fake
    assert warning == inventory.problem
    assert "no NVIDIA driver" in warning and "CPU jobs only" in warning
    assert backend.usage() == [] and backend.wait_events(0.01) == []


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_UNKNOWN,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    ],
)
def test_a_broken_driver_gives_no_units_and_names_the_error(
    monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    FakeNvml([], init_error=code).install(monkeypatch)
    backend, warning = select_backend(None, "node-a")
    assert backend.inventory().units == ()
    assert warning is not None and warning.startswith("NVML cannot start: nvmlInit: ")
    assert type(pynvml.NVMLError(code)).__name__.removeprefix("NVMLError_") in warning


def test_a_driver_loaded_later_brings_its_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml([gpu(0)], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED).install(monkeypatch)
    backend = NvmlGpuBackend(reinit_interval=0)
    assert backend.inventory().units == ()
    nvml.init_error = None
    assert backend.refresh() is True
    assert [u.uuid for u in backend.inventory().units] == [gpu(0).uuid]
    assert backend.inventory().problem == ""


def test_without_the_binding_there_are_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now raises ImportError
    backend, warning = select_backend(None, "node-a")
    assert backend.inventory().units == ()
    assert warning is not None and "nvidia-ml-py" in warning


def _driver_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@needs(not _driver_present(), "this machine has an NVIDIA driver")
def test_this_machine_without_a_driver_offers_no_gpus_and_no_fakes() -> None:
    backend, warning = select_backend(None, "node-a")
    assert not isinstance(backend, FakeGpuBackend)
    inventory = backend.inventory()
    assert inventory.units == () and not inventory.fake
    assert warning is not None and warning.startswith("no NVIDIA driver: nvmlInit: ")
    assert "CPU jobs only" in warning
    assert backend.usage() == []
    assert backend.refresh() is False
    backend.close()
