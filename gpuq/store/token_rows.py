"""Per-user tokens: only their digests are stored, each with its user. And the dashboard's
revoked credentials (used sign-in tickets, signed-out sessions): digests too, each until it
would have expired anyway."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import Engine, delete, insert, select
from sqlalchemy.engine import Connection

from gpuq.store.tables import revoked_web_credentials, user_tokens

_revoked = revoked_web_credentials


class TokenReads:
    """The token reads of `gpuq.store.api.Store`."""

    engine: Engine

    def user_tokens(self) -> dict[str, str]:
        """Every per-user token's digest and its user."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(user_tokens.c.digest, user_tokens.c.user)).all()
        return {row.digest: row.user for row in rows}

    def revoked_web_credentials(self, now: float) -> dict[str, float]:
        """The dashboard's revoked credentials not yet expired at `now`: digest -> expiry."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(_revoked.c.digest, _revoked.c.expires_at).where(_revoked.c.expires_at >= now)
            ).all()
        return {row.digest: row.expires_at for row in rows}


class TokenWrites:
    """The token writes of `gpuq.store.api.StoreTx`, within its transaction."""

    conn: Connection

    def add_user_token(self, digest: str, user: str, by: str, at: float) -> None:
        self.conn.execute(
            insert(user_tokens).values(digest=digest, user=user, created_by=by, created_at=at)
        )

    def revoke_user_tokens(self, user: str) -> int:
        """How many of `user`'s tokens there were."""
        return int(
            self.conn.execute(delete(user_tokens).where(user_tokens.c.user == user)).rowcount
        )

    def revoke_web_credentials(self, revoked: Mapping[str, float], now: float) -> int:
        """Keep `revoked` (digest -> expiry; one kept already stays as it is) and prune those
        expired before `now`; how many were pruned."""
        pruned = self.conn.execute(delete(_revoked).where(_revoked.c.expires_at < now)).rowcount
        if revoked:
            kept = set(
                self.conn.execute(
                    select(_revoked.c.digest).where(_revoked.c.digest.in_(list(revoked)))
                ).scalars()
            )
            rows = [{"digest": d, "expires_at": at} for d, at in revoked.items() if d not in kept]
            if rows:
                self.conn.execute(insert(_revoked), rows)
        return int(pruned)
