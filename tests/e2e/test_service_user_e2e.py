"""`gpuq admin install` as root (README "Installing on a lab server"): the service user and
admin group made, and the folders and key given to that user, in a tree under a test folder.

Then the installed layout in miniature: the coordinator runs as a system user of its own
([coordinator] service_user), the agent as root with a home of its own, both reading one config
file; the agent reaches the coordinator through its socket and reads this node's key, which the
service user owns, from the coordinator's home. Another user's job must be served and run as
that user. A coordinator whose service_user names someone else stays a private one.

Real throwaway Unix users (tests/e2e/unix_users.py); root only (CI runs as root).
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import unix_users
from e2e_cluster import MARKER, kill_marked, wait_for
from unix_users import UnixUser, run_as

from gpuq.admin.install import Target, install, make_plan
from gpuq.config.loading import load_settings
from gpuq.identity import create_key_file, read_key_file

pytestmark = pytest.mark.timeout(120)
user_homes = unix_users.user_homes
shared_root = unix_users.shared_root
users = unix_users.two_users


def service_config(root: Path, service_user: str) -> tuple[Path, Path]:
    """The coordinator's home (its service user's, as systemd's StateDirectory makes it: 0700
    until the coordinator opens it to users) and a root-owned config file, as install writes."""
    home = root / "lib" / "gpuq"
    home.mkdir(parents=True, mode=0o700)
    (root / "lib").chmod(0o755)
    config = root / "config.toml"
    config.write_text(
        "[coordinator]\n"
        f'service_user = "{service_user}"\n'
        'listen = ""\n'
        "heartbeat_interval = 0.3\n"
        "[agent]\n"
        f'coordinator = "unix:{home}/gpuq.sock"\n'
        'node_name = "n1"\n'
        f'node_key = "{home}/nodes/n1.key"\n'
    )
    config.chmod(0o644)
    return home, config


def start_coordinator_as(user: UnixUser, home: Path, config: Path) -> None:
    """`gpuq coordinator` as `user`, in a session of its own (ended by remove_user)."""
    os.chown(home, user.uid, user.gid)
    serve = f"""
import subprocess, sys
print(subprocess.Popen([sys.executable, "-m", "gpuq.cli.main", "coordinator"],
    stdout=open({str(home.parent / "coordinator.log")!r}, "ab"), stderr=subprocess.STDOUT,
    start_new_session=True).pid)
