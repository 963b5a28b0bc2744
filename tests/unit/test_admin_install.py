"""`gpuq admin install` (README "Installing on a lab server"), run as the real command into a
scratch root: what it writes for each role, that the config it writes is one gpuq reads as
meant, that a second run changes nothing and says so, and that it refuses what it cannot do."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuq.admin.install import make_plan
from gpuq.cli.group import run
from gpuq.config.loading import load_settings
from gpuq.errors import GpuqError, InvalidInput

GPUQ = Path(sys.executable).parent / "gpuq"


def install(root: Path, *args: str, user: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GPUQ), "admin", "install", "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GPUQ_HOME": str(root / "home-of-the-caller")},
        user=user,
    )


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file and folder under root: its mode and its content (b"" for folders)."""
    found = {}
    for path in sorted(root.rglob("*")):
        mode = stat.S_IMODE(path.lstat().st_mode)
        found[str(path.relative_to(root))] = (mode, b"" if path.is_dir() else path.read_bytes())
    return found


def test_a_machine_with_both_services(tmp_path: Path) -> None:
    first = install(tmp_path, "--node", "gpu1")
    assert first.returncode == 0, first.stderr
    assert "scratch root" in first.stdout and "nothing is chowned" in first.stdout
    assert (
        "systemctl daemon-reload && systemctl enable --now gpuq-coordinator gpuq-jobs gpuq-agent"
        in first.stdout
    )
    made = tree(tmp_path)
    assert made["var/lib/gpuq"][0] == 0o711  # users reach the sockets by name
    assert made["var/lib/gpuq/nodes"][0] == 0o700
    assert made["var/lib/gpuq/nodes/gpu1.key"][0] == 0o600
    assert made["var/lib/gpuq-agent"][0] == 0o700
    assert made["etc/gpuq/config.toml"][0] == 0o644
    units = sorted(p.name for p in (tmp_path / "etc/systemd/system").iterdir())
    assert units == ["gpuq-agent.service", "gpuq-coordinator.service", "gpuq-jobs.service"]

    # the config, as the services read it
    settings = load_settings(tmp_path / "etc/gpuq/config.toml", home=Path("/var/lib/gpuq-agent"))
    assert settings.coordinator.service_user == "gpuq"
    assert settings.coordinator.admin_group == "gpuq-admin"
    assert settings.coordinator_address == "unix:/var/lib/gpuq/gpuq.sock"
    assert settings.client.coordinator == "unix:/var/lib/gpuq/gpuq.sock"  # users' commands
    assert settings.agent.node_name == "gpu1"
    assert settings.node_key_path == Path("/var/lib/gpuq/nodes/gpu1.key")
    assert settings.agent.cgroup_parent == "system.slice/gpuq-jobs.service"

    second = install(tmp_path, "--node", "gpu1")
    assert second.returncode == 0, second.stderr
    assert tree(tmp_path) == made  # nothing changed
    items = [line for line in second.stdout.splitlines() if str(tmp_path) in line]
    assert items and all(line.split(":")[0] in ("kept", "unchanged") for line in items[1:]), items


def test_a_coordinator_only_machine(tmp_path: Path) -> None:
    done = install(tmp_path, "--role", "coordinator", "--user", "queue", "--admin-group", "ops")
    assert done.returncode == 0, done.stderr
    assert "enable --now gpuq-coordinator\n" in done.stdout
    units = sorted(p.name for p in (tmp_path / "etc/systemd/system").iterdir())
    assert units == ["gpuq-coordinator.service"]
    unit = (tmp_path / "etc/systemd/system/gpuq-coordinator.service").read_text()
    assert "\nUser=queue\nGroup=queue\n" in unit
    assert not (tmp_path / "var/lib/gpuq-agent").exists()
    assert not (tmp_path / "var/lib/gpuq/nodes/gpu1.key").exists()
    settings = load_settings(tmp_path / "etc/gpuq/config.toml", home=tmp_path / "h")
    assert settings.coordinator.service_user == "queue"
    assert settings.coordinator.admin_group == "ops"
    assert settings.coordinator_address == "unix:/var/lib/gpuq/gpuq.sock"


def test_an_agent_only_node(tmp_path: Path) -> None:
    done = install(tmp_path, "--role", "agent", "--node", "gpu7", "--coordinator", "head:7818")
    assert done.returncode == 0, done.stderr
    assert "enable --now gpuq-jobs gpuq-agent\n" in done.stdout
    assert "gpuq admin node-key gpu7" in done.stdout  # what is left to do
    units = sorted(p.name for p in (tmp_path / "etc/systemd/system").iterdir())
    assert units == ["gpuq-agent.service", "gpuq-jobs.service"]
    assert not (tmp_path / "var/lib/gpuq").exists()  # no coordinator here
    settings = load_settings(tmp_path / "etc/gpuq/config.toml", home=tmp_path / "h")
    assert settings.coordinator.service_user is None
    assert settings.coordinator_address == "head:7818"
    assert settings.client.coordinator is None  # users need the listen port and a token
    assert '# coordinator = "HOST:7817"' in (tmp_path / "etc/gpuq/config.toml").read_text()
    assert settings.node_key_path == Path("/etc/gpuq/node.key")
    assert settings.agent.cgroup_parent == "system.slice/gpuq-jobs.service"


