"""The job's launch spec from an order and the node's policy: allocator settings as one
setting, device rules, CPUs (gpuq/agent/launch.py)."""

from __future__ import annotations

import pytest

from gpuq.agent.launch import LaunchOrder, LaunchSpec, NodePolicy, build_launch
from gpuq.domain.model import GpuUnit, JobSpec

OLD, NEW = "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"
ADMIN = "expandable_segments:True"


def order(env: dict[str, str], gpus: tuple[str, ...] = ()) -> LaunchOrder:
    spec = JobSpec(name="j", script="#!/bin/sh\ntrue\n", workdir="/tmp", env=env)
    return LaunchOrder(job_id=7, spec=spec, gpus=gpus, user="alice")


def env_of(user: dict[str, str], admin: dict[str, str]) -> dict[str, str]:
    return build_launch(order(user), NodePolicy("n1", {}, job_env=admin)).env


@pytest.mark.parametrize("admin_name", [OLD, NEW])
def test_the_admin_default_goes_under_both_names(admin_name: str) -> None:
    env = env_of({}, {admin_name: ADMIN})
    assert (env[OLD], env[NEW]) == (ADMIN, ADMIN)


@pytest.mark.parametrize("user_name", [OLD, NEW])
def test_a_users_value_under_either_name_is_copied_and_wins(user_name: str) -> None:
    env = env_of({user_name: "backend:cudaMallocAsync"}, {OLD: ADMIN, NEW: ADMIN})
    assert (env[OLD], env[NEW]) == ("backend:cudaMallocAsync", "backend:cudaMallocAsync")


def test_a_user_who_set_both_keeps_each() -> None:
    env = env_of({OLD: "a:1", NEW: "b:2"}, {OLD: ADMIN})
    assert (env[OLD], env[NEW]) == ("a:1", "b:2")


def test_admin_values_under_both_names_kept_as_given() -> None:
    env = env_of({}, {OLD: "a:1", NEW: "b:2"})
    assert (env[OLD], env[NEW]) == ("a:1", "b:2")


def test_other_defaults_still_apply_where_the_user_set_none() -> None:
    admin = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    env = env_of({OLD: "x", "TF_FORCE_GPU_ALLOW_GROWTH": "false"}, admin | {NEW: ADMIN})
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert (env[OLD], env[NEW]) == ("x", "x")


def test_no_allocator_setting_anywhere_sets_none() -> None:
    env = env_of({}, {})
    assert OLD not in env and NEW not in env


def unit(uuid: str, index: int) -> GpuUnit:
    return GpuUnit(uuid=uuid, index=index, name="fake", memory=1 << 30, pci_bus_id=f"0:{index}")


def test_device_rules_and_cpus_in_the_spec() -> None:
    units = {"GPU-0": unit("GPU-0", 0), "GPU-1": unit("GPU-1", 1)}
    devices = {"GPU-0": (("c", 195, 0),), "GPU-1": (("c", 195, 1),)}
    policy = NodePolicy("n1", units, devices=devices)
    spec = build_launch(order({}, ("GPU-1",)), policy, cpus=(9, 8, 10), mems=(1,))
    assert spec.device_deny == ("c 195:0",)
    assert (spec.cpuset, spec.mems) == ("8-10", "1")
    assert LaunchSpec.from_dict(spec.to_dict()) == spec


def test_no_devices_known_no_rules_and_unbound_by_default() -> None:
    spec = build_launch(order({}, ()), NodePolicy("n1", {}))
    assert spec.device_deny == () and spec.cpuset is None and spec.mems is None
