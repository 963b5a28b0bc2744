"""Output with bounds, the agent's rules: a job's output files over its max_output, and output
files that vanish while the job runs (gpuq.agent.output_watch); max_output in the config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuq.agent.jobs.launch_spec import LaunchSpec
from gpuq.agent.output_watch import Gone, OutputWatch, over_limit, vanished
from gpuq.config.loading import load_settings
from gpuq.coordinator.workload.job_samples import output_gone_note
from gpuq.errors import ConfigError

MIB = 1 << 20


def test_no_limit_or_under_it_ends_nothing() -> None:
    assert over_limit({"gpuq-1.out": 10 * MIB}, None) is None
    assert over_limit({"gpuq-1.out": MIB}, MIB) is None  # at the limit is not over it


def test_one_file_over_the_limit_is_named_with_its_size() -> None:
    reason = over_limit({"gpuq-12.out": 10 * 1024 * MIB + 205 * MIB}, 10 * 1024 * MIB)
    assert reason == "output limit: gpuq-12.out is 10.2G, over [agent] max_output 10G"


def test_two_files_count_together_and_the_source_is_named() -> None:
    sizes = {"a.err": MIB, "a.out": 2 * MIB}
    reason = over_limit(sizes, 2 * MIB, "the max_output of its QOS")
    assert reason == "output limit: a.out and a.err hold 3M, over the max_output of its QOS 2M"


def test_a_file_still_there_has_not_vanished(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_text("x")
    info = os.lstat(path)
    assert vanished("out", (info.st_dev, info.st_ino), info, True) is None


def test_a_removed_file_its_folder_or_a_new_file_in_its_place_has_vanished(
    tmp_path: Path,
) -> None:
    path = tmp_path / "out"
    path.write_text("x")
    first = os.lstat(path)
    seen = (first.st_dev, first.st_ino)
    assert vanished("out", seen, None, True) == Gone("out")
    assert vanished("out", seen, None, False) == Gone("out", folder=True)
    keep = tmp_path / "keep"  # holds the old inode, so the new file's cannot reuse it
    os.link(path, keep)
    path.unlink()
    path.write_text("new")
    assert vanished("out", seen, os.lstat(path), True) == Gone("out", replaced=True)


def _spec(folder: Path, out: str, err: str, limit: int | None) -> LaunchSpec:
    return LaunchSpec(
        job_id=7,
        script="",
        args=(),
        env={},
        cwd=str(folder),
        stdout_path=out,
        stderr_path=err,
        attempt=2,
        kill_grace=3.0,
        max_output=limit,
    )


def test_the_watch_stops_a_job_over_its_limit_once(tmp_path: Path) -> None:
    (tmp_path / "job.out").write_bytes(b"x" * 100)
    watch = OutputWatch(lambda job_id: _spec(tmp_path, "job.out", "job.out", 150), 150)
    assert watch.check([7]).over == []
    (tmp_path / "job.out").write_bytes(b"x" * 200)
    found = watch.check([7])
    assert found.over == [(7, "output limit: job.out is 200B, over [agent] max_output 150B", 3.0)]
    assert watch.check([7]).over == []  # stopped once: not again


def test_the_watch_reports_a_vanished_file_while_the_job_runs(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "job.out").write_text("x")
    (folder / "job.err").write_text("y")
    watch = OutputWatch(lambda job_id: _spec(tmp_path, "logs/job.out", "logs/job.err", None))
    assert watch.check([7]).gone == []
    (folder / "job.err").unlink()
    gone = watch.check([7]).gone
    assert [(g.job_id, g.attempt, g.path, g.folder) for g in gone] == [
        (7, 2, "logs/job.err", False)
    ]
    (folder / "job.out").unlink()
    folder.rmdir()
    gone = watch.check([7]).gone  # said again while the job runs
    assert sorted((g.path, g.folder) for g in gone) == [
        ("logs/job.err", True),
        ("logs/job.out", True),
    ]
    assert watch.check([]).gone == []  # it ended: forgotten


def test_a_started_jobs_file_missing_at_the_first_look_is_gone(tmp_path: Path) -> None:
    """Its supervisor made it before the job ran: it was removed before the agent looked."""
    watch = OutputWatch(lambda job_id: _spec(tmp_path, "job.out", "job.out", None))
    assert [g.path for g in watch.check([7]).gone] == ["job.out"]


def test_dev_null_and_terminal_jobs_are_not_watched(tmp_path: Path) -> None:
    watch = OutputWatch(lambda job_id: _spec(tmp_path, "/dev/null", "", 1), 1)
    found = watch.check([7])
    assert found.over == [] and found.gone == []


def test_the_coordinators_note_says_what_vanished() -> None:
    assert (
        output_gone_note("x.out", False, False) == "output file x.out was removed while the job ran"
    )
    assert "its folder is gone" in output_gone_note("x.out", True, False)
    assert "another file is there now" in output_gone_note("x.out", False, True)


def test_max_output_is_a_size_for_the_agent_and_a_qos(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUQ_CONFIG", raising=False)
    config = tmp_path / "config.toml"
    config.write_text('[agent]\nmax_output = "10G"\n\n[qos.normal]\nmax_output = "1M"\n')
    settings = load_settings(config, home=tmp_path)
    assert settings.agent.max_output == 10 << 30
    assert settings.coordinator.qos["normal"].max_output == MIB
    assert load_settings(home=tmp_path / "none").agent.max_output is None  # off by default


@pytest.mark.parametrize("value", ["10", "'lots'", '"-1G"'])
def test_a_bad_max_output_is_refused(tmp_path: Path, value: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f"[agent]\nmax_output = {value}\n")
    with pytest.raises(ConfigError, match="max_output"):
        load_settings(config, home=tmp_path)
