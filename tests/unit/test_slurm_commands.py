"""SLURM's commands refuse what gpuq does not support in one line, before any connection,
and the shim writer never replaces a file that is not its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuq.errors import InvalidInput
from gpuq.slurm.commands import main
from gpuq.slurm.job_commands import submit_options
from gpuq.slurm.shim_files import is_shim, shim_text, write_shims


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["sbatch", "--foo", "x.sh"], "sbatch: --foo is not supported by gpuq's sbatch"),
        (
            ["sbatch", "--test-only", "x.sh"],
            "sbatch: --test-only is not supported by gpuq's sbatch",
        ),
        (["squeue", "-Z"], "squeue: -Z is not supported by gpuq's squeue"),
        (
            ["squeue", "-o", "%i %Z"],
            "squeue: error: Invalid format specification: %Z is not supported by gpuq",
        ),
        (["sacct", "--format=JobID,Nope"], "sacct: error: Invalid field requested: Nope"),
        (["sinfo", "--summarize"], "sinfo: --summarize is not supported by gpuq's sinfo"),
        (["scancel", "--signal=USR1", "3"], "scancel: --signal is not supported by gpuq's scancel"),
        (["scancel"], "scancel: error: No job identification provided"),
        (
            ["scontrol", "show", "partition"],
            "scontrol: show partition is not supported by gpuq's scontrol",
        ),
        (
            ["scontrol", "update", "JobId=3", "Licenses=x"],
            "scontrol: update Licenses is not supported by gpuq's scontrol",
        ),
        (
            ["salloc", "hostname"],
            "salloc: a command is not supported by gpuq's salloc: it gives a shell on the node "
            "(use srun CMD for a command)",
        ),
        (["sbatch", "--time"], "sbatch: error: option --time requires an argument"),
        (
            ["sbatch", "--test-only", "x.sh"],
            "sbatch: --test-only is not supported by gpuq's sbatch",
        ),
        (
            ["sbatch", "-J", "a\tb", "--wrap", "true"],
            "sbatch: error: invalid -J 'a\\tb': contains the control character '\\t'",
        ),
        (
            ["sbatch", "--workdir=/tmp", "--wrap", "true"],
            "sbatch: --workdir is not supported by gpuq's sbatch",
        ),
    ],
)
def test_refusals_are_one_line_and_exit_1(
    argv: list[str],
    line: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("GPUQ_HOME", str(tmp_path))  # no coordinator there: nothing is reached
    monkeypatch.delenv("GPUQ_JOB_ID", raising=False)
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", line + "\n")


def test_sbatchs_command_line_values_stay_whole() -> None:
    # getopt has split them already: `-J =x` names the job `=x` (as sbatch does), and an
    # empty value is a value (`-p ''` is gpuq submit's `-p ''`), never "needs a value"
    submit, spelled = submit_options(
        "sbatch", [("-J", "=x"), ("-p", ""), ("--chdir", ""), ("-t", "-1"), ("-H", "")]
    )
    assert submit == {"name": "=x", "partition": "", "chdir": "", "hold": True}
    assert spelled == {"name": "-J", "partition": "-p", "chdir": "--chdir", "hold": "-H"}


def test_no_coordinator_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUQ_HOME", str(tmp_path))
    assert main(["squeue", "-h"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("squeue: error: no gpuq coordinator") and err.count("\n") == 1


def test_shims_never_replace_another_file_or_link(tmp_path: Path) -> None:
    (tmp_path / "squeue").symlink_to("/bin/true")
    with pytest.raises(InvalidInput, match="not one of gpuq's shims"):
        write_shims(tmp_path, "/usr/bin/python3")
    assert not (tmp_path / "sbatch").exists()  # refused before writing any
    (tmp_path / "squeue").unlink()
    (tmp_path / "squeue").write_text(shim_text("squeue", "/old/python"))
    write_shims(tmp_path, "/new/python")
    assert is_shim(tmp_path / "squeue")
    assert "exec /new/python -m gpuq.slurm.commands squeue" in (tmp_path / "squeue").read_text()
