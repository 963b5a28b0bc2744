"""Where an agent keeps job folders: tmpfs for a root agent, in a folder of this installation
with a random name, never a folder someone else owns or can write (gpuq/agent/run_folder.py)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import needs, skip_or_fail

from gpuq import run_root
from gpuq.agent import run_folder
from gpuq.config.settings import AgentSettings, Settings
from gpuq.daemons import agent_run_dir
from gpuq.errors import InvalidInput

NOBODY = 65534
needs_root = needs(os.geteuid() == 0, "needs root (CI runs as root)")


def settings_for(tmp_path: Path, run_dir: str | None = None) -> Settings:
    return Settings(home=tmp_path / "home", agent=AgentSettings(node_name="n1", run_dir=run_dir))


@pytest.fixture
def made() -> Iterator[list[Path]]:
    """Folders a test made in /dev/shm, removed at its end."""
    paths: list[Path] = []
    yield paths
    for path in paths:
        if path.is_symlink():
            path.unlink()
        else:
            shutil.rmtree(path, ignore_errors=True)


def squat(path: Path, made: list[Path]) -> Path:
    """A folder made first by another user (nobody), open to all."""
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    os.chown(path, NOBODY, NOBODY)
    made.append(path)
    return path


@needs_root
def test_root_agent_keeps_job_folders_in_a_random_tmpfs_folder(
    tmp_path: Path, made: list[Path]
) -> None:
    if not Path("/dev/shm").is_dir():
        skip_or_fail("needs /dev/shm")
    settings = settings_for(tmp_path)
    run_dir = agent_run_dir(settings)
    made.append(run_dir.parent)
    root = run_dir.parent
    assert run_dir == settings.agent_run_root / "n1"
    assert root.parent == Path("/dev/shm") and re.fullmatch(r"gpuq-[0-9a-f]{24}", root.name)
    # a job's user passes through to its script (0711); nobody else lists or writes
    for folder in (root, run_dir):
        info = folder.lstat()
        assert (info.st_uid, info.st_mode & 0o777) == (0, 0o711)
    assert (settings.home / "agent" / run_root.RECORD).read_text().strip() == str(root)
    assert agent_run_dir(settings) == run_dir  # remembered: the same folder next time
    other = settings_for(tmp_path / "other")
    other_dir = agent_run_dir(other)
    made.append(other_dir.parent)
    assert other_dir.parent != root  # one folder per installation


@needs_root
def test_names_taken_by_others_never_stop_a_root_agent(
    tmp_path: Path, made: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old fixed name, a taken random name and a squatted remembered folder: the agent
    makes a folder of its own and remembers it."""
    if not Path("/dev/shm").is_dir():
        skip_or_fail("needs /dev/shm")
    with contextlib.suppress(FileExistsError):  # the fixed name of earlier versions
        squat(Path(f"/dev/shm/gpuq-{os.geteuid()}"), made)
    taken = "a" * 24
    squat(Path(f"/dev/shm/gpuq-{taken}"), made)
    names = iter([taken, "b" * 24])
    monkeypatch.setattr(run_folder.secrets, "token_hex", lambda _: next(names))
    settings = settings_for(tmp_path)
    run_dir = agent_run_dir(settings)
    made.append(run_dir.parent)
    assert run_dir.parent == Path(f"/dev/shm/gpuq-{'b' * 24}")
    # the remembered folder removed at a clean stop, then taken by someone: a new one
    shutil.rmtree(run_dir.parent)
    squat(run_dir.parent, made)
    monkeypatch.setattr(run_folder.secrets, "token_hex", lambda _: "c" * 24)
    again = agent_run_dir(settings)
    made.append(again.parent)
    assert again.parent == Path(f"/dev/shm/gpuq-{'c' * 24}")
    assert run_dir.parent.lstat().st_uid == NOBODY  # theirs, untouched


@needs_root
def test_a_link_in_place_of_the_folder_is_never_followed(
    tmp_path: Path, made: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    if not Path("/dev/shm").is_dir():
        skip_or_fail("needs /dev/shm")
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = Path(f"/dev/shm/gpuq-{'d' * 24}")
    link.symlink_to(target)
    made.append(link)
    names = iter(["d" * 24, "e" * 24])
    monkeypatch.setattr(run_folder.secrets, "token_hex", lambda _: next(names))
    run_dir = agent_run_dir(settings_for(tmp_path))
    made.append(run_dir.parent)
    assert run_dir.parent == Path(f"/dev/shm/gpuq-{'e' * 24}")
    assert list(target.iterdir()) == []
    assert run_folder.safe_folder(link) == "is a symbolic link"


def test_an_agent_that_is_not_root_uses_its_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # logind clears a user's /dev/shm at logout
    settings = settings_for(tmp_path)
    assert agent_run_dir(settings) == settings.agent_state_dir == tmp_path / "home/agent/n1"


def test_a_configured_run_dir_gets_one_private_folder_per_node(tmp_path: Path) -> None:
    run_dir = agent_run_dir(settings_for(tmp_path, str(tmp_path / "run")))
    assert run_dir == tmp_path / "run" / "n1"
    assert run_dir.stat().st_mode & 0o777 == (0o711 if os.geteuid() == 0 else 0o700)


def test_a_configured_run_dir_writable_by_others_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(InvalidInput, match=r"is writable by others \(mode 0777\)"):
        agent_run_dir(settings_for(tmp_path, str(shared)))
    below = tmp_path / "open" / "run"  # in a folder anyone may write (and not sticky)
    below.mkdir(parents=True)
    below.parent.chmod(0o777)
    with pytest.raises(InvalidInput, match="writable by others"):
        agent_run_dir(settings_for(tmp_path, str(below)))
    assert not (shared / "n1").exists() and not (below / "n1").exists()


@needs_root
def test_a_configured_run_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(InvalidInput, match="is owned by uid 65534"):
        agent_run_dir(settings_for(tmp_path, str(theirs)))
    inside = theirs / "run"  # ours, in a folder they own (they could swap it)
    inside.mkdir(mode=0o700)
    with pytest.raises(InvalidInput, match="owned by uid 65534"):
        agent_run_dir(settings_for(tmp_path, str(inside)))


def test_a_configured_node_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (tmp_path / "elsewhere").mkdir()
    (run / "n1").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InvalidInput, match="is a symbolic link"):
        agent_run_dir(settings_for(tmp_path, str(run)))


@needs_root
def test_the_nodes_of_one_installation_share_its_folder(tmp_path: Path, made: list[Path]) -> None:
    if not Path("/dev/shm").is_dir():
        skip_or_fail("needs /dev/shm")
    first = Settings(home=tmp_path / "home", agent=AgentSettings(node_name="n1"))
    second = Settings(home=tmp_path / "home", agent=AgentSettings(node_name="n2"))
    one, two = agent_run_dir(first), agent_run_dir(second)
    made.append(one.parent)
    assert one.parent == two.parent == first.agent_run_root == second.agent_run_root
    assert (one.name, two.name) == ("n1", "n2")
