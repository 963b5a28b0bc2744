"""Cron entries (`gpuq cron`): a user's schedule and the spec each firing submits, and when it
last fired.
"""

from __future__ import annotations

import json

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.engine import Connection

from gpuq.domain.codec import spec_from_dict, spec_to_dict
from gpuq.domain.model import CronEntry, JobSpec
from gpuq.errors import NotFound
from gpuq.store.tables import cron_entries


class CronReads:
    """The cron reads of `gpuq.store.api.Store`."""

    engine: Engine

    def cron_entries(self) -> list[CronEntry]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(cron_entries).order_by(cron_entries.c.id)).all()
        return [
            CronEntry(
                row.id,
                row.user,
                row.schedule,
                spec_from_dict(json.loads(row.spec)),
                row.created_at,
                row.last_fire,
            )
            for row in rows
        ]


class CronWrites:
    """The cron writes of `gpuq.store.api.StoreTx`, within its transaction."""

    conn: Connection

    def add_cron(self, user: str, schedule: str, spec: JobSpec, now: float) -> int:
        row = {
            "user": user,
            "schedule": schedule,
            "spec": json.dumps(spec_to_dict(spec), separators=(",", ":")),
            "created_at": now,
            "last_fire": now,
        }
        return int(
            self.conn.execute(insert(cron_entries).returning(cron_entries.c.id), row).scalar_one()
        )

    def remove_cron(self, entry_id: int) -> None:
        result = self.conn.execute(cron_entries.delete().where(cron_entries.c.id == entry_id))
        if result.rowcount != 1:
            raise NotFound(f"no cron entry {entry_id}")

    def cron_fired(self, entry_id: int, at: float) -> None:
        self.conn.execute(
            update(cron_entries).where(cron_entries.c.id == entry_id).values(last_fire=at)
        )
