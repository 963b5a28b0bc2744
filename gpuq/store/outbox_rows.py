"""The notifications outbox (gpuq.coordinator.notifications): mails and webhooks written before
their first attempt and deleted once sent or given up, so that a coordinator's next start
resumes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import Engine, delete, func, insert, select, update
from sqlalchemy.engine import Connection

from gpuq.store.records import Notification
from gpuq.store.tables import notifications


class OutboxReads:
    """The outbox reads of `gpuq.store.api.Store`."""

    engine: Engine

    def due_notifications(self, now: float, limit: int) -> list[Notification]:
        """Outbox rows whose next attempt is due (next_at <= now), oldest first, at most
        `limit`."""
        stmt = (
            select(notifications)
            .where(notifications.c.next_at <= now)
            .order_by(notifications.c.created_at, notifications.c.id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [
                Notification(
                    row.kind,
                    row.target,
                    bytes(row.body),
                    bool(row.trusted),
                    row.attempts,
                    row.next_at,
                    row.created_at,
                    row.id,
                )
                for row in conn.execute(stmt)
            ]

    def count_notifications(self) -> int:
        """Outbox rows waiting (due or not)."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(notifications)).scalar_one())


class OutboxWrites:
    """The outbox writes of `gpuq.store.api.StoreTx`, within its transaction."""

    conn: Connection

    def add_notifications(self, items: Sequence[Notification]) -> list[int]:
        """Put mails and webhooks in the outbox (their `id` is ignored); their ids, in order."""
        stmt = insert(notifications).returning(notifications.c.id)
        return [
            int(
                self.conn.execute(
                    stmt,
                    {
                        "kind": item.kind,
                        "target": item.target,
                        "body": item.body,
                        "trusted": item.trusted,
                        "attempts": item.attempts,
                        "next_at": item.next_at,
                        "created_at": item.created_at,
                    },
                ).scalar_one()
            )
            for item in items
        ]

    def delete_notifications(self, ids: Iterable[int]) -> int:
        """Take sent (or given up) mails and webhooks out of the outbox; how many were there."""
        wanted = list(ids)
        if not wanted:
            return 0
        result = self.conn.execute(delete(notifications).where(notifications.c.id.in_(wanted)))
        return int(result.rowcount)

    def retry_notification(self, notification_id: int, attempts: int, next_at: float) -> bool:
        """Record a failed attempt: `attempts` failed so far, the next at `next_at`. False when
        the row is gone (sent or given up meanwhile)."""
        result = self.conn.execute(
            update(notifications)
            .where(notifications.c.id == notification_id)
            .values(attempts=attempts, next_at=next_at)
        )
        return bool(result.rowcount)