def test_an_existing_config_is_kept_and_a_changed_unit_is_put_back(tmp_path: Path) -> None:
    config = tmp_path / "etc/gpuq/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("[coordinator]\nadmin_group = 'ops'\n")
    assert install(tmp_path).returncode == 0
    unit = tmp_path / "etc/systemd/system/gpuq-agent.service"
    unit.write_text(unit.read_text().replace("KillMode=process", "KillMode=control-group"))
    again = install(tmp_path)
    assert again.returncode == 0, again.stderr
    assert config.read_text() == "[coordinator]\nadmin_group = 'ops'\n"
    assert f"kept: {config} (exists" in again.stdout
    # what the units rely on and an older config lacks is said, and put first among the steps
    for gap in (
        '[coordinator] service_user = "gpuq"',
        '[agent] coordinator = "unix:/var/lib/gpuq/gpuq.sock"',
        '[agent] node_key = "/var/lib/gpuq/nodes/',
        '[agent] cgroup_parent = "system.slice/gpuq-jobs.service"',
    ):
        assert f"the units need there: {gap}" in again.stdout, gap
    steps = again.stdout.partition("next:\n")[2]
    assert steps.startswith(f"  add to {config} first: [coordinator] service_user"), steps
    assert "admin_group" not in steps  # a value the admin chose is theirs
    assert f"updated: {unit}" in again.stdout
    assert "KillMode=process" in unit.read_text()


def test_without_a_scratch_root_only_root_may_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Users, chowns and /etc: an ordinary user is told at once (exit 2), before anything is
    written. In process, as an ordinary user's euid (CI runs as root, which must never install
    into this machine from a test)."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert run(["admin", "install", "--role", "agent"]) == 2
    err = capsys.readouterr().err
    assert "must run as root" not in err and "run it as root" in err, err
    assert "--root DIR" in err


def test_it_refuses_a_wrong_value_or_a_missing_gpuq(tmp_path: Path) -> None:
    wrong = install(tmp_path, "--node", "no/such")
    assert wrong.returncode == 2 and "not a node name" in wrong.stderr, wrong.stderr
    wrong = install(tmp_path, "--role", "agent", "--coordinator", "no port")
    assert wrong.returncode == 2 and "--coordinator" in wrong.stderr, wrong.stderr
    assert not (tmp_path / "etc").exists()  # refused before anything was written
    with pytest.raises(InvalidInput, match="--user"):
        make_plan("both", "n1", "bad user", "gpuq-admin", None)
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    with pytest.raises(GpuqError, match="no executable gpuq beside"):
        make_plan("both", "n1", "gpuq", "gpuq-admin", None, python=python)


def test_a_root_that_is_this_machine_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--root / (or a link to it) would write the machine's /etc and units as a scratch tree,
    no user made and nothing chowned. In process, with the writer replaced by one that fails
    the test: a test must never write this machine's /etc."""

    def writes_the_machine(*_args: object) -> None:
        raise AssertionError("gpuq admin install went on to write /")

    monkeypatch.setattr("gpuq.admin.install.install", writes_the_machine)
    (tmp_path / "slash").symlink_to("/")
    for root in ("/", str(tmp_path / "slash"), "/usr/.."):
        assert run(["admin", "install", "--root", root]) == 2, root
        err = capsys.readouterr().err
        assert "that is this machine itself" in err and "without --root" in err, err
    # `--root "$DIR"` with DIR unset is no scratch folder either (it meant the current folder)
    monkeypatch.chdir(tmp_path)
    assert run(["admin", "install", "--root", ""]) == 2
    assert "an empty folder name" in capsys.readouterr().err
    assert not (tmp_path / "etc").exists()


def test_a_masked_or_linked_unit_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """`systemctl mask` links a unit to /dev/null: writing through the link would overwrite
    and chmod /dev/null (0644: no user could write to it) and leave the unit masked. Here the
    link's target is a stand-in file with /dev/null's mode."""
    null = tmp_path / "null"
    null.write_text("")
    os.chmod(null, 0o666)
    root = tmp_path / "root"
    unit = root / "etc/systemd/system/gpuq-agent.service"
    unit.parent.mkdir(parents=True)
    unit.symlink_to(null)
    done = install(root)
    assert done.returncode == 2, done.stdout
    assert f"{unit} is a link to {null}" in done.stderr, done.stderr
    assert "systemctl unmask gpuq-agent.service" in done.stderr, done.stderr
    assert null.read_text() == "" and stat.S_IMODE(null.stat().st_mode) == 0o666
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == [
        "etc",
        "etc/systemd",
        "etc/systemd/system",
        "etc/systemd/system/gpuq-agent.service",
    ]  # nothing written
