"""The coordinator's side of identity: the handshake socket, and who each call's metadata names.

Every RPC passes the interceptor (gpuq.coordinator.front.rpc_calls) before its request is read;
it asks `Authority.caller` who the metadata names, once per call, and what the caller may do is
decided by gpuq.coordinator.access.permissions. The dashboard asks the same for its sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import pwd
import time
from collections.abc import Callable
from pathlib import Path

from gpuq.errors import PermissionDenied
from gpuq.identity import (
    MAX_CREDENTIAL,
    Caller,
    Unauthenticated,
    check_node_name,
    keys_match,
    node_key_file,
    peer_uid,
    read_key_file,
    sign_credential,
    token_digest,
    verify_credential,
)

log = logging.getLogger(__name__)
AGENT_SERVICE = "/gpuq.v1.AgentLink/"
GROUP_CACHE = 30.0  # seconds an admin-group lookup is reused
CALLER_CACHE = 10_000  # authorization values whose caller is remembered


class Authority:
    """Turns a call's `authorization` metadata into a Caller, or refuses it."""

    def __init__(
        self,
        key: bytes,
        nodes_dir: Path,
        admin_group: str,
        tokens: dict[str, str],
        clock: Callable[[], float] = time.time,
        *,
        serves_everyone: bool,
    ) -> None:
        self.key = key
        self.nodes_dir = nodes_dir
        self.admin_group = admin_group
        self.tokens = tokens  # digest -> user
        self.clock = clock
        self.own_uid = os.geteuid()
        self.own_user = _user_name(self.own_uid) or str(self.own_uid)
        # root, or the configured service user (gpuq.identity.serves_every_user); otherwise a
        # user's private coordinator, which serves only that user
        self.serves_everyone = serves_everyone
        self._admins: tuple[float, frozenset[str]] = (-GROUP_CACHE, frozenset())
        self._callers: dict[str, tuple[Caller, float]] = {}

    # ---- who calls ---------------------------------------------------------------------------

    def caller(self, method: str, authorization: str | None) -> Caller:
        """Unauthenticated when the metadata names nobody; PermissionDenied when it names
        someone this coordinator does not serve."""
        if not authorization or len(authorization) > MAX_CREDENTIAL:
            raise Unauthenticated("the call carries no gpuq credential")
        now = self.clock()
        cached = self._callers.get(authorization)
        if cached is not None and cached[0].how == "token" and not self._token_valid(authorization):
            cached = None  # revoked since: the next lines say so
        if cached is not None and cached[1] > now:
            caller = cached[0]
        else:
            caller, until = self._identify(authorization, now)
            if len(self._callers) >= CALLER_CACHE:
                self._callers.clear()
            self._callers[authorization] = (caller, until)
        agent_call = method.startswith(AGENT_SERVICE)
        if agent_call and caller.node is None:
            raise Unauthenticated("only a node's agent may open the agent stream (a node key)")
        if not agent_call and caller.node is not None:
            raise Unauthenticated("a node key is not a user's credential")
        return caller

    def _identify(self, authorization: str, now: float) -> tuple[Caller, float]:
        scheme, _, value = authorization.partition(" ")
        if scheme == "Bearer":
            uid = verify_credential(self.key, value, now)
            return self._local(uid), min(now + 60.0, float(value.split(".")[2]))
        if scheme == "Token":
            user = self.tokens.get(token_digest(value))
            if user is None:
                raise Unauthenticated("an unknown or revoked gpuq token")
            return self._served(user, user_uid(user), "token"), now + 60.0
        if scheme == "Node":
            node, _, key = value.partition(" ")
            check_node_name(node)
            try:
                expected = read_key_file(node_key_file(self.nodes_dir, node))
            except PermissionDenied:
                raise Unauthenticated(
                    f"node {node} is not configured here (no key {self.nodes_dir}/{node}.key; "
                    f"`gpuq admin node-key {node}` makes one)"
                ) from None
            if not keys_match(expected, key):
                raise Unauthenticated(f"a wrong key for node {node}")
            return Caller("", None, node=node, how="node key"), now + 10.0
        raise Unauthenticated("an unknown kind of gpuq credential")

    def _token_valid(self, authorization: str) -> bool:
        return token_digest(authorization.partition(" ")[2]) in self.tokens

    def _local(self, uid: int) -> Caller:
        user = _user_name(uid)
        if user is None:
            raise PermissionDenied(f"uid {uid} has no user name on the coordinator's machine")
        return self._served(user, uid, "socket")

    def _served(self, user: str, uid: int | None, how: str) -> Caller:
        if not self.serves_everyone and user != self.own_user:
            raise PermissionDenied(
                f"this coordinator runs as {self.own_user} and serves only {self.own_user}"
            )
        return Caller(user, uid, admin=self.is_admin(user, uid), how=how)

    def is_admin(self, user: str, uid: int | None) -> bool:
        """Root, the coordinator's own user, and members of the admin group."""
        if uid == 0 or user == self.own_user:
            return True
        return user in self._admin_members()

    def _admin_members(self) -> frozenset[str]:
        at, members = self._admins
        now = time.monotonic()
        if now - at < GROUP_CACHE:
            return members
        try:
            group = grp.getgrnam(self.admin_group)
        except KeyError:
            members = frozenset()
        else:
            primary = {e.pw_name for e in pwd.getpwall() if e.pw_gid == group.gr_gid}
            members = frozenset(group.gr_mem) | primary
        self._admins = (now, members)
        return members

    # ---- the handshake -------------------------------------------------------------------

    def credential_for(self, uid: int) -> str:
        """A credential for a local caller of `uid`, or the one-line reason it gets none."""
        user = _user_name(uid)
        if not self.serves_everyone and uid != self.own_uid:
            return (
                f"refused: this coordinator runs as {self.own_user} and serves only {self.own_user}"
            )
        if user is None:
            return f"refused: uid {uid} has no user name here"
        return sign_credential(self.key, uid, self.clock())


def user_groups(user: str) -> frozenset[str]:
    """The Unix groups `user` is in on the coordinator's machine (its primary group
    included; none for a user unknown here): what `[partitions.NAME] allow_groups` checks."""
    try:
        gid = pwd.getpwnam(user).pw_gid
        gids = os.getgrouplist(user, gid)
    except (KeyError, OSError):
        return frozenset()
    names = set()
    for each in gids:
        try:
            names.add(grp.getgrgid(each).gr_name)
        except KeyError:
            continue
    return frozenset(names)


def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def user_uid(user: str) -> int | None:
    """The uid of a user name on this machine; None when there is none."""
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


async def serve_handshake(authority: Authority, path: Path) -> asyncio.AbstractServer:
    """The handshake socket (mode 0666: anyone may learn who they are): one credential per
    connection, for the uid the kernel reports; nothing is read from the caller."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            uid = peer_uid(writer.get_extra_info("socket"))
            writer.write(authority.credential_for(uid).encode() + b"\n")
            await asyncio.wait_for(writer.drain(), 5.0)
        except (OSError, TimeoutError) as exc:
            log.debug("handshake failed: %s", exc)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    path.unlink(missing_ok=True)  # this coordinator holds the home's lock: a leftover
    server = await asyncio.start_unix_server(answer, path=os.fspath(path))
    os.chmod(path, 0o666)
    return server
