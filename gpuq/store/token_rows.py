"""Per-user tokens: only their digests are stored, each with its user."""

from __future__ import annotations

from sqlalchemy import Engine, delete, insert, select
from sqlalchemy.engine import Connection

from gpuq.store.tables import user_tokens


class TokenReads:
    """The token reads of `gpuq.store.api.Store`."""

    engine: Engine

    def user_tokens(self) -> dict[str, str]:
        """Every per-user token's digest and its user."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(user_tokens.c.digest, user_tokens.c.user)).all()
        return {row.digest: row.user for row in rows}


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
