"""The pure parts of device isolation and CPU binding (gpuq/agent/jobs/isolation.py)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from helpers import needs
from hypothesis import given
from hypothesis import strategies as st

from gpuq.agent.jobs.isolation import (
    MountTable,
    choose_cpus,
    device_numbers,
    device_rules,
    format_cpulist,
    parse_cpulist,
)

GPU0, GPU1 = ("c", 195, 0), ("c", 195, 1)
CAP = [("c", 509, n) for n in range(4)]  # /dev/nvidia-caps/nvidia-capN


def test_a_job_loses_the_other_gpus_nodes() -> None:
    devices = {"GPU-0": (GPU0,), "GPU-1": (GPU1,)}
    assert device_rules(devices, ["GPU-0"]) == ("c 195:1",)
    assert device_rules(devices, ["GPU-0", "GPU-1"]) == ()
    assert device_rules(devices, []) == ("c 195:0", "c 195:1")  # a CPU job sees no GPU


def test_a_mig_slice_keeps_its_parents_node_shared_with_a_sibling() -> None:
    """Two slices of GPU 0 and a whole GPU 1: the job with slice A keeps /dev/nvidia0 (which
    slice B lists too) and its own capability node, and loses B's and GPU 1's."""
    devices = {
        "MIG-A": (GPU0, CAP[0]),
        "MIG-B": (GPU0, CAP[1]),
        "GPU-1": (GPU1,),
    }
    assert device_rules(devices, ["MIG-A"]) == ("c 195:1", "c 509:1")
    assert device_rules(devices, ["GPU-1"]) == ("c 195:0", "c 509:0", "c 509:1")


def test_rules_are_sorted_and_ignore_unknown_units() -> None:
    devices = {"b": (GPU1,), "a": (GPU0,)}
    assert device_rules(devices, ["nope"]) == ("c 195:0", "c 195:1")
    assert device_rules({}, ["a"]) == ()


def test_device_numbers_reads_nodes_and_reports_what_it_skips(tmp_path: Path) -> None:
    problems: list[str] = []
    plain = tmp_path / "plain"
    plain.write_text("")
    paths = ["/dev/null", str(tmp_path / "missing"), str(plain), "/dev/null"]
    assert device_numbers(paths, problems) == (("c", 1, 3),)
    assert len(problems) == 2
    assert problems[0].startswith(str(tmp_path / "missing"))
    assert problems[1] == f"{plain}: not a device node"


@needs(os.geteuid() == 0, "mknod needs root")
def test_device_numbers_of_a_made_gpu_node(tmp_path: Path) -> None:
    node = tmp_path / "nvidia7"
    os.mknod(node, 0o600 | stat.S_IFCHR, os.makedev(195, 7))
    assert device_numbers([str(node)]) == (("c", 195, 7),)


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8", (0, 1, 2, 3, 8)), ("1", (1,)), ("", ()), ("5,1-2,2\n", (1, 2, 5))],
)
def test_parse_cpulist(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["3-1", "x", "1-", "-1"])
def test_parse_cpulist_refuses_nonsense(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(text)


def test_format_cpulist() -> None:
    assert format_cpulist([8, 0, 1, 2, 3]) == "0-3,8"
    assert format_cpulist([]) == ""
    assert format_cpulist([4, 6]) == "4,6"


@given(st.sets(st.integers(0, 300)))
def test_cpulist_round_trip(cpus: set[int]) -> None:
    assert parse_cpulist(format_cpulist(cpus)) == tuple(sorted(cpus))


ONLINE = tuple(range(16))
NODE0, NODE1 = tuple(range(8)), tuple(range(8, 16))


def test_free_cpus_near_the_gpus_first() -> None:
    assert choose_cpus(4, ONLINE, busy=set(), near=NODE1) == (8, 9, 10, 11)
    assert choose_cpus(4, ONLINE, busy={8, 9}, near=NODE1) == (10, 11, 12, 13)


def test_then_other_free_cpus() -> None:
    busy = set(range(9, 16))
    assert choose_cpus(3, ONLINE, busy=busy, near=NODE1) == (0, 1, 8)


def test_overcommitted_takes_the_least_loaded_near_ones_so_the_job_starts() -> None:
    busy = set(ONLINE)
    load = {cpu: 2 for cpu in ONLINE} | {3: 1, 12: 1}
    assert choose_cpus(2, ONLINE, busy=busy, near=NODE1, load=load) == (3, 12)
    # equal load: near before far
    assert choose_cpus(2, ONLINE, busy=busy, near=NODE1) == (8, 9)
    # some free, the rest from the busy ones
    assert choose_cpus(3, ONLINE, busy=set(ONLINE) - {0}, near=NODE1) == (0, 8, 9)


def test_never_more_than_online_and_nothing_for_zero() -> None:
    assert choose_cpus(32, (0, 1), busy=set(), near=()) == (0, 1)
    assert choose_cpus(0, ONLINE, busy=set(), near=NODE0) == ()
    assert choose_cpus(2, (0, 1), busy=set(), near=(5, 6)) == (0, 1)  # near but offline


@given(
    st.integers(0, 20),
    st.sets(st.integers(0, 15)),
    st.sets(st.integers(0, 15)),
)
def test_choose_cpus_properties(count: int, busy: set[int], near: set[int]) -> None:
    chosen = choose_cpus(count, ONLINE, busy=busy, near=sorted(near))
    assert len(chosen) == min(count, len(ONLINE)) == len(set(chosen))
    assert set(chosen) <= set(ONLINE)
    free = set(ONLINE) - busy
    # every free CPU is used before any busy one, and free near ones before free far ones
    assert len(set(chosen) & free) == min(count, len(free))
    assert len(set(chosen) & free & near) == min(count, len(free & near))


@needs(os.geteuid() == 0, "mounting needs root")
def test_the_mount_table_follows_mounts_and_unmounts(tmp_path: Path) -> None:
    """The node's isolation claim is worked out from the mount table: a cgroup hierarchy
    mounted or unmounted after the agent started must show in the next heartbeat's claim."""
    table = MountTable()
    assert table.text() == Path("/proc/self/mounts").read_text(errors="replace")
    subprocess.run(["mount", "-t", "tmpfs", "gpuq-test", str(tmp_path)], check=True)
    try:
        assert f" {tmp_path} tmpfs " in table.text()
        assert table.text() == Path("/proc/self/mounts").read_text(errors="replace")
    finally:
        subprocess.run(["umount", str(tmp_path)], check=True)
    assert f" {tmp_path} " not in table.text()
