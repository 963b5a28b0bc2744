"""Where a step's tasks go and what each sees (gpuq.steps.task_layout): SLURM's block layout,
its refusals, the per-task variables training tools read, and GPU binding per task."""

from __future__ import annotations

import pytest

from gpuq.errors import InvalidInput
from gpuq.steps.task_layout import (
    JobShape,
    StepRequest,
    bind_gpus,
    compact_ranks,
    job_shape,
    plan,
    task_env,
    tasks_per_node_text,
)


def shape(nodes: int = 2, tasks_per_node: int = 1, cpus: int = 8, gpus: int = 4) -> JobShape:
    names = tuple(f"gpu{i + 1:02d}" for i in range(nodes))
    addrs = tuple(f"10.0.0.{i + 2}" for i in range(nodes))
    return JobShape("812", names, addrs, tasks_per_node, cpus, gpus, None)


def layout_of(job: JobShape, **request: int | bool) -> list[tuple[int, int, int]]:
    return [(t.rank, t.node_id, t.local_id) for t in plan(job, StepRequest(**request)).tasks]  # type: ignore[arg-type]


def test_default_step_is_the_jobs_tasks_node_by_node() -> None:
    assert layout_of(shape(2, 2)) == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]


def test_fewer_tasks_are_dealt_evenly_then_numbered_in_blocks() -> None:
    assert plan(shape(2), StepRequest(ntasks=5)).counts == (3, 2)
    assert layout_of(shape(2), ntasks=4) == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    one = plan(shape(3), StepRequest(ntasks=1))
    assert one.nodes == ("gpu01",) and one.counts == (1,)


def test_nodes_and_tasks_per_node() -> None:
    step = plan(shape(3), StepRequest(nodes=2, ntasks_per_node=3))
    assert step.nodes == ("gpu01", "gpu02") and step.counts == (3, 3)
    assert plan(shape(4), StepRequest(ntasks=4, ntasks_per_node=2)).counts == (2, 2)


def test_impossible_layouts_are_refused_with_one_line() -> None:
    with pytest.raises(InvalidInput, match="the job has 2 nodes"):
        plan(shape(2), StepRequest(nodes=3))
    with pytest.raises(InvalidInput, match="hold 16 tasks"):
        plan(shape(2, cpus=8), StepRequest(ntasks=17))
    with pytest.raises(InvalidInput, match="room for 8 tasks"):
        plan(shape(2, cpus=8), StepRequest(ntasks_per_node=9))
    with pytest.raises(InvalidInput, match="need 6 GPUs"):
        plan(shape(2, gpus=4), StepRequest(ntasks_per_node=3, gpus_per_task=2))
    with pytest.raises(InvalidInput, match="at least 1"):
        plan(shape(2), StepRequest(ntasks=0))


def test_overcommit_allows_more_tasks_than_slots() -> None:
    assert plan(shape(2, cpus=2), StepRequest(ntasks=6, overcommit=True)).counts == (3, 3)


def test_per_task_variables_for_torch_and_lightning() -> None:
    job = shape(2, 2, cpus=8)
    step = plan(job, StepRequest())
    env = task_env(job, step, step.tasks[3], step_id=2)
    assert env["SLURM_PROCID"] == env["RANK"] == "3"
    assert env["SLURM_LOCALID"] == env["LOCAL_RANK"] == "1"
    assert env["SLURM_NODEID"] == env["NODE_RANK"] == env["GROUP_RANK"] == "1"
    assert env["SLURM_NTASKS"] == env["WORLD_SIZE"] == env["SLURM_NPROCS"] == "4"
    # Lightning's validate_settings: int(SLURM_NTASKS_PER_NODE) == devices, SLURM_NNODES == nodes
    assert env["SLURM_NTASKS_PER_NODE"] == env["LOCAL_WORLD_SIZE"] == "2"
    assert env["SLURM_NNODES"] == env["SLURM_STEP_NUM_NODES"] == "2"
    assert env["SLURM_NODELIST"] == env["SLURM_STEP_NODELIST"] == "gpu[01-02]"
    assert env["SLURM_TASKS_PER_NODE"] == "2(x2)"
    assert env["SLURMD_NODENAME"] == "gpu02"
    assert env["SLURM_STEP_ID"] == "2"
    assert env["OMP_NUM_THREADS"] == env["SLURM_CPUS_PER_TASK"] == "4"


def test_cpus_per_task_sets_omp_threads() -> None:
    job = shape(1, cpus=8)
    step = plan(job, StepRequest(ntasks=2, cpus_per_task=3))
    assert task_env(job, step, step.tasks[0], 0)["OMP_NUM_THREADS"] == "3"


def test_gpu_binding_gives_each_local_task_its_slice() -> None:
    units = "GPU-a,GPU-b,GPU-c,GPU-d"
    assert bind_gpus(units, 0, 2) == "GPU-a,GPU-b"
    assert bind_gpus(units, 1, 2) == "GPU-c,GPU-d"
    assert bind_gpus(units, 3, 1) == "GPU-d"
    assert bind_gpus(units, 1, None) is None  # every task sees the node's GPUs
    with pytest.raises(InvalidInput, match="needs GPUs 4-5"):
        bind_gpus(units, 2, 2)


def test_the_jobs_gpus_per_task_applies_unless_the_step_says() -> None:
    job = JobShape("1", ("a",), ("127.0.0.1",), 2, 8, 4, 2)
    assert plan(job, StepRequest()).gpus_per_task == 2
    assert plan(job, StepRequest(gpus_per_task=1)).gpus_per_task == 1


def test_compact_lists() -> None:
    assert compact_ranks([0, 2, 3]) == "0,2-3"
    assert compact_ranks([5, 1, 2, 3, 7]) == "1-3,5,7"
    assert tasks_per_node_text([2, 2, 1]) == "2(x2),1"


def test_job_shape_from_the_agents_environment() -> None:
    job = job_shape(
        {
            "GPUQ_JOB_ID": "9",
            "GPUQ_JOB_NODES": "gpu01,gpu02",
            "GPUQ_NODE_ADDRS": "10.0.0.2,10.0.0.3",
            "GPUQ_TASKS_PER_NODE": "4",
            "GPUQ_GPUS_PER_TASK": "",
            "SLURM_CPUS_ON_NODE": "16",
            "CUDA_VISIBLE_DEVICES": "a,b,c,d",
        }
    )
    assert job.nodes == ("gpu01", "gpu02") and job.addrs == ("10.0.0.2", "10.0.0.3")
    assert (job.tasks_per_node, job.cpus_on_node, job.gpus_on_node) == (4, 16, 4)
    assert job.gpus_per_task is None
    with pytest.raises(InvalidInput, match="one address per node"):
        job_shape({"GPUQ_JOB_NODES": "a,b", "GPUQ_NODE_ADDRS": "10.0.0.2"})


def test_overcommit_still_has_a_ceiling() -> None:
    """--overcommit lifts the job's slots, not every bound: a step of a billion tasks is one
    refusal, not a billion processes."""
    with pytest.raises(InvalidInput, match="tasks per node"):
        plan(shape(2), StepRequest(ntasks=10**9, overcommit=True))
    with pytest.raises(InvalidInput, match="tasks per node"):
        plan(shape(2), StepRequest(ntasks_per_node=10**6, overcommit=True))
    assert sum(plan(shape(2), StepRequest(ntasks=64, overcommit=True)).counts) == 64
