"""`gpuq admin install`: a machine made ready to run gpuq's services, idempotently.

What it sets up (README "Installing on a lab server"): the coordinator's system user and the
admin group, /etc/gpuq/config.toml (only where missing: an admin's file is never rewritten),
the state folders with their owners and modes, the local node's key on a machine with both
services, and the systemd units, whose ExecStart is this installation's `gpuq`. Each item says
what happened to it (made, kept, unchanged, updated), so a second run shows that it changed
nothing. With a scratch root (--root DIR) everything is written under DIR, no user or group is
made and nothing is given to a user that may not exist; the files say what the machine would get.

The pure part (InstallPlan -> the config text, the units, the next steps) is separate from the
edge that touches the machine (`install`), which tests point at a scratch root.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gpuq.admin.unit_templates import AGENT, COORDINATOR, JOBS
from gpuq.config.settings import SYSTEM_HOME, AgentSettings, CoordinatorSettings
from gpuq.config.value_checks import check_setting
from gpuq.errors import Conflict, GpuqError, InvalidInput, PermissionDenied
from gpuq.identity import Unauthenticated, check_node_name, create_key_file

Role = Literal["coordinator", "agent", "both"]
ROLES: tuple[Role, ...] = ("coordinator", "agent", "both")
CONFIG = Path("/etc/gpuq/config.toml")
COORDINATOR_HOME = SYSTEM_HOME  # where clients with no config of their own look too
AGENT_HOME = Path("/var/lib/gpuq-agent")
UNIT_DIR = Path("/etc/systemd/system")
REMOTE_NODE_KEY = Path("/etc/gpuq/node.key")
# the delegated unit that holds job cgroups (unit_templates.JOBS); the agent makes them there
JOBS_CGROUP = "system.slice/gpuq-jobs.service"
Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class InstallPlan:
    role: Role
    node: str  # this node's name (the agent's node_name)
    user: str  # the coordinator's system user
    admin_group: str
    gpuq: Path  # this installation's `gpuq` command, for ExecStart
    sleep: Path  # `sleep`, the jobs unit's placeholder process
    coordinator: str | None = None  # HOST:PORT for an agent-only node; None: said as a step

    @property
    def runs_coordinator(self) -> bool:
        return self.role in ("coordinator", "both")

    @property
    def runs_agent(self) -> bool:
        return self.role in ("agent", "both")

    @property
    def local_node_key(self) -> Path:
        """The agent's key: on a `both` machine the coordinator's own copy, which the root agent
        reads ([coordinator] service_user owns it: gpuq.daemons.agent_node_key)."""
        if self.runs_coordinator:
            return COORDINATOR_HOME / "nodes" / f"{self.node}.key"
        return REMOTE_NODE_KEY


def make_plan(
    role: str,
    node: str | None,
    user: str,
    admin_group: str,
    coordinator: str | None,
    python: Path = Path(sys.executable),
) -> InstallPlan:
    """The plan for this machine: the inputs checked, `gpuq` found beside `python` (the
    interpreter running this command: the units start the installation that installed them)."""
    if role not in ROLES:
        raise InvalidInput("--role", role, "expected coordinator, agent or both")
    source = "gpuq admin install"
    check_setting("coordinator", "service_user", user, source, "--user")
    check_setting("coordinator", "admin_group", admin_group, source, "--admin-group")
    if coordinator is not None:
        check_setting("agent", "coordinator", coordinator, source, "--coordinator")
    name = node or socket.gethostname().split(".")[0]
    try:
        check_node_name(name)
    except Unauthenticated:
        raise InvalidInput(
            "--node", name, "not a node name (letters, digits, '.', '_', '-')"
        ) from None
    gpuq = python.parent / "gpuq"
    if not gpuq.is_file() or not os.access(gpuq, os.X_OK):
        raise GpuqError(
            f"no executable gpuq beside {python} ({gpuq}): run the gpuq of the installation the "
            "services should start (e.g. /opt/gpuq/bin/gpuq admin install)"
        )
    sleep = shutil.which("sleep")
    if sleep is None:
        raise GpuqError("no `sleep` on PATH: the jobs unit needs it (coreutils)")
    return InstallPlan(
        role,
        name,
        user,
        admin_group,
        gpuq.absolute(),
        Path(sleep).resolve(),
        coordinator,
    )


# ---- the pure part -----------------------------------------------------------------------------


def config_text(plan: InstallPlan) -> str:
    """/etc/gpuq/config.toml for the plan's role (README "Configuration" has every key)."""
    lines = [
        f"# written by `gpuq admin install --role {plan.role}`; every key is in README",
        '# "Configuration". gpuq admin install never rewrites this file.',
    ]
    if plan.runs_coordinator:
        lines += [
            "",
            "[coordinator]",
            "# gpuq-coordinator.service runs as this user; so run, it serves every user here",
            f'service_user = "{plan.user}"',
            f'admin_group = "{plan.admin_group}"',
        ]
    lines += ["", "[agent]"]
    if plan.runs_coordinator:
        lines += [
            "# where this machine's agent reaches the coordinator",
            f'coordinator = "unix:{COORDINATOR_HOME / "gpuq.sock"}"',
        ]
    elif plan.coordinator:
        lines += [
            "# the coordinator's agent_listen (mutual TLS: tls_ca, tls_cert, tls_key below)",
            f'coordinator = "{plan.coordinator}"',
        ]
    else:
        lines += ['# coordinator = "HOST:7818"   # the coordinator\'s agent_listen: set it']
    if plan.runs_agent:
        lines += [
            f'node_name = "{plan.node}"',
            f'node_key = "{plan.local_node_key}"',
            '# job cgroups go below the delegated gpuq-jobs.service (README "Job cgroups")',
            f'cgroup_parent = "{JOBS_CGROUP}"',
        ]
        if not plan.runs_coordinator:
            lines += [
                '# tls_ca = "/etc/gpuq/tls/ca.pem"',
                f'# tls_cert = "/etc/gpuq/tls/node-{plan.node}.pem"',
                f'# tls_key = "/etc/gpuq/tls/node-{plan.node}.key"',
            ]
    lines += ["", "[client]", "# where users' gpuq commands and gpuq.Client reach the coordinator"]
    if plan.runs_coordinator:
        lines += [f'coordinator = "unix:{COORDINATOR_HOME / "gpuq.sock"}"']
    else:
        lines += [
            '# coordinator = "HOST:7817"   # its listen port (TLS: tls_ca; users need a token,',
            "#                             # gpuq admin token USER)",
        ]
    return "\n".join(lines) + "\n"


