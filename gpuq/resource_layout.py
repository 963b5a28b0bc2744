"""How many nodes, tasks, GPUs, CPUs and bytes a submission asks for, read SLURM's way.

sbatch's options say one request in several units: `--gpus` (in all, spread evenly over the
nodes), `--gpus-per-node` (`--gres=gpu:N` too) or `--gpus-per-task`; `--cpus-per-task`;
`--mem` (per node; 0: all of it), `--mem-per-gpu` or `--mem-per-cpu`; `--nodes`, `--ntasks`
and `--ntasks-per-node`. A gpuq job keeps one shape, per node (gpuq.domain.model.Resources):
this module turns the options (text as typed, or ints from gpuq.Client) into it, refusing with
one InvalidInput what SLURM refuses or gpuq cannot do (an uneven spread, a node range), and
never raising anything else: every number is bounded before any arithmetic.
"""

from __future__ import annotations

import re
from typing import Any

from gpuq.domain.gpu_types import parse_gpu_request
from gpuq.domain.limits import MAX_MEM, brief, check_range
from gpuq.domain.model import MAX_NODES, MAX_TASKS_PER_NODE
from gpuq.domain.units import format_size, parse_size
from gpuq.errors import InvalidInput

MAX_GPUS_PER_NODE = 1024  # as Resources bounds --gpus
MAX_CPUS_PER_NODE = 65536  # as Resources bounds --cpus
NODE_RANGE = re.compile(r"\s*\+?([0-9]{1,9})\s*-\s*\+?([0-9]{1,9})\s*")
ALL_MEMORY = re.compile(r"\s*0+\s*[KMGTP]?\s*", re.IGNORECASE)  # sbatch's --mem=0 (0G too)
ONE_GPU_OPTION = "give one of --gpus (in all), --gpus-per-node and --gpus-per-task"


def whole_number(values: dict[str, Any], key: str, flag: str, default: int) -> int:
    """An option's whole number: an int as given, or text of ASCII digits (a sign allowed);
    InvalidInput for anything else, or more than 18 digits. Ranges are the caller's."""
    value = values.get(key)
    if value is None or value == "":
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise InvalidInput(flag, str(value)[:60], "expected a whole number")
    if len(text.lstrip("+-").lstrip("0")) > 18:
        raise InvalidInput(flag, text[:60], "is far out of range")
    return int(text)


def size_option(values: dict[str, Any], key: str, flag: str) -> int | None:
    """An option's size in bytes (`40G`, a bare number is MB), or an int as given."""
    value = values.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return parse_size(str(value), flag)