"""
    (home.parent / "coordinator.log").touch(mode=0o666)
    (home.parent / "coordinator.log").chmod(0o666)
    started = run_as(user, ["-c", serve], env={"GPUQ_HOME": str(home), "GPUQ_CONFIG": str(config)})
    assert started.returncode == 0, started.stderr
    wait_for(lambda: (home / "gpuq.sock").exists(), timeout=30, what="the service coordinator")


def gpuq_as(user: UnixUser, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_as(user, ["-m", "gpuq.cli.main", *args], env={"GPUQ_CONFIG": str(config)})


@pytest.fixture
def agent_home(shared_root: Path) -> Iterator[tuple[Path, str]]:
    """The root agent's own home (StateDirectory=gpuq-agent) and the marker its processes
    carry: what still carries it (supervisors, jobs) is killed at the end."""
    home = shared_root / "lib" / "gpuq-agent"
    marker = uuid.uuid4().hex
    try:
        yield home, marker
    finally:
        for log in ("coordinator.log", "agent.log"):  # shown when the test fails
            with contextlib.suppress(OSError):
                print(f"---- {log}\n" + (home.parent / log).read_text()[-4000:])
        kill_marked(marker, (shared_root,))
        shutil.rmtree(load_settings(home=home).agent_run_root, ignore_errors=True)


def start_root_agent(home: Path, marker: str, config: Path) -> subprocess.Popen[bytes]:
    home.mkdir(parents=True, mode=0o700, exist_ok=True)
    env = {**os.environ, "GPUQ_HOME": str(home), "GPUQ_CONFIG": str(config), MARKER: marker}
    log = open(home.parent / "agent.log", "ab")  # noqa: SIM115 - lives with the process
    return subprocess.Popen(
        [sys.executable, "-m", "gpuq.cli.main", "agent", "--fake-gpus", "1"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=home.parent.parent,  # not lib/, whose gpuq/ would shadow the package
    )


def test_a_coordinator_run_as_its_service_user_serves_everyone(
    shared_root: Path, users: tuple[UnixUser, UnixUser], agent_home: tuple[Path, str]
) -> None:
    service, bob = users
    home, config = service_config(shared_root, service.name)
    # this node's key: the service user's (the coordinator reads it), as install makes it
    create_key_file(home / "nodes" / "n1.key", owner=service.uid)
    start_coordinator_as(service, home, config)
    info = home.stat()
    assert info.st_uid == service.uid and stat.S_IMODE(info.st_mode) == 0o711
    agent = start_root_agent(*agent_home, config)
    try:

        def node_up() -> bool:
            listing = gpuq_as(bob, config, "nodes")
            return listing.returncode == 0 and " up " in listing.stdout

        wait_for(node_up, timeout=30, what="the root agent to register with its node key")
        submitted = gpuq_as(bob, config, "submit", "--parsable", "--wrap", "id -un; id -u")
        assert submitted.returncode == 0, submitted.stderr
        job = int(submitted.stdout.strip())
        output = bob.home / f"gpuq-{job}.out"
        wait_for(
            lambda: output.exists() and len(output.read_text().splitlines()) == 2,
            timeout=30,
            what=f"job {job}'s output",
        )
        assert output.read_text().split() == [bob.name, str(bob.uid)]
        listing = gpuq_as(bob, config, "history")
        assert listing.returncode == 0 and bob.name in listing.stdout, listing
    finally:
        agent.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(10)
        if agent.poll() is None:
            agent.kill()
            agent.wait(10)


def test_a_coordinator_whose_service_user_is_another_serves_only_its_own_user(
    shared_root: Path, users: tuple[UnixUser, UnixUser]
) -> None:
    alice, bob = users
    home, config = service_config(shared_root, bob.name)  # not alice, who runs it
    start_coordinator_as(alice, home, config)

    def answers_alice() -> bool:
        return gpuq_as(alice, config, "queue").returncode == 0

    wait_for(answers_alice, timeout=30, what="alice's coordinator to answer her")
    assert stat.S_IMODE(home.stat().st_mode) == 0o700  # private: nobody else reaches it
    home.chmod(0o711)  # even where bob can reach the socket
    refused = gpuq_as(bob, config, "queue")
    assert refused.returncode != 0 and f"serves only {alice.name}" in refused.stderr, refused


def test_install_makes_the_service_user_and_gives_it_its_folders(tmp_path: Path) -> None:
    """What --root leaves out (users, groups, owners), for real: a throwaway service user and
    admin group, the machine's files written below tmp_path."""
    unix_users.needs_root()
    user, group = f"gpuqs_{secrets.token_hex(4)}", f"gpuqa_{secrets.token_hex(4)}"
    plan = make_plan("both", "n1", user, group, None)
    first: list[str] = []
    try:
        install(plan, Target(tmp_path, accounts=True), first.append)
        entry = pwd.getpwnam(user)
        assert (entry.pw_dir, entry.pw_shell) == ("/var/lib/gpuq", "/usr/sbin/nologin")
        assert entry.pw_uid < 1000 and grp.getgrgid(entry.pw_gid).gr_name == user  # --system
        assert grp.getgrnam(group).gr_gid < 1000
        assert f"made: user {user} (uid {entry.pw_uid})" in first
        assert f"made: group {group}" in first
        home = tmp_path / "var/lib/gpuq"
        for path, owner, mode in [
            (home, entry.pw_uid, 0o711),
            (home / "nodes", entry.pw_uid, 0o700),
            (home / "nodes/n1.key", entry.pw_uid, 0o600),
            (tmp_path / "var/lib/gpuq-agent", 0, 0o700),
        ]:
            info = path.stat()
            assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (owner, mode), path
        # the root agent reads the key its coordinator's user owns (gpuq.daemons.agent_node_key)
        assert read_key_file(home / "nodes/n1.key", also_owner=entry.pw_uid)
        settings = load_settings(tmp_path / "etc/gpuq/config.toml", home=tmp_path / "h")
        coordinator = settings.coordinator
        assert (coordinator.service_user, coordinator.admin_group) == (user, group)

        again: list[str] = []
        install(plan, Target(tmp_path, accounts=True), again.append)
        assert f"kept: user {user} (exists)" in again and f"kept: group {group} (exists)" in again
        items = [line for line in again if line.startswith(("made", "updated"))]
        assert items == [], items
    finally:
        for command in (["userdel", user], ["groupdel", user], ["groupdel", group]):
            subprocess.run(command, capture_output=True, timeout=60)