def config_gaps(plan: InstallPlan, existing: dict[str, Any]) -> list[str]:
    """What an existing config lacks that the units rely on, as the lines to add: each key the
    plan's config sets to other than its default and the existing one does not set, and a
    service_user naming someone other than the unit's user (the coordinator would then serve
    only its own user). A key set to another value is the admin's choice, and kept."""
    defaults = {"coordinator": CoordinatorSettings(), "agent": AgentSettings()}
    gaps = []
    for section, wanted in tomllib.loads(config_text(plan)).items():
        if section not in defaults:  # [client]: no unit reads it (commands fall back to [agent])
            continue
        have = existing.get(section, {})
        for key, value in wanted.items():
            missing = key not in have and value != getattr(defaults[section], key)
            if missing or (key == "service_user" and have.get(key, value) != value):
                gaps.append(f"[{section}] {key} = {json.dumps(value)}")
    return gaps


def unit_texts(plan: InstallPlan) -> dict[str, str]:
    """The units of the plan's role, by file name."""
    values = {"gpuq": str(plan.gpuq), "sleep": str(plan.sleep), "user": plan.user}
    values["group"] = plan.user  # useradd --user-group: the user's own group
    units: dict[str, str] = {}
    if plan.runs_coordinator:
        units["gpuq-coordinator.service"] = COORDINATOR.substitute(values)
    if plan.runs_agent:
        units["gpuq-jobs.service"] = JOBS.substitute(values)
        units["gpuq-agent.service"] = AGENT.substitute(values)
    return units