def layout(values: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """Resources' fields for the job's shape: nodes, tasks_per_node, explicit_tasks, gpus,
    gpu_type, gpus_per_task, cpus, mem, mem_all and exclusive (gpus, cpus, mem per node)."""
    nodes, tasks_per_node, explicit = _tasks(values)
    gpu_type, gpus, gpus_per_task = _gpus(values, nodes, tasks_per_node, notes)
    cpus = _cpus(values, tasks_per_node)
    mem, mem_all = _mem(values, gpus, cpus)
    return {
        "nodes": nodes,
        "tasks_per_node": tasks_per_node,
        "explicit_tasks": explicit,
        "gpus": gpus,
        "gpu_type": gpu_type,
        "gpus_per_task": gpus_per_task,
        "cpus": cpus,
        "mem": mem,
        "mem_all": mem_all,
        "exclusive": bool(values.get("exclusive")),
    }


def _count(values: dict[str, Any], key: str, flag: str, high: int) -> int | None:
    """A count from 1 to `high`; None when not given."""
    if values.get(key) is None or values.get(key) == "":
        return None
    value = values[key]
    if key == "nodes" and isinstance(value, str) and (span := NODE_RANGE.fullmatch(value)):
        low, top = int(span.group(1)), int(span.group(2))
        if low != top:
            raise InvalidInput(
                flag,
                brief(value.strip()),
                f"gpuq starts a job on an exact node count; give one number "
                f"({low}-{top} is a range)",
            )
        value = low
    count = whole_number({key: value}, key, flag, 0)
    check_range(flag, count, 1, high)
    return count


def _tasks(values: dict[str, Any]) -> tuple[int, int, bool]:
    """(nodes, tasks per node, whether tasks were asked for), as sbatch reads --nodes,
    --ntasks and --ntasks-per-node; gpuq runs the same number of tasks on every node."""
    nodes = _count(values, "nodes", "--nodes", MAX_NODES)
    ntasks = _count(values, "ntasks", "--ntasks", MAX_NODES * MAX_TASKS_PER_NODE)
    per_node = _count(values, "ntasks_per_node", "--ntasks-per-node", MAX_TASKS_PER_NODE)
    explicit = ntasks is not None or per_node is not None
    if ntasks is None:
        return nodes or 1, per_node or 1, explicit
    if nodes is not None:
        if per_node is not None and ntasks != nodes * per_node:
            raise InvalidInput(
                "--ntasks",
                f"{ntasks} with --nodes {nodes} and --ntasks-per-node {per_node}",
                f"{nodes} nodes x {per_node} tasks is {nodes * per_node} tasks; give two of them",
            )
        if ntasks % nodes:
            raise InvalidInput(
                "--ntasks",
                f"{ntasks} over --nodes {nodes}",
                "gpuq runs the same number of tasks on each node; use --ntasks-per-node",
            )
        return nodes, ntasks // nodes, explicit
    if per_node is not None:
        if ntasks < per_node:  # sbatch: --ntasks wins, --ntasks-per-node is then a maximum
            return 1, ntasks, explicit
        if ntasks % per_node:
            raise InvalidInput(
                "--ntasks",
                f"{ntasks} with --ntasks-per-node {per_node}",
                "gpuq runs the same number of tasks on each node; give --nodes and "
                "--ntasks-per-node",
            )
        nodes = ntasks // per_node
        check_range("--nodes", nodes, 1, MAX_NODES)
        return nodes, per_node, explicit
    check_range(
        "--ntasks",
        ntasks,
        1,
        MAX_TASKS_PER_NODE,
        f"at most {MAX_TASKS_PER_NODE} tasks on one node; give --nodes too",
    )
    return 1, ntasks, explicit


def _gpu_request(
    values: dict[str, Any], key: str, flag: str, notes: list[str]
) -> tuple[str | None, int] | None:
    """`N`, `TYPE:N` or `TYPE` (one) (or an int): (type, count); None when not given. A type
    typed with more than the model (a100-80gb) is noted: the model is what is matched; memory
    is --gpu-mem."""
    value = values.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return None, value
    text = str(value)
    if ":" not in text and not re.match(r"\s*[A-Za-z]", text):
        return None, whole_number(values, key, flag, 0)
    gpu_type, count = parse_gpu_request(text, flag)
    typed = (text.rpartition(":")[0] if ":" in text else text).strip().lower()
    if gpu_type is not None and typed != gpu_type:
        notes.append(
            f"{flag} {brief(text)}: the GPU type is {gpu_type} (any {gpu_type}, whatever its "
            "board or memory; ask for memory with --gpu-mem)"
        )
    return gpu_type, count


def _gpus(
    values: dict[str, Any], nodes: int, tasks_per_node: int, notes: list[str]
) -> tuple[str | None, int, int | None]:
    """(type, GPUs per node, GPUs per task or None) from whichever of --gpus (in all, spread
    evenly), --gpus-per-node and --gpus-per-task was given; two only when they agree."""
    asked: list[tuple[str, str | None, int, int]] = []  # (flag, type, count, per node)
    per_task: int | None = None
    total = _gpu_request(values, "gpus", "--gpus", notes)
    if total is not None:
        check_range("--gpus", total[1], 0, MAX_GPUS_PER_NODE * nodes)
        if total[1] % nodes:
            raise InvalidInput(
                "--gpus",
                f"{total[1]} over --nodes {nodes}",
                "gpuq spreads GPUs evenly over the nodes; use --gpus-per-node",
            )
        asked.append(("--gpus", total[0], total[1], total[1] // nodes))
    node = _gpu_request(values, "gpus_per_node", "--gpus-per-node", notes)
    if node is not None:
        check_range("--gpus-per-node", node[1], 0, MAX_GPUS_PER_NODE)
        asked.append(("--gpus-per-node", node[0], node[1], node[1]))
    task = _gpu_request(values, "gpus_per_task", "--gpus-per-task", notes)
    if task is not None:
        per_task = task[1]
        check_range("--gpus-per-task", per_task, 1, MAX_GPUS_PER_NODE)
        if per_task * tasks_per_node > MAX_GPUS_PER_NODE:
            raise InvalidInput(
                "--gpus-per-task",
                f"{per_task} x {tasks_per_node} tasks per node",
                f"more than {MAX_GPUS_PER_NODE} GPUs on a node",
            )
        asked.append(("--gpus-per-task", task[0], per_task, per_task * tasks_per_node))
    if not asked:
        return None, 0, None
    first = asked[0]
    for other in asked[1:]:
        if other[3] != first[3] or (None not in (first[1], other[1]) and first[1] != other[1]):
            raise InvalidInput(
                first[0],
                f"{_shown(first)} with {other[0]} {_shown(other)}",
                f"they disagree; {ONE_GPU_OPTION}",
            )
    gpu_type = next((item[1] for item in asked if item[1] is not None), None)
    return gpu_type, first[3], per_task


def _shown(request: tuple[str, str | None, int, int]) -> str:
    return f"{request[1]}:{request[2]}" if request[1] else str(request[2])


def _cpus(values: dict[str, Any], tasks_per_node: int) -> int:
    """CPUs per node: --cpus (or --cpus-per-task, the same) for each of the node's tasks."""
    per_task = 1
    given: list[tuple[str, int]] = []
    for key, flag in (("cpus", "--cpus"), ("cpus_per_task", "--cpus-per-task")):
        if values.get(key) is not None and values.get(key) != "":
            count = whole_number(values, key, flag, 1)
            check_range(flag, count, 1, MAX_CPUS_PER_NODE)
            given.append((flag, count))
    if len(given) == 2 and given[0][1] != given[1][1]:
        raise InvalidInput(
            "--cpus",
            f"{given[0][1]} with --cpus-per-task {given[1][1]}",
            "they are the same option (CPUs per task); give one",
        )
    if given:
        flag, per_task = given[0]
        if per_task * tasks_per_node > MAX_CPUS_PER_NODE:
            raise InvalidInput(
                flag,
                f"{per_task} x {tasks_per_node} tasks per node",
                f"more than {MAX_CPUS_PER_NODE} CPUs on a node",
            )
    return per_task * tasks_per_node


def _mem(values: dict[str, Any], gpus: int, cpus: int) -> tuple[int | None, bool]:
    """(memory per node or None, all of each node's): --mem (0: all), --mem-per-gpu or
    --mem-per-cpu, at most one of them."""
    given = [
        (key, flag)
        for key, flag in (
            ("mem", "--mem"),
            ("mem_per_gpu", "--mem-per-gpu"),
            ("mem_per_cpu", "--mem-per-cpu"),
        )
        if values.get(key) is not None and values.get(key) != ""
    ]
    if not given:
        return None, False
    if len(given) > 1:
        raise InvalidInput(
            given[0][1],
            f"{brief(str(values[given[0][0]]))} with {given[1][1]}",
            "give one of --mem (per node), --mem-per-gpu and --mem-per-cpu",
        )
    key, flag = given[0]
    value = values[key]
    if key == "mem":
        if value == 0 or (isinstance(value, str) and ALL_MEMORY.fullmatch(value)):
            return None, True
        return size_option(values, key, flag), False
    size = size_option(values, key, flag)
    assert size is not None
    check_range(flag, size, 1, MAX_MEM, "must be from 1 byte to 1024P")
    units = gpus if key == "mem_per_gpu" else cpus
    if key == "mem_per_gpu" and (values.get("mig") or values.get("gpu_share")):
        units = max(units, 1)  # a MIG slice or an MPS share is one GPU
    if units == 0:
        raise InvalidInput(
            flag,
            brief(str(value)),
            "needs GPUs (--gpus, --gpus-per-node or --gpus-per-task); or give --mem",
        )
    if size * units > MAX_MEM:
        raise InvalidInput(flag, f"{format_size(size)} x {units}", "more than 1024P on a node")
    return size * units, False
