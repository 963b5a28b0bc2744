"""An array task sees its index as a script written for SLURM reads it: SLURM_ARRAY_TASK_ID
and SLURM_ARRAY_JOB_ID beside gpuq's own, and the array's count, lowest and highest index and
step, as sbatch sets them. A job that is no array task has none of them, whatever the
submitter's environment held (a job submitted from inside another array task)."""

from __future__ import annotations

import pytest

from gpuq.agent.jobs.launch_spec import LaunchOrder, NodePolicy, job_environment
from gpuq.domain.array_specs import ArraySpec
from gpuq.domain.model import GpuUnit, JobSpec

UNITS = {"GPU-0": GpuUnit(uuid="GPU-0", index=0, name="fake", memory=1 << 30, pci_bus_id="0:0")}
POLICY = NodePolicy(node="n1", units=UNITS)
# what a submitter inside another array task carries: never the new job's values
INHERITED = {"SLURM_ARRAY_TASK_ID": "99", "SLURM_ARRAY_JOB_ID": "98", "GPUQ_ARRAY_TASK_ID": "97"}


def environment(
    array: ArraySpec | None, array_job_id: int | None, task: int | None
) -> dict[str, str]:
    spec = JobSpec(name="j", script="#!/bin/sh\ntrue\n", workdir="/tmp", env=INHERITED, array=array)
    order = LaunchOrder(
        job_id=42,
        spec=spec,
        gpus=("GPU-0",),
        user="u",
        array_job_id=array_job_id,
        array_task_id=task,
    )
    return job_environment(order, POLICY, None)


@pytest.mark.parametrize(
    ("text", "task", "count", "low", "high", "step"),
    [
        ("0-11", 10, 12, 0, 11, 1),
        ("1-7:2", 5, 4, 1, 7, 2),
        ("5", 5, 1, 5, 5, 1),
        ("1,2,7%2", 7, 3, 1, 7, 1),  # not evenly spaced: no step, and 1 is what scripts assume
    ],
)
def test_an_array_task_sees_sbatchs_variables(
    text: str, task: int, count: int, low: int, high: int, step: int
) -> None:
    env = environment(ArraySpec.parse(text), 40, task)
    assert {k: v for k, v in env.items() if "ARRAY" in k} == {
        "GPUQ_ARRAY_JOB_ID": "40",
        "GPUQ_ARRAY_TASK_ID": str(task),
        "SLURM_ARRAY_JOB_ID": "40",
        "SLURM_ARRAY_TASK_ID": str(task),
        "SLURM_ARRAY_TASK_COUNT": str(count),
        "SLURM_ARRAY_TASK_MIN": str(low),
        "SLURM_ARRAY_TASK_MAX": str(high),
        "SLURM_ARRAY_TASK_STEP": str(step),
    }


def test_a_job_that_is_no_array_task_has_no_array_variables() -> None:
    env = environment(None, None, None)
    assert not [k for k in env if "ARRAY" in k]