def services(plan: InstallPlan) -> list[str]:
    """The units to enable, in start order."""
    names = ["gpuq-coordinator"] if plan.runs_coordinator else []
    return names + (["gpuq-jobs", "gpuq-agent"] if plan.runs_agent else [])


def next_steps(plan: InstallPlan) -> list[str]:
    """What the admin still does after the install, in order."""
    steps = [f"systemctl daemon-reload && systemctl enable --now {' '.join(services(plan))}"]
    if plan.runs_coordinator:
        steps += [
            f"add the admins to {plan.admin_group}: usermod -aG {plan.admin_group} USER",
            "for each other node: gpuq admin node-key NODE, then copy "
            f"{COORDINATOR_HOME}/nodes/NODE.key to it as {REMOTE_NODE_KEY} (root, 0600)",
            'for users or nodes on other machines: TLS (gpuq admin certs; README "Security"); '
            f"the coordinator's key file must be readable by {plan.user}",
        ]
    if plan.role == "agent":
        if not plan.coordinator:
            steps.append(f'set [agent] coordinator = "HOST:7818" in {CONFIG}')
        steps.append(
            f"copy this node's key from the coordinator (gpuq admin node-key {plan.node}) to "
            f"{REMOTE_NODE_KEY} (root, 0600) and its TLS files; see {CONFIG}"
        )
    return steps


# ---- the edge: the machine (or a scratch root) -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """Where files go, the machine itself (root None) or a tree that mirrors it under root,
    and whether users and groups are made and files given to them (`accounts`)."""

    root: Path | None
    accounts: bool

    @classmethod
    def of(cls, root: Path | None) -> Target:
        """The machine, or --root DIR: a scratch tree, files only. A root that is / (or a link
        to it) is refused: it would write the machine's /etc as a scratch tree, with no user
        made and nothing chowned."""
        if root is not None and root.resolve() == Path("/"):
            raise InvalidInput(
                "--root",
                str(root),
                "that is this machine itself, not a scratch folder: run gpuq admin install "
                "without --root (as root)",
            )
        return cls(root, accounts=root is None)

    def path(self, path: Path) -> Path:
        return path if self.root is None else self.root / path.relative_to("/")


def install(plan: InstallPlan, target: Target, say: Say) -> None:
    """Set the machine (or `target`'s tree) up as `plan` says, one line per item."""
    if target.accounts and os.geteuid() != 0:
        raise PermissionDenied(
            "gpuq admin install makes users, folders and systemd units: run it as root "
            "(or with --root DIR to write them into a scratch folder)"
        )
    _refuse_linked_units(plan, target)
    if not target.accounts:
        say(f"scratch root {target.root}: files only; no user or group is made, nothing is chowned")
    uid = _accounts(plan, target, say) if plan.runs_coordinator else None
    gaps = _config(plan, target, say)
    if plan.runs_coordinator:
        _folder(target, COORDINATOR_HOME, 0o711, uid, say)
        _folder(target, COORDINATOR_HOME / "nodes", 0o700, uid, say)
    if plan.runs_agent:
        _folder(target, AGENT_HOME, 0o700, 0 if target.accounts else None, say)
    if plan.role == "both":
        _node_key(target, plan.local_node_key, uid, say)
    for name, text in unit_texts(plan).items():
        _write_unit(target.path(UNIT_DIR / name), text, say)
    say("next:")
    if gaps:
        say(f"  add to {target.path(CONFIG)} first: {'; '.join(gaps)}")
    for step in next_steps(plan):
        say(f"  {step}")


def _refuse_linked_units(plan: InstallPlan, target: Target) -> None:
    """Before anything is written: a unit file that is a link is the admin's (`systemctl mask`
    links it to /dev/null, `systemctl link` to a file elsewhere). Writing through it would
    overwrite and chmod the link's target (/dev/null made 0644) and leave the unit masked."""
    for name in unit_texts(plan):
        path = target.path(UNIT_DIR / name)
        if path.is_symlink():
            raise Conflict(
                f"{path} is a link to {os.readlink(path)} (a masked unit links to /dev/null): "
                f"gpuq admin install writes its units as plain files; `systemctl unmask {name}` "
                "(or remove the link), then run it again"
            )


def _accounts(plan: InstallPlan, target: Target, say: Say) -> int | None:
    """The admin group and the coordinator's system user, each made only if missing; the
    user's uid (None under a scratch root: nothing is chowned there)."""
    try:
        grp.getgrnam(plan.admin_group)
        say(f"kept: group {plan.admin_group} (exists)")
    except KeyError:
        if not target.accounts:
            say(f"skipped: group {plan.admin_group} (scratch root: groupadd --system)")
        else:
            _run(["groupadd", "--system", plan.admin_group])
            say(f"made: group {plan.admin_group}")
    try:
        entry = pwd.getpwnam(plan.user)
        say(f"kept: user {plan.user} (exists)")
    except KeyError:
        if not target.accounts:
            say(f"skipped: user {plan.user} (scratch root: useradd --system)")
            return None
        _run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--home-dir",
                str(COORDINATOR_HOME),
                "--shell",
                "/usr/sbin/nologin",
                plan.user,
            ]
        )
        entry = pwd.getpwnam(plan.user)
        say(f"made: user {plan.user} (uid {entry.pw_uid})")
    return entry.pw_uid if target.accounts else None


