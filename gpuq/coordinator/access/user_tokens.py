"""Per-user tokens for callers across the network (gpuq admin token): issued and revoked by
admins, kept in the store as digests, and in memory for the Authority that checks them."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.domain.limits import brief
from gpuq.errors import InvalidInput
from gpuq.identity import new_user_token, token_digest

log = logging.getLogger(__name__)

_USER_NAME = re.compile(r"[a-z_][a-z0-9_.-]{0,31}\$?", re.IGNORECASE)


class UserTokens:
    def __init__(self, writer: StoreWriter, clock: Callable[[], float]) -> None:
        self.writer = writer
        self.clock = clock
        self.digests: dict[str, str] = {}  # digest -> user (shared with the Authority)

    async def load(self) -> None:
        self.digests.update(await self.writer.read(lambda s: s.user_tokens()))

    async def issue(self, user: str, by: str) -> str:
        """A new per-user token for `user` (gpuq.identity), kept as its digest."""
        check_user_name(user)
        token = new_user_token()
        digest = token_digest(token)
        now = self.clock()
        await self.writer.write(lambda tx: tx.add_user_token(digest, user, by, now))
        self.digests[digest] = user
        log.warning("token issued for %s by %s", user, by)
        return token

    async def revoke(self, user: str, by: str) -> int:
        check_user_name(user)
        count = await self.writer.write(lambda tx: tx.revoke_user_tokens(user))
        for digest in [d for d, owner in self.digests.items() if owner == user]:
            del self.digests[digest]
        log.warning("%d token(s) of %s revoked by %s", count, user, by)
        return count


def check_user_name(user: str) -> None:
    """A Unix user name (as useradd takes them): what a token may be issued for."""
    if not isinstance(user, str) or not _USER_NAME.fullmatch(user):
        raise InvalidInput("user", brief(str(user)), "is not a Unix user name")
