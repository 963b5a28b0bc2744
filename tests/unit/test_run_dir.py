"""Where an agent keeps job folders: tmpfs for a root agent, never a folder someone else owns."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpuq.config import AgentSettings, Settings
from gpuq.daemons import agent_run_dir
from gpuq.errors import InvalidInput


def settings_for(tmp_path: Path, run_dir: str | None = None) -> Settings:
    return Settings(home=tmp_path / "home", agent=AgentSettings(node_name="n1", run_dir=run_dir))


def test_root_agent_keeps_job_folders_in_a_private_tmpfs_folder(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not Path("/dev/shm").is_dir():
        pytest.skip("needs root and /dev/shm")
    settings = settings_for(tmp_path)
    try:
        run_dir = agent_run_dir(settings)
        assert run_dir == settings.agent_run_root / "n1"
        assert run_dir.parent.parent == Path("/dev/shm/gpuq-0")
        assert run_dir.parent.parent.stat().st_mode & 0o777 == 0o700
        assert run_dir.parent.stat().st_mode & 0o777 == run_dir.stat().st_mode & 0o777 == 0o700
        other_home = settings_for(tmp_path / "other")
        assert other_home.agent_run_root != settings.agent_run_root  # one folder per home
    finally:
        shutil.rmtree(settings.agent_run_root, ignore_errors=True)


def test_a_folder_squatted_in_dev_shm_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the tmpfs folder is for root agents")
    shm = tmp_path / "shm"
    (shm / "gpuq-0").mkdir(parents=True, mode=0o777)
    (shm / "gpuq-0").chmod(0o777)  # made first by someone else, open to all
    monkeypatch.setattr(Settings, "agent_run_root", property(lambda s: shm / "gpuq-0" / "key"))
    with pytest.raises(InvalidInput, match="not a private folder"):
        agent_run_dir(settings_for(tmp_path))
    assert not (shm / "gpuq-0" / "key").exists()


def test_an_agent_that_is_not_root_uses_its_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # logind clears a user's /dev/shm at logout
    settings = settings_for(tmp_path)
    assert agent_run_dir(settings) == settings.agent_state_dir == tmp_path / "home/agent/n1"


def test_a_configured_run_dir_gets_one_private_folder_per_node(tmp_path: Path) -> None:
    run_dir = agent_run_dir(settings_for(tmp_path, str(tmp_path / "run")))
    assert run_dir == tmp_path / "run" / "n1"
    assert run_dir.stat().st_mode & 0o777 == 0o700