def _config(plan: InstallPlan, target: Target, say: Say) -> list[str]:
    """The config, made where missing; what an existing one lacks (config_gaps), said."""
    path = target.path(CONFIG)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        path.write_text(config_text(plan))
        os.chmod(path, 0o644)
        say(f"made: {path}")
        return []
    say(f"kept: {path} (exists; it is never rewritten)")
    try:
        gaps = config_gaps(plan, tomllib.loads(path.read_text()))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise GpuqError(f"cannot read {path}: {exc}") from None
    for gap in gaps:
        say(f"  the units need there: {gap}")
    return gaps


def _folder(target: Target, where: Path, mode: int, owner: int | None, say: Say) -> None:
    """A folder with its mode and owner (None: left as made, under a scratch root)."""
    path = target.path(where)
    made = not path.exists()
    path.mkdir(parents=True, exist_ok=True, mode=mode)
    info = path.stat()
    changed = made or (info.st_mode & 0o7777) != mode
    os.chmod(path, mode)
    if owner is not None and info.st_uid != owner:
        os.chown(path, owner, -1)
        changed = True
    state = "made" if made else ("updated" if changed else "unchanged")
    say(f"{state}: {path} ({mode:04o}{_owner_note(owner, target)})")


def _owner_note(owner: int | None, target: Target) -> str:
    if owner is None:
        return "" if target.accounts else ", not chowned: scratch root"
    return f", {pwd.getpwuid(owner).pw_name}"


def _node_key(target: Target, where: Path, owner: int | None, say: Say) -> None:
    """This node's key, in the coordinator's nodes folder, owned by the coordinator's user
    (which must read it; the root agent may: [coordinator] service_user)."""
    path = target.path(where)
    existed = path.exists()
    create_key_file(path, owner=owner)
    say(f"{'kept' if existed else 'made'}: {path} (this node's key, 0600)")


def _write_unit(path: Path, text: str, say: Say) -> None:
    """A unit, written when its text differs; an admin's own changes belong in drop-ins
    (`systemctl edit UNIT`), which this never touches."""
    old = path.read_text() if path.exists() else None
    if old == text:
        say(f"unchanged: {path}")
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    path.write_text(text)
    os.chmod(path, 0o644)
    say(f"{'made' if old is None else 'updated'}: {path}")


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise GpuqError(f"{' '.join(command)} failed: {result.stderr.strip()[:300]}")
