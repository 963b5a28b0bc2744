"""Who a job runs as on this node, and whether this node may run it at all.

A job runs as its submitter: the account of that name in this node's password database
(lookup_account, at the edge), which sets its uid, gid and groups (the supervisor switches to
them) and the HOME, USER, LOGNAME and SHELL it sees (launch_spec). launch_refusal says, in one
line, why a node must not run a user's job: no such account here, an agent that is not root and
cannot switch users, a root agent serving a user's private coordinator (coordinator_socket_owner),
or root's own jobs where the admin does not allow them.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Account:
    """The submitter's account on this node, from its password database (looked up at the
    edge, lookup_account): who a job runs as and what HOME, USER, LOGNAME and SHELL it sees."""

    name: str
    uid: int
    gid: int  # the primary group
    home: str
    shell: str


def lookup_account(user: str) -> Account | None:
    """`user`'s entry in this node's password database (None: no such account)."""
    if not user or "\0" in user:
        return None
    try:
        entry = pwd.getpwnam(user)
    except (KeyError, ValueError, OSError):
        return None
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir, entry.pw_shell)


def coordinator_socket_owner(addresses: list[str], service_uid: int | None = None) -> int | None:
    """The uid owning the coordinator's Unix socket when one of `addresses` is `unix:PATH`
    and a user other than root and the coordinator's service user (`service_uid`, from
    [coordinator] service_user) owns it (a user's private coordinator), else None. A socket
    that cannot be looked at counts as owned by nobody trusted (-1: no job runs)."""
    owners = set()
    for address in addresses:
        if not address.startswith("unix:"):
            continue
        path = address[len("unix:") :].removeprefix("//")
        try:
            info = os.stat(path)
        except OSError:
            owners.add(-1)
            continue
        if info.st_uid not in (0, service_uid) or not stat.S_ISSOCK(info.st_mode):
            owners.add(info.st_uid if stat.S_ISSOCK(info.st_mode) else -1)
    if not owners:
        return None
    return owners.pop() if len(owners) == 1 else -1


ROOT_JOBS_SETTING = "[agent] allow_root_jobs"


def launch_refusal(
    user: str,
    account: Account | None,
    *,
    node: str,
    agent_uid: int,
    allow_root_jobs: bool,
    coordinator_owner: int | None = None,
) -> str | None:
    """Why this node must not run a job of `user` (None: it may), one line.

    `account`: the user's passwd entry here (None: none). `agent_uid`: the agent's euid; one
    that is not root cannot switch users and runs only its own. `coordinator_owner`: the uid
    owning the coordinator's Unix socket, where that is how the agent reaches it; a root agent
    serving a user's private coordinator runs only that user's jobs (never root's)."""
    if account is None:
        return f"user {user!r} has no account on node {node}"
    if agent_uid != 0 and account.uid != agent_uid:
        return (
            f"the agent on node {node} runs as uid {agent_uid} and cannot run jobs of user "
            f"{account.name} (uid {account.uid}): only root switches users"
        )
    if coordinator_owner == -1:
        return f"node {node} cannot tell who owns the coordinator's socket: it runs no job"
    if coordinator_owner is not None and coordinator_owner not in (0, account.uid):
        return (
            f"node {node} serves the private coordinator of uid {coordinator_owner}: it runs "
            f"only that user's jobs, not those of {account.name} (uid {account.uid})"
        )
    if account.uid == 0 and agent_uid == 0 and not allow_root_jobs:
        return (
            f"node {node} does not run jobs as root ({ROOT_JOBS_SETTING} is false there; "
            "root's jobs need it and [coordinator] allow_root_jobs)"
        )
    return None
