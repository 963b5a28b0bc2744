"""The job's launch spec from an order and the node's policy: allocator settings as one
setting, device rules, CPUs (gpuq/agent/jobs/launch_spec.py)."""

from __future__ import annotations

import pytest

from gpuq.agent.jobs.job_account import Account, launch_refusal
from gpuq.agent.jobs.launch_spec import (
    LaunchOrder,
    LaunchSpec,
    NodePolicy,
    build_launch,
    cgroup_key,
)
from gpuq.agent.jobs.mps_share import MpsShare
from gpuq.config.settings import DEFAULT_JOB_ENV
from gpuq.config.value_checks import _job_env
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


def test_units_and_share_limit_go_under_extra_in_spec_json_as_every_agent_wrote_them() -> None:
    """An agent that restarts adopts jobs an earlier agent started: it reads their units and a
    share job's VRAM limit back from spec.json's "extra" object, where agents have always
    written them (the supervisor ignores it)."""
    units = {"GPU-1": unit("GPU-1", 1)}
    mps = MpsShare("/run/mps/pipe", "/run/mps/log", 50, 20 << 30)
    spec = build_launch(order({}, ("GPU-1",)), NodePolicy("n1", units), mps=mps)
    assert (spec.gpus, spec.share_mem) == (("GPU-1",), 20 << 30)
    data = spec.to_dict()
    assert data["extra"] == {"gpus": ["GPU-1"], "share_mem": 20 << 30}
    assert "gpus" not in data and "share_mem" not in data
    assert LaunchSpec.from_dict(data) == spec
    cpu_job = build_launch(order({}, ()), NodePolicy("n1", {}))
    assert cpu_job.to_dict()["extra"] == {"gpus": []}
    # what an earlier agent wrote (extra filled in after build_launch), and a bare spec's {}
    earlier = {**cpu_job.to_dict(), "extra": {"gpus": ["GPU-1"], "share_mem": 5}}
    assert (LaunchSpec.from_dict(earlier).gpus, LaunchSpec.from_dict(earlier).share_mem) == (
        ("GPU-1",),
        5,
    )
    bare = LaunchSpec.from_dict({**cpu_job.to_dict(), "extra": {}})
    assert (bare.gpus, bare.share_mem) == ((), None)


ALICE = Account("alice", 1001, 1001, "/home/alice", "/bin/zsh")
ROOT = Account("root", 0, 0, "/root", "/bin/bash")


def test_a_job_runs_as_its_submitters_account_with_its_home_and_shell() -> None:
    """HOME, USER, LOGNAME and SHELL come from the passwd entry, whatever the submitter sent."""
    sent = {"HOME": "/root", "USER": "root", "LOGNAME": "root", "SHELL": "/bin/evil", "A": "1"}
    policy = NodePolicy("n1", {}, switch_user=True)
    spec = build_launch(order(sent), policy, account=ALICE)
    assert (spec.user, spec.uid, spec.gid) == ("alice", 1001, 1001)
    assert {k: spec.env[k] for k in ("HOME", "USER", "LOGNAME", "SHELL", "A")} == {
        "HOME": "/home/alice",
        "USER": "alice",
        "LOGNAME": "alice",
        "SHELL": "/bin/zsh",
        "A": "1",
    }
    assert LaunchSpec.from_dict(spec.to_dict()) == spec


def test_an_agent_that_cannot_switch_users_keeps_its_own() -> None:
    spec = build_launch(order({}), NodePolicy("n1", {}), account=ALICE)
    assert (spec.user, spec.uid, spec.gid) == (None, None, None)
    assert spec.env["HOME"] == "/home/alice"


def test_the_installations_key_goes_with_the_cgroup_parent() -> None:
    spec = build_launch(order({}), NodePolicy("n1", {}, cgroup_parent="gpuq", cgroup_key="k1"))
    assert (spec.cgroup_parent, spec.cgroup_key) == ("gpuq", "k1")
    # one key per installation (its run folder) and node: two never share job groups
    keys = {cgroup_key(run, node) for run in ("/dev/shm/gpuq-a/n1", "/srv/b/n1") for node in "xy"}
    assert len(keys) == 4 and all(len(k) == 12 and int(k, 16) >= 0 for k in keys)
    assert cgroup_key("/srv/b/n1", "x") == cgroup_key("/srv/b/n1", "x")


def refusal(account: Account | None, **given: object) -> str | None:
    options: dict[str, object] = {"node": "n1", "agent_uid": 0, "allow_root_jobs": False}
    options.update(given)
    name = account.name if account else "ghost"
    return launch_refusal(name, account, **options)  # type: ignore[arg-type]


def test_who_a_node_runs_jobs_for() -> None:
    assert refusal(ALICE) is None
    assert refusal(None) == "user 'ghost' has no account on node n1"
    assert refusal(ROOT) == (
        "node n1 does not run jobs as root ([agent] allow_root_jobs is false there; "
        "root's jobs need it and [coordinator] allow_root_jobs)"
    )
    assert refusal(ROOT, allow_root_jobs=True) is None
    # an agent that is not root runs only its own user's jobs
    assert refusal(ALICE, agent_uid=1001) is None
    assert "cannot run jobs of user alice" in (refusal(ALICE, agent_uid=1002) or "")
    assert "cannot run jobs of user root" in (
        refusal(ROOT, agent_uid=1002, allow_root_jobs=True) or ""
    )
    # a root agent serving a user's private coordinator: that user's jobs only, never root's
    assert refusal(ALICE, coordinator_owner=1001) is None
    assert "private coordinator of uid 1002" in (refusal(ALICE, coordinator_owner=1002) or "")
    assert "private coordinator" in (
        refusal(ROOT, coordinator_owner=1001, allow_root_jobs=True) or ""
    )
    assert refusal(ALICE, coordinator_owner=0) is None
    assert "cannot tell who owns" in (refusal(ALICE, coordinator_owner=-1) or "")


def test_nccl_async_error_handling_is_a_default_the_admin_and_user_can_change() -> None:
    assert DEFAULT_JOB_ENV["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env_of({}, dict(DEFAULT_JOB_ENV))["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    admin = _job_env({"TORCH_NCCL_ASYNC_ERROR_HANDLING": ""}, "test", "[agent.job_env]")
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env_of({}, admin)
    user = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
    assert env_of(user, dict(DEFAULT_JOB_ENV))["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
