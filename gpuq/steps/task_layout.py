"""Where a step's tasks go and what each one sees: pure functions, no I/O.

SLURM's default layout inside an allocation, which scripts written for SLURM rely on: the
number of tasks on each node is found by dealing tasks round-robin over the step's nodes (no
node over its limit), then ranks are handed out node by node ("block": ranks 0..k-1 on the
first node). So `-n 4` on two nodes is 2 + 2, `-n 5` is 3 + 2, and rank r's neighbours are on
its own node, which is what NCCL's topology and LOCAL_RANK arithmetic expect.

The per-task environment is computed here for every task (gpuq.steps.srun_main sends it to the
node that runs the task); only the GPU binding is done on the task's own node
(bind_gpus), because only that node knows its CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuq.domain.array_specs import format_runs
from gpuq.domain.model import MAX_TASKS_PER_NODE
from gpuq.domain.node_constraints import compress_nodes
from gpuq.errors import InvalidInput


@dataclass(frozen=True)
class JobShape:
    """What the agent told the batch script about its allocation (gpuq.steps.job_env)."""

    job_id: str
    nodes: tuple[str, ...]  # leader first
    addrs: tuple[str, ...]  # same order
    tasks_per_node: int  # the job's --ntasks-per-node (1 unless asked)
    cpus_on_node: int  # per node
    gpus_on_node: int  # per node
    gpus_per_task: int | None  # the job's --gpus-per-task


@dataclass(frozen=True)
class StepRequest:
    """The layout options of one srun / `gpuq run` inside a job (None: not given)."""

    ntasks: int | None = None
    nodes: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    gpus_per_task: int | None = None
    overcommit: bool = False


@dataclass(frozen=True)
class Task:
    rank: int  # SLURM_PROCID
    local_id: int  # SLURM_LOCALID
    node_id: int  # index into the step's nodes (= the job's node index: steps use a prefix)


@dataclass(frozen=True)
class Layout:
    nodes: tuple[str, ...]  # the step's nodes, a prefix of the job's
    counts: tuple[int, ...]  # tasks on each of them
    tasks: tuple[Task, ...]  # by rank
    cpus_per_task: int
    gpus_per_task: int | None

    @property
    def ntasks(self) -> int:
        return len(self.tasks)

    def on_node(self, node_id: int) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if t.node_id == node_id)


def plan(job: JobShape, step: StepRequest) -> Layout:
    """The step's layout, or InvalidInput (one line) for what SLURM would refuse."""
    for flag, value in (
        ("--ntasks", step.ntasks),
        ("--nodes", step.nodes),
        ("--ntasks-per-node", step.ntasks_per_node),
        ("--cpus-per-task", step.cpus_per_task),
    ):
        if value is not None and value < 1:
            raise InvalidInput(flag, value, "must be at least 1")
    if step.gpus_per_task is not None and step.gpus_per_task < 0:
        raise InvalidInput("--gpus-per-task", step.gpus_per_task, "must be at least 0")
    job_nodes = len(job.nodes)
    if step.nodes is not None and step.nodes > job_nodes:
        raise InvalidInput(
            "--nodes", step.nodes, f"the job has {job_nodes} node{'s' * (job_nodes != 1)}"
        )
    used = step.nodes if step.nodes is not None else job_nodes
    if step.ntasks is not None:
        used = min(used, step.ntasks)  # SLURM: "can't run 1 processes on 2 nodes": fewer nodes
        if step.ntasks_per_node is not None and step.nodes is None:
            used = min(used, -(-step.ntasks // step.ntasks_per_node))
    if step.ntasks is not None:
        ntasks = step.ntasks
    elif step.ntasks_per_node is not None:
        ntasks = step.ntasks_per_node * used
    else:
        ntasks = job.tasks_per_node * used
    if ntasks > used * MAX_TASKS_PER_NODE or (step.ntasks_per_node or 0) > MAX_TASKS_PER_NODE:
        raise InvalidInput(
            "--ntasks",
            ntasks,
            f"at most {MAX_TASKS_PER_NODE} tasks per node, even with --overcommit",
        )
    # a node's task slots: the job's tasks there, or as many as its CPUs hold (SLURM's limit)
    capacity = max(job.tasks_per_node, job.cpus_on_node // (step.cpus_per_task or 1))
    limit = step.ntasks_per_node if step.ntasks_per_node is not None else capacity
    if not step.overcommit:
        if limit > capacity:
            raise InvalidInput(
                "--ntasks-per-node",
                limit,
                f"each node of the job has room for {capacity} tasks (--overcommit allows more)",
            )
        if ntasks > used * limit:
            raise InvalidInput(
                "--ntasks",
                ntasks,
                f"{used} node{'s' * (used != 1)} of the job hold {used * limit} tasks "
                "(--overcommit allows more)",
            )
    elif step.ntasks_per_node is None:
        limit = max(limit, -(-ntasks // used))
    elif ntasks > used * limit:
        raise InvalidInput(
            "--ntasks",
            ntasks,
            f"more than {used} nodes x {limit} tasks per node (--ntasks-per-node)",
        )
    counts = deal(ntasks, used, limit)
    tasks: list[Task] = []
    for node_id, count in enumerate(counts):
        for local in range(count):
            tasks.append(Task(len(tasks), local, node_id))
    # unless asked, a node's CPUs are shared by its tasks (the job's own --cpus-per-task when
    # the step has the job's shape)
    cpus_per_task = step.cpus_per_task or max(1, job.cpus_on_node // max(counts))
    gpus = step.gpus_per_task if step.gpus_per_task is not None else job.gpus_per_task
    if gpus and max(counts) * gpus > job.gpus_on_node:
        raise InvalidInput(
            "--gpus-per-task",
            gpus,
            f"{max(counts)} tasks on a node need {max(counts) * gpus} GPUs; "
            f"each node of the job has {job.gpus_on_node}",
        )
    return Layout(job.nodes[:used], counts, tuple(tasks), cpus_per_task, gpus or None)


def deal(ntasks: int, nodes: int, limit: int) -> tuple[int, ...]:
    """Tasks per node, dealt round-robin with at most `limit` on a node (SLURM's block layout
    counts them this way, then numbers them node by node)."""
    counts = [0] * nodes
    left = ntasks
    while left:
        for i in range(nodes):
            if left and counts[i] < limit:
                counts[i] += 1
                left -= 1
    return tuple(counts)


def tasks_per_node_text(counts: Sequence[int]) -> str:
    """SLURM_TASKS_PER_NODE's form: `2(x3),1`."""
    parts: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        parts.append(str(counts[i]) if j - i == 1 else f"{counts[i]}(x{j - i})")
        i = j
    return ",".join(parts)


def compact_ranks(ranks: Sequence[int]) -> str:
    """`0,2-3`: a list of task ids as SLURM and the end report write it."""
    return format_runs(ranks)


def task_env(job: JobShape, layout: Layout, task: Task, step_id: int) -> dict[str, str]:
    """The variables srun sets for one task, over the job's environment (README_ENV.md)."""
    step_nodes = compress_nodes(layout.nodes)
    on_node = layout.counts[task.node_id]
    env = {
        "SLURM_PROCID": str(task.rank),
        "SLURM_LOCALID": str(task.local_id),
        "SLURM_NODEID": str(task.node_id),
        "SLURM_NTASKS": str(layout.ntasks),
        "SLURM_NPROCS": str(layout.ntasks),
        "SLURM_NTASKS_PER_NODE": str(on_node),
        "SLURM_TASKS_PER_NODE": tasks_per_node_text(layout.counts),
        "SLURM_STEP_ID": str(step_id),
        "SLURM_STEPID": str(step_id),
        "SLURM_STEP_NUM_TASKS": str(layout.ntasks),
        "SLURM_STEP_NUM_NODES": str(len(layout.nodes)),
        "SLURM_STEP_NODELIST": step_nodes,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node_text(layout.counts),
        "SLURM_NNODES": str(len(layout.nodes)),
        "SLURM_NODELIST": step_nodes,
        "SLURMD_NODENAME": layout.nodes[task.node_id],
        "SLURM_CPUS_PER_TASK": str(layout.cpus_per_task),
        "OMP_NUM_THREADS": str(layout.cpus_per_task),
        "RANK": str(task.rank),
        "LOCAL_RANK": str(task.local_id),
        "WORLD_SIZE": str(layout.ntasks),
        "LOCAL_WORLD_SIZE": str(on_node),
        "NODE_RANK": str(task.node_id),
        "GROUP_RANK": str(task.node_id),
        "GPUQ_NODE_INDEX": str(task.node_id),
    }
    if layout.gpus_per_task:
        env["SLURM_GPUS_PER_TASK"] = str(layout.gpus_per_task)
    return env


def bind_gpus(visible: str, local_id: int, gpus_per_task: int | None) -> str | None:
    """A task's CUDA_VISIBLE_DEVICES: its slice of the node's list with --gpus-per-task, else
    None (the task sees every GPU of the node, as the job does)."""
    if not gpus_per_task:
        return None
    units = [u for u in visible.split(",") if u]
    share = units[local_id * gpus_per_task : (local_id + 1) * gpus_per_task]
    if len(share) < gpus_per_task:
        raise InvalidInput(
            "--gpus-per-task",
            gpus_per_task,
            f"local task {local_id} needs GPUs {local_id * gpus_per_task}-"
            f"{(local_id + 1) * gpus_per_task - 1} of this node's {len(units)}",
        )
    return ",".join(share)


def job_shape(environ: Mapping[str, str]) -> JobShape:
    """The allocation as the agent describes it in the job's environment (see the brief)."""
    job_id = environ.get("GPUQ_JOB_ID", "")
    nodes = tuple(n for n in environ.get("GPUQ_JOB_NODES", "").split(",") if n)
    if not nodes:
        nodes = (environ.get("GPUQ_NODE") or environ.get("SLURMD_NODENAME") or "localhost",)
    addrs = tuple(a for a in environ.get("GPUQ_NODE_ADDRS", "").split(",") if a)
    if len(addrs) != len(nodes):
        if len(nodes) > 1:
            raise InvalidInput(
                "GPUQ_NODE_ADDRS", environ.get("GPUQ_NODE_ADDRS", ""), "one address per node"
            )
        addrs = ("127.0.0.1",)
    visible = [u for u in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if u]
    gpus_per_task = _int(environ, "GPUQ_GPUS_PER_TASK", 0) or None
    return JobShape(
        job_id=job_id,
        nodes=nodes,
        addrs=addrs,
        tasks_per_node=max(1, _int(environ, "GPUQ_TASKS_PER_NODE", 1)),
        cpus_on_node=max(1, _int(environ, "SLURM_CPUS_ON_NODE", os_cpus())),
        gpus_on_node=_int(environ, "SLURM_GPUS_ON_NODE", len(visible)),
        gpus_per_task=gpus_per_task,
    )


def os_cpus() -> int:
    return len(os.sched_getaffinity(0))


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise InvalidInput(name, text, "expected a whole number") from None
