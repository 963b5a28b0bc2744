"""Jobs on several nodes and tasks, asked for SLURM's way: `--nodes`, `--ntasks`,
`--ntasks-per-node`, `--gpus` (in all) / `--gpus-per-node` / `--gpus-per-task`,
`--cpus-per-task`, `--mem` (per node; 0: all of it) / `--mem-per-gpu` / `--mem-per-cpu`,
`--exclusive`; on the command line, in `#GPUQ` and `#SBATCH` lines (written as public
training repositories write them), over the wire and in the store's JSON. Every refusal is
one InvalidInput naming the option, with a line that says what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq.convert import job_from_proto, job_to_proto, spec_from_proto, spec_to_proto
from gpuq.domain.codec import spec_from_dict, spec_to_dict
from gpuq.domain.model import Job, JobSpec, Resources
from gpuq.domain.states import JobState
from gpuq.errors import InvalidInput
from gpuq.submission import build_spec

G = 1 << 30


def spec(**options: Any) -> JobSpec:
    options.setdefault("environ", {})
    options.setdefault("chdir", "/tmp")
    if "script" not in options:
        options.setdefault("wrap", "true")
    return build_spec(**options)


def res(**options: Any) -> Resources:
    return spec(**options).resources


def refused(field: str, **options: Any) -> str:
    """build_spec refuses with one InvalidInput naming `field`; its one-line message."""
    with pytest.raises(InvalidInput) as info:
        spec(**options)
    assert info.value.field == field, info.value
    text = str(info.value)
    assert "\n" not in text and len(text) < 400, text
    return text


def header(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "train.sbatch"
    path.write_text("#!/bin/bash\n" + "".join(f"{line}\n" for line in lines) + "srun python x\n")
    return str(path)


def shape(r: Resources) -> tuple[int, int, int, int, int | None, bool]:
    """(nodes, tasks per node, GPUs per node, CPUs per node, mem per node, explicit tasks)."""
    return (r.nodes, r.tasks_per_node, r.gpus, r.cpus, r.mem, r.explicit_tasks)


# ---- the command line (and gpuq.Client's keywords: the same names) -----------------------


def test_a_job_without_the_new_options_is_one_node_one_task_as_before() -> None:
    assert res(gpus="2", cpus="4", mem="40G") == Resources(gpus=2, cpus=4, mem=40 * G)


def test_gpus_is_the_total_spread_evenly_over_the_nodes() -> None:
    r = res(nodes="2", gpus="8")
    assert (r.nodes, r.gpus, r.total_gpus, r.tasks_per_node, r.explicit_tasks) == (
        2,
        4,
        8,
        1,
        False,
    )
    text = refused("--gpus", nodes="2", gpus="3")
    assert "3 over --nodes 2" in text and "use --gpus-per-node" in text


def test_gpus_per_node_and_per_task() -> None:
    r = res(nodes=2, gpus_per_node="a100:4")
    assert (r.gpus, r.gpu_type, r.total_gpus, r.gpus_per_task) == (4, "a100", 8, None)
    r = res(ntasks="8", gpus_per_task="1")
    assert shape(r) == (1, 8, 8, 8, None, True) and r.gpus_per_task == 1
    r = res(nodes="2", ntasks_per_node="4", gpus_per_task="2", cpus_per_task="6")
    assert shape(r) == (2, 4, 8, 24, None, True) and r.cpus_per_task == 6 and r.ntasks == 8


def test_two_gpu_options_only_when_they_agree() -> None:
    assert res(nodes=2, gpus=8, gpus_per_node=4).gpus == 4
    assert res(ntasks_per_node=4, gpus_per_node="a100:4", gpus_per_task=1).gpu_type == "a100"
    text = refused("--gpus", nodes=2, gpus=8, gpus_per_node=2)
    assert "give one of --gpus (in all), --gpus-per-node and --gpus-per-task" in text
    refused("--gpus", gpus="a100:2", gpus_per_node="h100:2")
    refused("--gpus-per-node", gpus_per_node=2, gpus_per_task=1, ntasks=4)


def test_ntasks_nodes_and_ntasks_per_node() -> None:
    assert shape(res(ntasks=4)) == (1, 4, 0, 4, None, True)
    assert shape(res(nodes=2, ntasks=8)) == (2, 4, 0, 4, None, True)
    assert shape(res(ntasks=8, ntasks_per_node=4)) == (2, 4, 0, 4, None, True)
    assert shape(res(nodes=2, ntasks=8, ntasks_per_node=4)) == (2, 4, 0, 4, None, True)
    assert shape(res(ntasks=8, ntasks_per_node=1)) == (8, 1, 0, 1, None, True)
    assert shape(res(nodes=3)) == (3, 1, 0, 1, None, False)
    assert shape(res(ntasks_per_node=2)) == (1, 2, 0, 2, None, True)
    assert "use --ntasks-per-node" in refused("--ntasks", nodes=2, ntasks=5)
    assert "1 over --nodes 2" in refused("--ntasks", nodes=2, ntasks=1)
    assert "give two of them" in refused("--ntasks", nodes=2, ntasks=8, ntasks_per_node=2)
    refused("--ntasks", ntasks=6, ntasks_per_node=4)
    # as sbatch: --ntasks wins, and --ntasks-per-node is a maximum
    assert shape(res(ntasks=2, ntasks_per_node=8)) == (1, 2, 0, 2, None, True)


def test_cpus_are_per_task() -> None:
    assert res(cpus="10", ntasks_per_node="8").cpus == 80
    assert res(cpus_per_task="10").cpus == 10
    assert res(cpus=4, cpus_per_task=4).cpus == 4
    assert "same option" in refused("--cpus", cpus=4, cpus_per_task=8)
    assert "65536 CPUs" in refused("--cpus-per-task", cpus_per_task=65536, ntasks_per_node=2)


def test_memory_per_node_per_gpu_per_cpu_and_all_of_it() -> None:
    assert res(nodes=2, mem="100G").mem == 100 * G
    for zero in ("0", "0G", " 0 ", 0):
        r = res(mem=zero)
        assert (r.mem, r.mem_all) == (None, True), zero
    assert res(nodes=2, gpus=8, mem_per_gpu="10G").mem == 40 * G
    assert res(ntasks_per_node=4, cpus=2, mem_per_cpu="1G").mem == 8 * G
    assert res(mig="3g.40gb", mem_per_gpu="5G").mem == 5 * G
    assert "needs GPUs" in refused("--mem-per-gpu", mem_per_gpu="10G")
    assert "give one of --mem" in refused("--mem", mem="10G", mem_per_cpu="1G")
    refused("--mem-per-cpu", mem_per_cpu="0")
    refused("--mem-per-cpu", mem_per_cpu=0)
    refused("--mem-per-gpu", mem_per_gpu="-1G", gpus=1)
    assert "1024P" in refused("--mem-per-cpu", mem_per_cpu="1024P", cpus=2)


def test_exclusive() -> None:
    assert res(exclusive=True, nodes=2, gpus_per_node=8).exclusive
    assert not res().exclusive
    refused("--exclusive", exclusive=True, mig="3g.40gb")


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"nodes": "0"}, "--nodes"),
        ({"nodes": "-1"}, "--nodes"),
        ({"nodes": "1025"}, "--nodes"),
        ({"nodes": "9" * 40}, "--nodes"),
        ({"nodes": "\uff12"}, "--nodes"),  # a full-width digit 2
        ({"nodes": "2.0"}, "--nodes"),
        ({"nodes": 0}, "--nodes"),
        ({"nodes": True}, "--nodes"),
        ({"ntasks": "0"}, "--ntasks"),
        ({"ntasks": "4097"}, "--ntasks"),  # on one node
        ({"ntasks_per_node": "0"}, "--ntasks-per-node"),
        ({"ntasks_per_node": "4097"}, "--ntasks-per-node"),
        ({"ntasks": "2050", "ntasks_per_node": "2"}, "--nodes"),  # 1025 nodes
        ({"gpus_per_node": "-1"}, "--gpus-per-node"),
        ({"gpus_per_node": "1025"}, "--gpus-per-node"),
        ({"gpus_per_node": "a100:x"}, "--gpus-per-node"),
        ({"gpus_per_task": "0"}, "--gpus-per-task"),
        ({"gpus_per_task": "513", "ntasks_per_node": "2"}, "--gpus-per-task"),
        ({"gpus": "2049", "nodes": "2"}, "--gpus"),
        ({"cpus_per_task": "0"}, "--cpus-per-task"),
        ({"cpus_per_task": "é"}, "--cpus-per-task"),
        ({"mem_per_gpu": "lots", "gpus": 1}, "--mem-per-gpu"),
        ({"nodes": "2", "mig": "3g.40gb"}, "--nodes"),
    ],
)
def test_values_at_and_past_the_limits_are_one_invalid_input(
    options: dict[str, Any], field: str
) -> None:
    refused(field, **options)


def test_limits_that_are_fine() -> None:
    assert res(nodes="1024").nodes == 1024
    assert res(ntasks_per_node="4096").tasks_per_node == 4096
    assert res(gpus_per_node="1024").gpus == 1024
    assert res(nodes="+2").nodes == 2


def test_a_node_range_is_refused_an_equal_one_taken() -> None:
    text = refused("--nodes", nodes="2-4")
    assert "gpuq starts a job on an exact node count; give one number (2-4 is a range)" in text
    assert res(nodes="2-2").nodes == 2


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "nodes",
                "ntasks",
                "ntasks_per_node",
                "gpus",
                "gpus_per_node",
                "gpus_per_task",
                "cpus",
                "cpus_per_task",
                "mem",
                "mem_per_gpu",
                "mem_per_cpu",
            ]
        ),
        st.integers(-3, 20).map(str)
        | st.integers(-(2**70), 2**70)
        | st.sampled_from(["0", "2-4", "3-3", "a100:2", "8G", "0G", "", "x"]),
        max_size=5,
    ),
    st.booleans(),
)
def test_any_mix_of_layout_options_is_a_spec_or_one_invalid_input(
    options: dict[str, Any], exclusive: bool
) -> None:
    try:
        built = spec(exclusive=exclusive, **options)
    except InvalidInput as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    r = built.resources
    assert r.nodes >= 1 and r.tasks_per_node >= 1 and r.cpus % r.tasks_per_node == 0
    assert spec_from_proto(spec_to_proto(built)) == built
    assert spec_from_dict(spec_to_dict(built), checked=True) == built


# ---- #SBATCH and #GPUQ lines ---------------------------------------------------------------


def test_a_torchrun_header(tmp_path: Path) -> None:
    notes: list[str] = []
    script = header(
        tmp_path,
        "#SBATCH --job-name=llama-pretrain",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=96",
        "#SBATCH --mem=0",
        "#SBATCH --exclusive",
        "#SBATCH --time=48:00:00",
    )
    r = spec(script=script, warnings=notes).resources
    assert notes == []
    assert shape(r) == (2, 1, 8, 96, None, True)
    assert r.mem_all and r.exclusive and r.total_gpus == 16


def test_a_deepspeed_header_with_tasks_per_gpu(tmp_path: Path) -> None:
    notes: list[str] = []
    script = header(
        tmp_path,
        "#SBATCH -N 4",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gres=gpu:8            # per node, as in SLURM",
        "#SBATCH --cpus-per-task=10",
        "#SBATCH --mem-per-gpu=64G",
    )
    r = spec(script=script, warnings=notes).resources
    assert notes == []
    assert shape(r) == (4, 8, 8, 80, 8 * 64 * G, True) and r.ntasks == 32


def test_gres_is_per_node(tmp_path: Path) -> None:
    r = res(script=header(tmp_path, "#SBATCH --nodes=2", "#SBATCH --gres=gpu:a100:8"))
    assert (r.nodes, r.gpus, r.gpu_type, r.total_gpus) == (2, 8, "a100", 16)


def test_a_lightning_header_with_gpus_per_task(tmp_path: Path) -> None:
    script = header(tmp_path, "#SBATCH --ntasks=8", "#SBATCH --gpus-per-task=1", "#SBATCH -c 4")
    r = res(script=script)
    assert shape(r) == (1, 8, 8, 32, None, True) and r.gpus_per_task == 1


def test_an_accelerate_header_with_short_flags(tmp_path: Path) -> None:
    script = header(tmp_path, "#SBATCH -N2 -n 16 --gpus=16 --mem-per-cpu=2G -c8")
    r = res(script=script)
    assert shape(r) == (2, 8, 8, 64, 128 * G, True)


def test_sbatch_exclusive_user_is_taken_as_exclusive_with_a_note(tmp_path: Path) -> None:
    notes: list[str] = []
    r = spec(script=header(tmp_path, "#SBATCH --exclusive=user"), warnings=notes).resources
    assert r.exclusive
    assert notes == [
        "#SBATCH --exclusive=user (line 2): gpuq takes it as --exclusive (whole nodes, "
        "shared with no other job)"
    ]


def test_gpuq_lines_and_the_command_line_override_sbatch_ones(tmp_path: Path) -> None:
    script = header(
        tmp_path, "#SBATCH --nodes=2 --gpus-per-node=8 --mem-per-gpu=10G", "#GPUQ --gpus 4"
    )
    r = res(script=script)  # #GPUQ's --gpus replaces #SBATCH's --gpus-per-node
    assert (r.nodes, r.gpus, r.mem) == (2, 2, 20 * G)
    r = res(script=script, mem="1G", nodes="1", gpus_per_task="2")
    assert (r.nodes, r.gpus, r.mem, r.gpus_per_task) == (1, 2, G, 2)
    r = res(script=header(tmp_path, "#GPUQ -N 3 -n 6 --gpus-per-task a100:1 --exclusive"))
    assert shape(r) == (3, 2, 2, 2, None, True) and r.exclusive and r.gpu_type == "a100"


def test_a_bad_directive_names_its_line(tmp_path: Path) -> None:
    text = refused("--nodes (#SBATCH line 2)", script=header(tmp_path, "#SBATCH --nodes=2-4"))
    assert "(2-4 is a range)" in text
    refused("-G (#SBATCH line 3)", script=header(tmp_path, "#SBATCH -N 2", "#SBATCH -G 3"))
    refused("-n (#GPUQ line 2)", script=header(tmp_path, "#GPUQ -N 2 -n 3"))


# ---- the wire and the store ------------------------------------------------------------------


MULTI = dict(
    nodes="2", ntasks_per_node="4", gpus_per_task="a100:2", cpus="6", mem="0", exclusive=True
)


def test_a_multi_node_spec_round_trips_over_the_wire_and_json() -> None:
    built = spec(**MULTI)
    r = built.resources
    assert (r.nodes, r.tasks_per_node, r.gpus, r.gpus_per_task, r.cpus) == (2, 4, 8, 2, 24)
    assert spec_from_proto(spec_to_proto(built)) == built
    assert spec_from_dict(spec_to_dict(built)) == built
    assert spec_to_dict(built)["resources"] | {} == {
        "gpus": 8,
        "gpu_mem": None,
        "cpus": 24,
        "mem": None,
        "time_limit": None,
        "gpu_type": "a100",
        "nodes": 2,
        "tasks_per_node": 4,
        "gpus_per_task": 2,
        "exclusive": True,
        "mem_all": True,
        "explicit_tasks": True,
    }


def test_a_one_node_spec_is_stored_as_before() -> None:
    assert set(spec_to_dict(spec(gpus="1"))["resources"]) == {
        "gpus",
        "gpu_mem",
        "cpus",
        "mem",
        "time_limit",
    }


def test_json_an_older_gpuq_stored_reads_as_one_node() -> None:
    old = {
        "name": "old",
        "script": "#!/bin/sh\ntrue\n",
        "workdir": "/tmp",
        "resources": {"gpus": 2, "gpu_mem": None, "cpus": 4, "mem": 1024, "time_limit": None},
    }
    for checked in (False, True):
        r = spec_from_dict(old, checked=checked).resources
        assert (r.nodes, r.tasks_per_node, r.gpus_per_task) == (1, 1, None)
        assert not (r.exclusive or r.mem_all or r.explicit_tasks)
        assert r == Resources(gpus=2, cpus=4, mem=1024)


def test_zero_on_the_wire_reads_as_one_node_one_task() -> None:
    message = spec_to_proto(spec(gpus="2"))
    message.resources.nodes = 0
    message.resources.tasks_per_node = 0
    message.resources.gpus_per_task = 0
    r = spec_from_proto(message).resources
    assert (r.nodes, r.tasks_per_node, r.gpus_per_task) == (1, 1, None)


@pytest.mark.parametrize(
    ("field", "value", "refused_as"),
    [
        ("nodes", 2**32 - 1, "--nodes"),
        ("nodes", 1025, "--nodes"),
        ("tasks_per_node", 2**32 - 1, "--ntasks-per-node"),
        ("tasks_per_node", 3, "--cpus-per-task"),  # 2 CPUs over 3 tasks
        ("gpus_per_task", 2**32 - 1, "--gpus-per-task"),
        ("gpus_per_task", 3, "--gpus-per-task"),  # 3 per task != 2 per node
    ],
)
def test_a_malformed_wire_layout_is_one_invalid_input(
    field: str, value: int, refused_as: str
) -> None:
    message = spec_to_proto(spec(gpus="2", cpus="2"))
    setattr(message.resources, field, value)
    with pytest.raises(InvalidInput) as info:
        spec_from_proto(message)
    assert info.value.field == refused_as


def test_the_wire_refuses_mem_all_with_a_size() -> None:
    message = spec_to_proto(spec(mem="1G"))
    message.resources.mem_all = True
    with pytest.raises(InvalidInput):
        spec_from_proto(message)


def test_a_jobs_nodes_cross_the_wire() -> None:
    job = Job(
        id=7,
        spec=spec(**MULTI),
        user="u",
        state=JobState.RUNNING,
        qos="normal",
        priority=1,
        submit_time=1.0,
        node="gpu01",
        nodes=("gpu01", "gpu02"),
    )
    back = job_from_proto(job_to_proto(job))
    assert back.nodes == ("gpu01", "gpu02") and back.node_names == ("gpu01", "gpu02")
    one = Job(
        id=8,
        spec=spec(),
        user="u",
        state=JobState.RUNNING,
        qos="q",
        priority=1,
        submit_time=1.0,
        node="gpu01",
    )
    assert job_from_proto(job_to_proto(one)).nodes == ()
    message = job_to_proto(job)
    message.nodes[:] = ["gpu01\x1b[2J", "x" * 500]  # what a daemon must never make a client show
    cleaned = job_from_proto(message).nodes
    assert "\x1b" not in cleaned[0] and len(cleaned[1]) <= 63
