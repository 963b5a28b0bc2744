"""What a job knows about where it runs (gpuq/agent/jobs/gang_environment.py through
build_launch): SLURM's and torch.distributed's variables on the first node and the others,
the step worker that runs instead of the script on the others, a MASTER_PORT that jobs on one
node never share (gpuq/coordinator/scheduling/job_ports.py), and what a malformed launch is
refused with. The coordinator's side of an agent's address (agent_input.peer_address) too."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuq.agent.jobs.gang_environment import Gang
from gpuq.agent.jobs.launch_spec import LaunchOrder, NodePolicy, build_launch
from gpuq.coordinator.nodes.agent_commands import distinct_loopbacks
from gpuq.coordinator.nodes.agent_input import check_node_address, peer_address
from gpuq.coordinator.scheduling.job_ports import FIRST_PORT, LAST_PORT, choose_master_port
from gpuq.domain.interactive_jobs import Terminal
from gpuq.domain.model import GpuUnit, JobSpec, Resources
from gpuq.errors import InvalidInput

KEY = "ab" * 32
UNITS = {
    f"GPU-{n}-{i}": GpuUnit(f"GPU-{n}-{i}", i, "fake", 1 << 30, pci_bus_id=f"0000:0{i}:00.0")
    for n in ("gpu01", "gpu02")
    for i in range(2)
}


def order(index: int, **resources: object) -> LaunchOrder:
    node = f"gpu0{index + 1}"
    spec = JobSpec(
        name="train",
        script="#!/bin/sh\nsrun python train.py\n",
        workdir="/home/alice/run",
        args=("--epochs", "3"),
        env={"SLURM_PROCID": "7", "MASTER_PORT": "1", "PATH": "/usr/bin:/bin"},
        resources=Resources(gpus=2, nodes=2, cpus=8, **resources),  # type: ignore[arg-type]
    )
    gang = Gang(("gpu01", "gpu02"), ("10.0.0.2", "10.0.0.3"), index, 23456, KEY)
    return LaunchOrder(
        job_id=812,
        spec=spec,
        gpus=(f"GPU-{node}-0", f"GPU-{node}-1"),
        user="alice",
        gang=gang,
    )


def policy(node: str, shims: str = "/opt/gpuq/steps/shims") -> NodePolicy:
    return NodePolicy(node, UNITS, python="/usr/bin/python3", shim_dir=shims)


def test_the_first_node_runs_the_script_with_slurms_and_torchs_variables() -> None:
    spec = build_launch(order(0), policy("gpu01"))
    env = spec.env
    assert spec.script.startswith("#!/bin/sh\nsrun") and spec.args == ("--epochs", "3")
    assert spec.stdout_path == "/home/alice/run/gpuq-812.out"
    assert env["SLURM_JOB_ID"] == env["SLURM_JOBID"] == "812"
    assert env["SLURM_JOB_NODELIST"] == env["SLURM_NODELIST"] == "gpu[01-02]"
    assert env["SLURM_NNODES"] == env["SLURM_JOB_NUM_NODES"] == "2"
    assert env["SLURM_NODEID"] == "0" and env["SLURMD_NODENAME"] == "gpu01"
    assert env["SLURM_GPUS_ON_NODE"] == "2" and env["SLURM_CPUS_PER_TASK"] == "8"
    assert env["SLURM_SUBMIT_DIR"] == "/home/alice/run" and env["SLURM_JOB_NAME"] == "train"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.2", "23456")
    assert env["GPUQ_STEP_PORT"] == "23457" and env["GPUQ_STEP_KEY"] == KEY
    assert env["GPUQ_JOB_NODES"] == "gpu01,gpu02"
    assert env["GPUQ_NODE_ADDRS"] == "10.0.0.2,10.0.0.3"
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-gpu01-0,GPU-gpu01-1"
    # the submitter's SLURM_PROCID is dropped; srun sets the per-task ones, not the script
    for name in ("SLURM_PROCID", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK"):
        assert name not in env, name
    # tasks were not asked for: no SLURM_NTASKS (Lightning would take the script for srun's)
    assert "SLURM_NTASKS" not in env and "SLURM_NTASKS_PER_NODE" not in env
    assert env["PATH"] == "/opt/gpuq/steps/shims:/usr/bin:/bin"


def test_tasks_asked_for_set_slurm_ntasks() -> None:
    env = build_launch(order(0, tasks_per_node=4, explicit_tasks=True), policy("gpu01")).env
    assert (env["SLURM_NTASKS"], env["SLURM_NPROCS"]) == ("8", "8")
    assert env["SLURM_NTASKS_PER_NODE"] == "4" and env["SLURM_CPUS_PER_TASK"] == "2"


def test_who_how_much_memory_and_which_restart_are_slurms_too() -> None:
    """Scripts that resume from a checkpoint after a requeue read SLURM_RESTART_COUNT; a
    job without --mem has no SLURM_MEM_PER_NODE, as under sbatch."""
    requeued = replace(order(0, mem=40 << 30), requeue_count=2)
    env = build_launch(requeued, policy("gpu01")).env
    assert env["SLURM_RESTART_COUNT"] == env["GPUQ_RESTART_COUNT"] == "2"
    assert env["SLURM_JOB_USER"] == "alice" and env["SLURM_MEM_PER_NODE"] == "40960"
    first = build_launch(order(0), policy("gpu01")).env
    assert first["SLURM_RESTART_COUNT"] == "0" and "SLURM_MEM_PER_NODE" not in first


def test_another_node_runs_a_step_worker_and_writes_no_output_file() -> None:
    spec = build_launch(order(1), policy("gpu02"))
    assert spec.script == "#!/bin/sh\nexec /usr/bin/python3 -m gpuq.steps.step_worker\n"
    assert spec.args == ()
    assert spec.stdout_path == spec.stderr_path == "/dev/null"  # never the job's own file
    env = spec.env
    assert env["SLURM_NODEID"] == env["GPUQ_NODE_INDEX"] == "1"
    assert env["MASTER_ADDR"] == "10.0.0.2"  # the first node's
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-gpu02-0,GPU-gpu02-1"


def test_no_shims_where_the_admin_turned_them_off() -> None:
    env = build_launch(order(0), policy("gpu01", shims="")).env
    assert env["PATH"] == "/usr/bin:/bin"


@pytest.mark.parametrize(
    ("field", "values"),
    [
        ("index", {"index": 2}),
        ("address", {"addresses": ("10.0.0.2", "gpu02; rm -rf /")}),
        ("node", {"nodes": ("gpu01", "../etc")}),
        ("key", {"step_key": "not hex"}),
        ("port", {"master_port": 70000}),
        ("count", {"addresses": ("10.0.0.2",)}),
    ],
)
def test_a_malformed_launch_is_refused(field: str, values: dict[str, object]) -> None:
    fields: dict[str, object] = {
        "nodes": ("gpu01", "gpu02"),
        "addresses": ("10.0.0.2", "10.0.0.3"),
        "index": 0,
        "master_port": 23456,
        "step_key": KEY,
    } | values
    with pytest.raises(InvalidInput):
        Gang(**fields)  # type: ignore[arg-type]


def test_master_ports_of_jobs_on_one_node_differ_and_stay_in_range() -> None:
    taken: set[int] = set()
    for job_id in range(1, 3000):
        port = choose_master_port(job_id, 1, taken)
        assert port not in taken and FIRST_PORT <= port < LAST_PORT and port % 2 == 0
        taken.add(port)


def test_a_full_range_still_gives_a_port() -> None:
    every = set(range(FIRST_PORT, LAST_PORT, 2))
    assert FIRST_PORT <= choose_master_port(5, 1, every) < LAST_PORT


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:10.213.7.2:41234", "10.213.7.2"),
        ("ipv6:[fe80::1]:41234", "fe80::1"),
        ("unix:/run/gpuq/agent.sock", "127.0.0.1"),
        ("unix:", "127.0.0.1"),
        ("", "127.0.0.1"),
    ],
)
def test_an_agents_address_is_what_its_connection_came_from(peer: str, address: str) -> None:
    assert peer_address(peer) == address


def test_a_registered_address_must_be_an_ip_address() -> None:
    assert check_node_address("10.0.0.2") == "10.0.0.2"
    with pytest.raises(InvalidInput):
        check_node_address("gpu02.lab")


def test_nodes_on_one_machine_get_distinct_loopback_addresses() -> None:
    """Agents on the coordinator's machine (its Unix socket) are all at 127.0.0.1: each node
    of a job gets its own loopback address, so each step worker binds its own."""
    assert distinct_loopbacks(["127.0.0.1", "127.0.0.1", "127.0.0.1"]) == [
        "127.0.0.1",
        "127.0.0.2",
        "127.0.0.3",
    ]
    assert distinct_loopbacks(["10.0.0.2", "10.0.0.3"]) == ["10.0.0.2", "10.0.0.3"]


def test_an_interactive_jobs_terminal_is_on_its_first_node_only() -> None:
    base = order(1)
    spec = replace(base.spec, terminal=Terminal(rows=24, cols=80, term="xterm"))
    follower = build_launch(replace(base, spec=spec), policy("gpu02"))
    assert follower.terminal is None and follower.stdout_path == "/dev/null"
    leader = build_launch(replace(order(0), spec=spec), policy("gpu01"))
    assert leader.terminal is not None
