"""What a job knows about where it runs: its nodes, their addresses, its MASTER_ADDR and
MASTER_PORT, and SLURM's variables, so scripts written for SLURM and torch.distributed run
unchanged (README "Jobs on several nodes" says which variable is set where).

Pure: the agent's launch builds this from the coordinator's JobLaunch. Every job gets it, a
one-node job too (SLURM_JOB_NODELIST is then its node). What differs per task (SLURM_PROCID,
RANK, LOCAL_RANK, WORLD_SIZE...) is srun's business (gpuq.steps), not the batch script's: set
there, Lightning would take the script for one torchelastic process.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass

from gpuq.domain.model import JobSpec
from gpuq.domain.node_constraints import NODE_NAME_RE, compress_nodes
from gpuq.errors import InvalidInput

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_STEP_KEY_RE = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class Gang:
    """Where one start of a job runs, as the coordinator sent it (JobLaunch)."""

    nodes: tuple[str, ...]  # every node, the first (where the script runs) first
    addresses: tuple[str, ...]  # each node's address, in the same order
    index: int  # this node's place in `nodes`
    master_port: int  # MASTER_PORT; the step workers listen one above
    step_key: str  # the start's secret for srun and its step workers (hex)

    def __post_init__(self) -> None:
        if not self.nodes or len(self.addresses) != len(self.nodes):
            raise InvalidInput("launch: nodes", len(self.nodes), "one address per node")
        if not 0 <= self.index < len(self.nodes):
            raise InvalidInput("launch: node_index", self.index, "not one of the job's nodes")
        for node in self.nodes:
            if not NODE_NAME_RE.fullmatch(node):
                raise InvalidInput("launch: nodes", node[:80], "not a node name")
        for address in self.addresses:
            try:
                ipaddress.ip_address(address)
            except ValueError:
                raise InvalidInput("launch: node_addrs", address[:80], "not an IP") from None
        if not 0 <= self.master_port <= 65534:
            raise InvalidInput("launch: master_port", self.master_port, "not a port")
        if self.step_key and not _STEP_KEY_RE.fullmatch(self.step_key):
            raise InvalidInput("launch: step_key", "(hidden)", "expected 64 hex digits")

    @property
    def leads(self) -> bool:
        """This node runs the batch script (the others run step workers)."""
        return self.index == 0

    @property
    def step_port(self) -> int:
        return self.master_port + 1 if self.master_port else 0


def gang_environment(
    job_id: int, spec: JobSpec, gpus_on_node: int, gang: Gang, python: str
) -> dict[str, str]:
    """gpuq's, torch.distributed's and SLURM's variables for the job on this node."""
    res = spec.resources
    nodelist = compress_nodes(gang.nodes)
    env = {
        "GPUQ_JOB_NODES": ",".join(gang.nodes),
        "GPUQ_NODE_ADDRS": ",".join(gang.addresses),
        "GPUQ_NODE_INDEX": str(gang.index),
        "GPUQ_TASKS_PER_NODE": str(res.tasks_per_node),
        "GPUQ_GPUS_PER_TASK": str(res.gpus_per_task or ""),
        "GPUQ_CPUS_PER_TASK": str(res.cpus_per_task),
        "GPUQ_PYTHON": python,
        # `gpuq` in a job runs in process: a per-user CLI helper started outside the job
        # would run `gpuq run`'s tasks outside its cgroup and device rules
        "GPUQ_CLI_HELPER": "off",
        "MASTER_ADDR": gang.addresses[0],
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOBID": str(job_id),
        "SLURM_JOB_NAME": spec.name,
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist,
        "SLURM_NNODES": str(len(gang.nodes)),
        "SLURM_JOB_NUM_NODES": str(len(gang.nodes)),
        "SLURM_SUBMIT_DIR": spec.workdir,
        "SLURM_GPUS_ON_NODE": str(gpus_on_node),
        "SLURM_CPUS_ON_NODE": str(res.cpus),
        "SLURM_JOB_CPUS_PER_NODE": str(res.cpus),
        "SLURM_NODEID": str(gang.index),
        "SLURMD_NODENAME": gang.nodes[gang.index],
        "SLURM_CPUS_PER_TASK": str(res.cpus_per_task),
    }
    if gang.master_port:
        env["MASTER_PORT"] = str(gang.master_port)
        env["GPUQ_STEP_PORT"] = str(gang.step_port)
    if gang.step_key:
        env["GPUQ_STEP_KEY"] = gang.step_key
    if res.explicit_tasks:
        env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(res.ntasks)
        env["SLURM_NTASKS_PER_NODE"] = str(res.tasks_per_node)
        env["SLURM_TASKS_PER_NODE"] = f"{res.tasks_per_node}(x{len(gang.nodes)})"
    if res.gpus_per_task:
        env["SLURM_GPUS_PER_TASK"] = str(res.gpus_per_task)
    if gpus_on_node:
        env["SLURM_GPUS_PER_NODE"] = str(gpus_on_node)
    if res.mem:
        env["SLURM_MEM_PER_NODE"] = str(res.mem >> 20)  # sbatch's unit: MiB
    return env


def step_worker_script(python: str) -> str:
    """What another node of a multi-node job runs instead of the batch script."""
    return f"#!/bin/sh\nexec {shlex.quote(python or 'python3')} -m gpuq.steps.step_worker\n"
