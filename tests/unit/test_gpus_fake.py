"""The fake GPUs: spec parsing, NVML's real sizes, stable UUIDs, the modelled topology, fake VRAM
claims. FakeGpuBackend is the NVML backend over the fake NVML library (fault files: test_gpu_*)."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuq.agent.fake.gpu_backend import FakeGpuBackend, parse_fake_spec
from gpuq.agent.fake.gpu_spec import GIB, MIB
from gpuq.agent.fake.gpu_state import (
    FAKE_GPU_DIR_ENV,
    claim_fake_vram,
    fake_state_dir,
    set_fake_energy,
    set_fake_utilization,
)
from gpuq.agent.gpu.backend import GpuInventory, GpuProcess, UnitUsage
from gpuq.agent.gpu.nvml_backend import NvmlGpuBackend
from gpuq.domain.model import (
    DISTANCE_NUMA_NODE,
    DISTANCE_NVLINK,
    DISTANCE_PCIE_SWITCH,
    DISTANCE_SAME_BOARD,
    DISTANCE_SYSTEM,
)
from gpuq.errors import InvalidInput

GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
BUS_ID = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll until condition holds; fail with `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def distance(inventory: GpuInventory, a: str, b: str) -> int:
    first, second = sorted((a, b))
    found = [d for x, y, d in inventory.topology if (x, y) == (first, second)]
    assert len(found) == 1, f"expected one link for {first}, {second}"
    return found[0]


def usage_of(backend: FakeGpuBackend, uuid: str) -> UnitUsage:
    """A unit's usage, less its energy counter (which grows with time: tests of it below)."""
    return dataclasses.replace(next(u for u in backend.usage() if u.uuid == uuid), energy_mj=None)


# --- parsing -------------------------------------------------------------------------------


def test_a_bare_count_gives_default_a100s() -> None:
    inventory = parse_fake_spec("4", "node-a")
    assert [u.index for u in inventory.units] == [0, 1, 2, 3]
    assert {u.name for u in inventory.units} == {"NVIDIA A100-SXM4-80GB"}
    assert {u.memory for u in inventory.units} == {80 * GIB}
    assert all(u.parent_uuid is None and u.mig_profile is None for u in inventory.units)
    assert inventory.fake
    assert inventory.driver == "fake (4)"


def test_count_and_model() -> None:
    inventory = parse_fake_spec("8xA100-80GB", "node-a")
    assert len(inventory.units) == 8
    assert {u.name for u in inventory.units} == {"NVIDIA A100-SXM4-80GB"}


def test_mixed_models_keep_spec_order_and_nvml_sizes() -> None:
    inventory = parse_fake_spec("2xH100-80GB,2xL4-24GB,1xRTX6000-48GB", "node-a")
    assert [(u.index, u.name, u.memory) for u in inventory.units] == [
        (0, "NVIDIA H100 80GB HBM3", 81_559 * MIB),
        (1, "NVIDIA H100 80GB HBM3", 81_559 * MIB),
        (2, "NVIDIA L4", 23_034 * MIB),
        (3, "NVIDIA L4", 23_034 * MIB),
        (4, "NVIDIA RTX6000", 48 * GIB),  # an unknown model: the spec's GiB
    ]


@pytest.mark.parametrize(
    ("model", "mib"),
    [
        ("H100-80GB", 81_559),
        ("H200-141GB", 143_771),
        ("L4-24GB", 23_034),
        ("A100-80GB", 81_920),
        ("A100-40GB", 40_960),
        ("L40S-48GB", 46_068),
        ("A10-24GB", 23_028),
        ("RTX4090-24GB", 24_564),
    ],
)
def test_known_models_have_nvmls_totals_not_marketed_sizes(model: str, mib: int) -> None:
    (unit,) = parse_fake_spec(f"1x{model}", "node-a").units
    assert unit.memory == mib * MIB


