"""srun's options inside a job (gpuq.steps.srun_options): SLURM's spellings read with SLURM's
meaning, what changes nothing here accepted with a warning, anything else refused in one line."""

from __future__ import annotations

import pytest

from gpuq.errors import InvalidInput
from gpuq.steps.srun_options import parse


def test_slurm_spellings() -> None:
    options = parse(
        [
            "-n4",
            "-N",
            "2",
            "--ntasks-per-node=2",
            "-c",
            "8",
            "--gpus-per-task=a100:1",
            "-l",
            "-o",
            "out-%t.log",
            "--kill-on-bad-exit=0",
            "python",
            "-n",
            "train.py",
        ]
    )
    assert (options.ntasks, options.nodes, options.ntasks_per_node) == (4, 2, 2)
    assert (options.cpus_per_task, options.gpus_per_task) == (8, 1)
    assert options.label and options.output == "out-%t.log"
    assert options.kill_on_bad_exit is False
    assert options.command == ["python", "-n", "train.py"]  # the command's own options stay


def test_kill_on_bad_exit_forms() -> None:
    assert parse(["-K", "cmd"]).kill_on_bad_exit is True
    assert parse(["-K0", "cmd"]).kill_on_bad_exit is False
    assert parse(["cmd"]).kill_on_bad_exit is None
    # srun: a separate word is the command; gpuq run: it is the value
    assert parse(["--kill-on-bad-exit", "0", "x"]).command == ["0", "x"]
    gpuq = parse(["--kill-on-bad-exit", "0", "--", "x"], gpuq=True)
    assert gpuq.kill_on_bad_exit is False and gpuq.command == ["x"]
    with pytest.raises(InvalidInput, match="expected 0 or 1"):
        parse(["--kill-on-bad-exit=2", "x"])


def test_options_that_change_nothing_are_accepted_with_a_warning() -> None:
    options = parse(["--mpi=pmix", "--cpu-bind=cores", "--mem=10G", "-u", "--overlap", "cmd"])
    assert len(options.warnings) == 3
    assert any("--cpu-bind=cores is not used" in w for w in options.warnings)
    assert parse(["--mpi=none", "--exclusive", "-J", "name", "cmd"]).warnings == []


def test_unknown_options_and_bad_values_are_one_line_errors() -> None:
    with pytest.raises(InvalidInput, match="not an option srun knows"):
        parse(["--frobnicate", "cmd"])
    with pytest.raises(InvalidInput, match="not an option"):
        parse(["-Z", "cmd"])
    with pytest.raises(InvalidInput, match="whole number"):
        parse(["-n", "four", "cmd"])
    with pytest.raises(InvalidInput, match="needs a value"):
        parse(["-n"])
    with pytest.raises(InvalidInput, match="no command"):
        parse(["-n", "2"])


def test_nodes_range_uses_its_minimum() -> None:
    options = parse(["-N", "2-4", "cmd"])
    assert options.nodes == 2 and options.warnings
