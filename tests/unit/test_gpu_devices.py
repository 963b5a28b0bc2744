"""Device nodes and nearby CPUs: the pure parsing, and the fake library's nodes and sockets."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
from helpers import needs

from gpuq.agent.fake import nvml_box
from gpuq.agent.fake.gpu_backend import FakeGpuBackend
from gpuq.agent.gpu.device_paths import (
    NVIDIA_MAJOR,
    affinity_words,
    cpus_from_affinity,
    mig_device_nodes,
    online_cpus,
    parse_cpulist,
    parse_mig_minors,
    sysfs_bus_id,
    sysfs_local_cpus,
)

MIG_MINORS = """\
config 1
monitor 2
gpu0/gi1/access 12
gpu0/gi1/ci0/access 13
gpu0/gi1/ci1/access 14
gpu1/gi2/access 30
gpu1/gi2/ci0/access 31
garbage line
"""


def test_mig_minors_are_parsed_from_the_drivers_format() -> None:
    minors = parse_mig_minors(MIG_MINORS)
    assert minors == {
        (0, 1, None): 12,
        (0, 1, 0): 13,
        (0, 1, 1): 14,
        (1, 2, None): 30,
        (1, 2, 0): 31,
    }


def test_a_slice_needs_its_parent_and_both_capability_nodes() -> None:
    minors = parse_mig_minors(MIG_MINORS)
    assert mig_device_nodes(Path("/dev"), minors, 0, 1, 1) == (
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap12",
        "/dev/nvidia-caps/nvidia-cap14",
    )
    assert mig_device_nodes(Path("/dev"), minors, 1, 2, 5) == ()  # unknown CI: none at all
    assert mig_device_nodes(Path("/dev"), minors, 3, 1, 0) == ()


def test_cpu_affinity_words_and_cpulists() -> None:
    assert cpus_from_affinity([0b1011, 1]) == (0, 1, 3, 64)
    assert cpus_from_affinity(affinity_words([0, 5, 70, 127], 2)) == (0, 5, 70, 127)
    assert parse_cpulist("0-3,8-9,12\n") == (0, 1, 2, 3, 8, 9, 12)
    assert parse_cpulist("") == ()
    assert parse_cpulist("3-1") == () and parse_cpulist("a-b") == ()


def test_sysfs_spells_bus_ids_with_a_short_lowercase_domain(tmp_path: Path) -> None:
    assert sysfs_bus_id("00000000:1B:00.0") == "0000:1b:00.0"
    assert sysfs_bus_id("0001:C4:00.0") == "0001:c4:00.0"
    (tmp_path / "0000:1b:00.0").mkdir()
    (tmp_path / "0000:1b:00.0" / "local_cpulist").write_text("0-1\n")
    assert sysfs_local_cpus(tmp_path, "00000000:1B:00.0") == (0, 1)
    assert sysfs_local_cpus(tmp_path, "00000000:99:00.0") == ()


def test_fake_gpus_split_the_machines_cpus_between_two_sockets() -> None:
    cpus = online_cpus()
    backend = FakeGpuBackend("4xL4-24GB", "node-a")
    local = backend.inventory().local_cpus
    units = [u.uuid for u in backend.inventory().units]
    first, second = (
        (cpus[: len(cpus) // 2], cpus[len(cpus) // 2 :]) if len(cpus) > 1 else (cpus,) * 2
    )
    assert [local[u] for u in units] == [first, first, second, second]


@needs(os.geteuid() == 0, "mknod needs root")
def test_as_root_fake_gpus_get_real_device_nodes(tmp_path: Path) -> None:
    spec = "2xA100-80GB,1xA100-80GB:mig=3g.40gb+1c.3g.40gb/2c.3g.40gb"
    backend = FakeGpuBackend(spec, "node-a", state_dir=tmp_path)
    inventory = backend.inventory()
    devices = inventory.devices
    whole, _other, *slices = inventory.units
    assert devices[whole.uuid] == (str(tmp_path / "dev" / "nvidia0"),)
    info = os.stat(devices[whole.uuid][0])
    assert stat.S_ISCHR(info.st_mode)
    assert (os.major(info.st_rdev), os.minor(info.st_rdev)) == (NVIDIA_MAJOR, 0)
    parent = str(tmp_path / "dev" / "nvidia2")
    nodes = [devices[s.uuid] for s in slices]
    assert all(len(n) == 3 and n[0] == parent for n in nodes)
    assert nodes[1][1] == nodes[2][1], "compute instances of one GPU instance share its node"
    assert len({n[1] for n in nodes}) == 2 and len({n[2] for n in nodes}) == 3
    for node in nodes[0][1:]:
        found = os.stat(node)
        assert os.major(found.st_rdev) == nvml_box.NVIDIA_CAPS_MAJOR
    with pytest.raises(OSError) as opened:  # no NVIDIA driver here: the node leads nowhere
        os.open(devices[whole.uuid][0], os.O_RDWR)
    assert opened.value.errno in (errno.ENXIO, errno.ENODEV)
    backend.close()


def test_without_root_fake_gpus_list_no_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    backend = FakeGpuBackend("1xA100-80GB:mig=3g.40gb,1", "node-a", state_dir=tmp_path)
    assert backend.inventory().devices == {}
    assert not (tmp_path / "dev").exists()