def test_mig_slices_have_nvmls_sizes_from_eight_memory_slices() -> None:
    spec = "1xH200-141GB:mig=3g.71gb+2g.35gb+1g.18gb,1xH100-80GB:mig=7g.80gb"
    units = parse_fake_spec(spec, "node-a").units
    eighth = 143_771 * MIB // 8
    assert [(u.mig_profile, u.memory) for u in units] == [
        ("3g.71gb", 4 * eighth // MIB * MIB),  # 71,885 MiB
        ("2g.35gb", 2 * eighth // MIB * MIB),
        ("1g.18gb", eighth // MIB * MIB),
        ("7g.80gb", 81_559 * MIB),
    ]
    assert units[0].memory == 71_885 * MIB
    assert units[0].name == "NVIDIA H200 MIG 3g.71gb"


def test_compute_instances_sharing_a_gpu_instance_split_its_memory() -> None:
    spec = "1xA100-80GB:mig=1c.3g.40gb/2c.3g.40gb+3g.40gb"
    units = parse_fake_spec(spec, "node-a").units
    assert [(u.mig_profile, u.memory) for u in units] == [
        ("1c.3g.40gb", 20 * GIB),  # each compute instance an equal share of its GPU instance
        ("2c.3g.40gb", 20 * GIB),
        ("3g.40gb", 40 * GIB),
    ]
    assert sum(u.memory for u in units) == 80 * GIB  # the GPU instance is counted once


def test_model_names_are_case_insensitive() -> None:
    assert parse_fake_spec("2xa100-80gb", "n").units == parse_fake_spec("2XA100-80GB", "n").units


def test_mig_slices_replace_their_parent() -> None:
    inventory = parse_fake_spec("1xA100-80GB:mig=3g.40gb+3g.40gb,1xA100-80GB", "node-a")
    slices, whole = inventory.units[:2], inventory.units[2]
    assert len(inventory.units) == 3
    parent = slices[0].parent_uuid
    assert parent is not None and GPU_UUID.match(parent)
    assert all(MIG_UUID.match(s.uuid) for s in slices)
    assert [(s.parent_uuid, s.mig_profile, s.memory) for s in slices] == [
        (parent, "3g.40gb", 40 * GIB),
        (parent, "3g.40gb", 40 * GIB),
    ]
    assert slices[0].uuid != slices[1].uuid
    assert {s.index for s in slices} == {0} and whole.index == 1
    assert parent not in {u.uuid for u in inventory.units}, "never both a parent and its slices"
    assert slices[0].name == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0",
        "65",
        "-1",
        "x",
        "2x",
        "four",
        "2xA100",
        "2xA100-0GB",
        "2xA100-2000GB",
        "3xA100-80GB,",
        "33xA100-80GB,32xL4-24GB",
        "1xA100-80GB:mig=",
        "1xA100-80GB:mig=3g",
        "1xA100-80GB:mig=0g.10gb",
        "1xA100-80GB:mig=8g.80gb",
        "1xA100-80GB:mig=4g.40gb+4g.40gb",
        "1xA100-80GB:mig=3g.40gb+3g.40gb+1g.10gb",
        "1xA100-80GB:mig=1g.0gb",
        "1xA100-80GB:mig=1g.10gb:mig=1g.10gb",
        "1xA100-80GB:mig=1g.40gb",  # 1g is 10 GB on this GPU
        "1xH200-141GB:mig=3g.80gb",
        "1xA100-80GB:mig=5g.50gb",  # no 5g profile
        "1xA100-80GB:mig=7g.80gb+1g.10gb",  # 8 compute slices
        "1xA100-80GB:mig=2g.20gb+2g.20gb+2g.20gb+2g.20gb",  # 8 compute slices
        "1xA100-80GB:mig=2c.3g.40gb/2c.3g.40gb",  # 4 of 3 compute slices
        "1xA100-80GB:mig=1c.3g.40gb/1c.2g.20gb",  # two GPU instances joined by /
        "1xA100-80GB:bogus",
        "1xL4-24GB:nvlink=maybe",
        "2 x A100-80GB",
    ],
)
def test_invalid_specs_name_the_flag_and_the_text(text: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        parse_fake_spec(text, "node-a")
    assert raised.value.field == "--fake-gpus"
    assert raised.value.value == text
    assert "e.g." in raised.value.problem or "GPUs" in raised.value.problem


def test_the_spec_error_says_what_is_wrong() -> None:
    with pytest.raises(InvalidInput, match="7 compute slices"):
        parse_fake_spec("1xA100-80GB:mig=4g.40gb+4g.40gb", "node-a")
    with pytest.raises(InvalidInput, match="not a model like A100-80GB"):
        parse_fake_spec("2xA100", "node-a")
    with pytest.raises(InvalidInput, match="8 memory slices"):
        parse_fake_spec("1xA100-80GB:mig=3g.40gb+3g.40gb+1g.10gb", "node-a")
    with pytest.raises(InvalidInput, match="71885 MiB: 70 or 71 GB"):
        parse_fake_spec("1xH200-141GB:mig=3g.80gb", "node-a")


# --- identity --------------------------------------------------------------------------------


def test_uuids_look_like_nvml_and_are_stable_across_restarts() -> None:
    spec = "2xA100-80GB:mig=1g.10gb+2g.20gb,2xL4-24GB"
    first = parse_fake_spec(spec, "node-a")
    again = FakeGpuBackend(spec, "node-a").inventory()
    assert first == again
    uuids = [u.uuid for u in first.units]
    assert len(set(uuids)) == len(uuids) == 6
    assert all(GPU_UUID.match(u) or MIG_UUID.match(u) for u in uuids)


def test_each_node_gets_its_own_uuids() -> None:
    a = {u.uuid for u in parse_fake_spec("8", "node-a").units}
    b = {u.uuid for u in parse_fake_spec("8", "node-b").units}
    assert len(a) == len(b) == 8
    assert not a & b


def test_pci_bus_ids_are_distinct_and_grow_with_the_index() -> None:
    units = parse_fake_spec("64xL4-24GB", "node-a").units
    buses = [u.pci_bus_id for u in units]
    assert buses[0] == "00000000:1B:00.0"
    assert all(BUS_ID.match(b) for b in buses)
    assert buses == sorted(set(buses))


# --- topology --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec", ["1", "3", "8", "2xH100-80GB,2xL4-24GB", "2xA100-80GB:mig=3g.40gb+2g.20gb,1xL4-24GB"]
)
def test_topology_has_one_ordered_link_per_pair_of_allocatable_units(spec: str) -> None:
    inventory = parse_fake_spec(spec, "node-a")
    uuids = {u.uuid for u in inventory.units}
    pairs = [(a, b) for a, b, _ in inventory.topology]
    assert all(a < b for a, b in pairs)
    assert len(set(pairs)) == len(pairs) == len(uuids) * (len(uuids) - 1) // 2
    assert {x for pair in pairs for x in pair} <= uuids
    assert all(d > 0 for _, _, d in inventory.topology)


def test_an_sxm_box_is_all_nvlink() -> None:
    inventory = parse_fake_spec("8xA100-80GB", "node-a")
    assert {d for _, _, d in inventory.topology} == {DISTANCE_NVLINK}


def test_a_pcie_box_has_switch_pairs_and_two_sockets() -> None:
    inventory = parse_fake_spec("8xL4-24GB", "node-a")
    gpu = [u.uuid for u in inventory.units]
    assert distance(inventory, gpu[0], gpu[1]) == DISTANCE_PCIE_SWITCH
    assert distance(inventory, gpu[6], gpu[7]) == DISTANCE_PCIE_SWITCH
    assert distance(inventory, gpu[0], gpu[3]) == DISTANCE_NUMA_NODE
    assert distance(inventory, gpu[4], gpu[7]) == DISTANCE_NUMA_NODE
    assert distance(inventory, gpu[3], gpu[4]) == DISTANCE_SYSTEM
    assert distance(inventory, gpu[0], gpu[7]) == DISTANCE_SYSTEM


def test_nvlink_can_be_switched_off_and_joins_only_one_model() -> None:
    plain = parse_fake_spec("2xA100-80GB:nvlink=no", "node-a")
    assert [d for _, _, d in plain.topology] == [DISTANCE_PCIE_SWITCH]
    mixed = parse_fake_spec("2xH100-80GB,2xA100-80GB,2xL4-24GB:nvlink=yes", "node-a")
    gpu = [u.uuid for u in mixed.units]
    assert distance(mixed, gpu[0], gpu[1]) == DISTANCE_NVLINK
    assert distance(mixed, gpu[4], gpu[5]) == DISTANCE_NVLINK
    assert distance(mixed, gpu[1], gpu[2]) == DISTANCE_NUMA_NODE  # H100 and A100: no link
    assert distance(mixed, gpu[0], gpu[5]) == DISTANCE_SYSTEM


def test_mig_slices_inherit_their_parents_distance() -> None:
    inventory = parse_fake_spec("2xL4-24GB:mig=1g.3gb+1g.3gb,2xL4-24GB", "node-a")
    s0, s1, t0, _t1, whole2, _whole3 = (u.uuid for u in inventory.units)
    assert distance(inventory, s0, s1) == DISTANCE_SAME_BOARD
    assert distance(inventory, s0, t0) == DISTANCE_PCIE_SWITCH  # GPUs 0 and 1 share a switch
    assert distance(inventory, s1, whole2) == DISTANCE_SYSTEM  # GPU 2 is on the other socket


# --- usage -----------------------------------------------------------------------------------


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real process to hold fake VRAM, killed (and reaped) after the test."""
    child = subprocess.Popen(["sleep", "60"])
    yield child
    if child.poll() is None:
        child.kill()
        child.wait()


def test_usage_without_claims_is_idle(tmp_path: Path) -> None:
    backend = FakeGpuBackend("2", "node-a", state_dir=tmp_path)
    units = backend.inventory().units
    assert [usage_of(backend, u.uuid) for u in units] == [
        UnitUsage(u.uuid, 0, 0, ()) for u in units
    ]


def test_claims_of_live_processes_add_up(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    backend = FakeGpuBackend("2", "node-a", state_dir=tmp_path)
    first, second = (u.uuid for u in backend.inventory().units)
    claim_fake_vram(first, 3 * GIB, state_dir=tmp_path)
    claim_fake_vram(first, 5 * GIB, pid=sleeper.pid, state_dir=tmp_path)
    set_fake_utilization(first, 87, state_dir=tmp_path)
    assert usage_of(backend, first) == UnitUsage(
        first,
        8 * GIB,
        87,
        tuple(
            sorted(
                [GpuProcess(os.getpid(), 3 * GIB), GpuProcess(sleeper.pid, 5 * GIB)],
                key=lambda p: p.pid,
            )
        ),
    )
    assert usage_of(backend, second) == UnitUsage(second, 0, 0, ())
    claim_fake_vram(first, 1 * GIB, state_dir=tmp_path)  # a later claim replaces the earlier one
    assert usage_of(backend, first).memory_used == 6 * GIB
    claim_fake_vram(first, 0, state_dir=tmp_path)  # zero releases
    assert usage_of(backend, first).processes == (GpuProcess(sleeper.pid, 5 * GIB),)


def test_a_dead_process_drops_out_and_its_file_goes(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    backend = FakeGpuBackend("1", "node-a", state_dir=tmp_path)
    unit = backend.inventory().units[0].uuid
    claim = claim_fake_vram(unit, 2 * GIB, pid=sleeper.pid, state_dir=tmp_path)
    assert usage_of(backend, unit).memory_used == 2 * GIB
    sleeper.kill()
    sleeper.wait()
    assert usage_of(backend, unit) == UnitUsage(unit, 0, 0, ())
    assert not claim.exists()


def test_a_zombie_holds_no_vram(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    backend = FakeGpuBackend("1", "node-a", state_dir=tmp_path)
    unit = backend.inventory().units[0].uuid
    claim_fake_vram(unit, 2 * GIB, pid=sleeper.pid, state_dir=tmp_path)
    os.kill(sleeper.pid, signal.SIGKILL)  # not reaped yet: it stays a zombie
    wait_for(lambda: usage_of(backend, unit).memory_used == 0, "the zombie's claim to vanish")


def test_a_job_process_claims_through_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAKE_GPU_DIR_ENV, str(tmp_path))
    assert fake_state_dir() == tmp_path
    backend = FakeGpuBackend("1", "node-a")  # state_dir from the environment
    unit = backend.inventory().units[0].uuid
    code = (
        "import sys, time; from gpuq.agent.fake.gpu_state import claim_fake_vram; "
        f"claim_fake_vram({unit!r}, 7 * 1024**3); print('claimed', flush=True); time.sleep(60)"
    )
    job = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert job.stdout is not None and job.stdout.readline() == b"claimed\n"
        assert usage_of(backend, unit).processes == (GpuProcess(job.pid, 7 * GIB),)
    finally:
        job.kill()
        job.wait()
    wait_for(lambda: usage_of(backend, unit).processes == (), "the job's claim to vanish")


def test_malformed_files_are_ignored(tmp_path: Path) -> None:
    backend = FakeGpuBackend("1", "node-a", state_dir=tmp_path)
    unit = backend.inventory().units[0].uuid
    (tmp_path / unit).mkdir()
    (tmp_path / unit / str(os.getpid())).write_text("lots\n")
    (tmp_path / unit / ".123.partial").write_text("99\n")
    (tmp_path / unit / "utilization").write_text("250\n")
    assert usage_of(backend, unit) == UnitUsage(unit, 0, 100, ())


def test_the_energy_counter_grows_with_utilisation_and_can_be_set(tmp_path: Path) -> None:
    backend = FakeGpuBackend("2", "node-a", state_dir=tmp_path)
    idle, busy = (u.uuid for u in backend.inventory().units)
    set_fake_utilization(busy, 100, state_dir=tmp_path)

    def energy() -> dict[str, int]:
        return {u.uuid: u.energy_mj for u in backend.usage() if u.energy_mj is not None}

    first = energy()
    time.sleep(0.2)
    second = energy()
    grown = {uuid: second[uuid] - first[uuid] for uuid in (idle, busy)}
    # 50 W idle, 400 W at 100 %: over about 0.2 s, 10 J and 80 J (millijoules here)
    assert 5_000 < grown[idle] < grown[busy]
    assert grown[busy] > 5 * grown[idle]
    set_fake_energy(busy, 123_456_789, state_dir=tmp_path)
    assert energy()[busy] == 123_456_789
    set_fake_energy(busy, 5, state_dir=tmp_path)  # a reset: the counter goes down
    assert energy()[busy] == 5
    set_fake_energy(busy, None, state_dir=tmp_path)
    assert energy()[busy] >= second[busy]  # the simulated counter again, never going back


def test_mig_slices_have_no_energy_counter(tmp_path: Path) -> None:
    backend = FakeGpuBackend("1xA100-80GB:mig=3g.40gb+3g.40gb,1", "node-a", state_dir=tmp_path)
    found = {u.uuid: u for u in backend.usage()}
    for unit in backend.inventory().units:
        if unit.parent_uuid:
            assert found[unit.uuid].energy_mj is None
            assert found[unit.uuid].utilization is None  # unknown, never 0
        else:
            assert found[unit.uuid].energy_mj is not None


def test_utilisation_follows_a_series(tmp_path: Path) -> None:
    backend = FakeGpuBackend("1", "node-a", state_dir=tmp_path)
    unit = backend.inventory().units[0].uuid
    set_fake_utilization(unit, [90, 10, 40], state_dir=tmp_path, every=0.3)
    assert usage_of(backend, unit).utilization == 90
    wait_for(lambda: usage_of(backend, unit).utilization == 10, "the series' second value")
    wait_for(lambda: usage_of(backend, unit).utilization == 40, "the series' last value")
    time.sleep(0.4)
    assert usage_of(backend, unit).utilization == 40  # the last value holds
    with pytest.raises(InvalidInput):
        set_fake_utilization(unit, [], state_dir=tmp_path)
    (tmp_path / unit / "utilization").write_text("50 x\n")  # malformed: not a number
    assert usage_of(backend, unit).utilization == 0


def test_the_fake_backend_is_the_nvml_backend(tmp_path: Path) -> None:
    backend = FakeGpuBackend("2", "node-a", state_dir=tmp_path)
    assert isinstance(backend, NvmlGpuBackend)
    assert backend.state_dir == tmp_path
    assert backend.inventory().fake
    assert backend.refresh() is False


def test_claims_have_kinds_and_stuck_ones_outlive_their_process(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    backend = FakeGpuBackend("1", "node-a", state_dir=tmp_path)
    unit = backend.inventory().units[0].uuid
    claim_fake_vram(unit, 1 * GIB, pid=sleeper.pid, state_dir=tmp_path, kind="graphics")
    claim_fake_vram(unit, 2 * GIB, state_dir=tmp_path, kind="mps")
    stuck = claim_fake_vram(unit, 3 * GIB, pid=999_999_999, state_dir=tmp_path, stuck=True)
    assert set(usage_of(backend, unit).processes) == {
        GpuProcess(sleeper.pid, 1 * GIB, "graphics"),
        GpuProcess(os.getpid(), 2 * GIB, "mps"),
        GpuProcess(999_999_999, 3 * GIB, "compute"),  # its pid is gone: a straggler
    }
    assert usage_of(backend, unit).memory_used == 6 * GIB
    stuck.unlink()
    assert GpuProcess(999_999_999, 3 * GIB) not in usage_of(backend, unit).processes
    with pytest.raises(InvalidInput, match="kind"):
        claim_fake_vram(unit, 1, state_dir=tmp_path, kind="video")


def test_claiming_needs_a_state_dir_and_a_plain_uuid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(FAKE_GPU_DIR_ENV, raising=False)
    assert fake_state_dir() is None
    with pytest.raises(InvalidInput, match=FAKE_GPU_DIR_ENV):
        claim_fake_vram("GPU-1234", 10)
    with pytest.raises(InvalidInput, match="uuid"):
        claim_fake_vram("../etc", 10, state_dir=tmp_path)
    with pytest.raises(InvalidInput, match="nbytes"):
        claim_fake_vram("GPU-1234", -1, state_dir=tmp_path)
    assert FakeGpuBackend("1", "node-a").state_dir is None
