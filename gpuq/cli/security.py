"""`gpuq admin`: what an admin sets up for identity and trust (README "Security").

gpuq admin token USER [--revoke]   a per-user token for calls over TCP (shown once)
gpuq admin node-key NODE           the key that lets node NODE's agent register
gpuq admin certs ...               a site CA and TLS certificates (gpuq.cli.certs)
gpuq admin doctor [--json]         check this machine, each problem with its fix
                                   (gpuq.cli.doctor_verb)
gpuq admin install [--role ...]    this machine's services: user, config, folders, units
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gpuq.cli import render


@click.group()
def admin() -> None:
    """Set up identity and trust (user tokens, node keys, TLS certificates), and check a
    machine (doctor)."""


@admin.command()
@click.argument("user")
@click.option("--revoke", is_flag=True, help="revoke every token of USER instead")
@click.pass_obj
def token(obj: Any, /, user: str, revoke: bool) -> int:
    """Issue a token for USER, who calls the coordinator over TCP from another machine (admins
    only). It is printed once; the user saves it in ~/.config/gpuq/token (mode 0600). Local
    callers need none: the coordinator asks the kernel who they are."""
    client = obj.client()
    if revoke:
        count = client.revoke_tokens(user)
        click.echo(f"revoked {count} token(s) of {render.printable(user)}")
        return 0
    click.echo(client.issue_token(user))
    return 0


@admin.command("node-key")
@click.argument("node")
@click.pass_obj
def node_key(obj: Any, /, node: str) -> int:
    """Make (or show where to find) the key of node NODE in the coordinator's nodes folder:
    only nodes with a key there may register. Copy it to the node as the file its agent's
    [agent] node_key names (mode 0600, owned by root). Made by root where the coordinator runs
    as [coordinator] service_user, the key is that user's, so that the coordinator can read it."""
    import os

    from gpuq.errors import InvalidInput
    from gpuq.identity import Unauthenticated, create_key_file, node_key_file, service_uid

    settings = obj.settings()
    try:
        path = node_key_file(settings.nodes_dir, node)
    except Unauthenticated:
        raise InvalidInput(
            "NODE", node, "is not a node name (letters, digits, '.', '_', '-')"
        ) from None
    existed = path.exists()
    owner = service_uid(settings.coordinator.service_user) if os.geteuid() == 0 else None
    create_key_file(path, owner=owner)
    click.echo(f"{'exists' if existed else 'made'}: {render.printable(str(path))}")
    click.echo(
        f"copy it to {render.printable(node)} (e.g. /etc/gpuq/node.key, mode 0600) and set "
        '[agent] node_key = "/etc/gpuq/node.key" there; delete it here to refuse the node'
    )
    return 0


@admin.command()
@click.option(
    "--role",
    type=click.Choice(["coordinator", "agent", "both"]),
    default="both",
    show_default=True,
    help="the services this machine runs",
)
@click.option("--node", default=None, help="this node's name [default: the short host name]")
@click.option("--user", default="gpuq", show_default=True, help="the coordinator's system user")
@click.option("--admin-group", default="gpuq-admin", show_default=True, help="gpuq's admins")
@click.option(
    "--coordinator",
    "coordinator",
    default=None,
    metavar="HOST:PORT",
    help="an agent-only node: the coordinator's agent_listen",
)
@click.option(
    "--root",
    type=click.Path(file_okay=False),
    default=None,
    help="write everything under this scratch folder instead (no users made, nothing chowned)",
)
def install(
    role: str,
    node: str | None,
    user: str,
    admin_group: str,
    coordinator: str | None,
    root: str | None,
) -> int:
    """Set this machine up for gpuq's services (as root): the coordinator's system user and the
    admin group, /etc/gpuq/config.toml (only if missing), the state folders, this node's key
    and systemd units that start this installation's gpuq. Safe to run again: it says what it
    kept. Then it prints what to start."""
    from gpuq.admin.install import Target, make_plan
    from gpuq.admin.install import install as set_up
    from gpuq.errors import InvalidInput

    plan = make_plan(role, node, user, admin_group, coordinator)
    if root == "":  # `--root "$DIR"` with DIR unset: not this folder, not the machine
        raise InvalidInput("--root", root, "an empty folder name; give the scratch folder")
    target = Target.of(None if root is None else Path(root).absolute())
    set_up(plan, target, lambda line: click.echo(render.printable(line)))
    return 0


def _add_verbs() -> None:
    from gpuq.cli.certs import certs
    from gpuq.cli.doctor_verb import doctor

    admin.add_command(certs)
    admin.add_command(doctor)


_add_verbs()
