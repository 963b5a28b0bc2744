"""`gpuq cron`: recurring submissions (SLURM's scrontab), fired by APScheduler's CronTrigger.

Entries live in the store and survive restarts. The rule for fires missed while the
coordinator was down: each entry makes up for them once, at start, with one job however many
fires it missed (the coordinator logs it); then it goes on with its schedule.

Schedules are classic cron: minute hour day-of-month month day-of-week, with day-of-week 0 or 7
meaning Sunday. APScheduler 3 counts weekdays from Monday, so numeric weekdays are translated
to names before they reach it.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Callable
from typing import Any

from apscheduler.triggers.cron import CronTrigger

from gpuq.coordinator.access.permissions import check_removes_cron
from gpuq.coordinator.changes.effects import Cause
from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.workload.submissions import Submissions
from gpuq.domain.model import CronEntry, JobSpec
from gpuq.errors import InvalidInput, NotFound
from gpuq.identity import Caller

log = logging.getLogger(__name__)
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat", "sun"]


def weekday_names(field: str) -> str:
    """Cron's day-of-week field with numbers as names (0 and 7 are Sunday)."""
    parts = []
    for part in field.split(","):
        span, _, step = part.partition("/")
        if not re.fullmatch(r"\*|\d(-\d)?", span) or (step and not step.isdigit()):
            parts.append(part)  # names, or nonsense that CronTrigger will reject
            continue
        low, _, high = span.partition("-")
        if span == "*":
            low, high = "0", "6"
        first, last = int(low), int(high or low)
        if last > 7 or first > last:
            raise InvalidInput("schedule", field, "day of week must be 0-7 (0 and 7 are Sunday)")
        if not step and not high and span != "*":
            parts.append(_DAYS[first])
            continue
        parts += [_DAYS[d] for d in range(first, last + 1, int(step or 1))]
    return ",".join(dict.fromkeys(parts))


MAX_SCHEDULE = 128  # characters (the store's column)


def trigger(schedule: str) -> CronTrigger:
    if len(schedule) > MAX_SCHEDULE or not schedule.isascii() or not schedule.isprintable():
        shown = schedule[:40] + ("..." if len(schedule) > 40 else "")
        raise InvalidInput("schedule", shown, f"at most {MAX_SCHEDULE} printable ASCII characters")
    fields = schedule.split()
    if len(fields) != 5:
        raise InvalidInput("schedule", schedule, "expected five fields: min hour day month weekday")
    if fields[4] != "*":
        fields[4] = weekday_names(fields[4])
    try:
        return CronTrigger.from_crontab(" ".join(fields))
    except ValueError as exc:
        raise InvalidInput("schedule", schedule, str(exc)) from None


def next_fire(schedule: str, after: float) -> float | None:
    moment = dt.datetime.fromtimestamp(after).astimezone()
    fire = trigger(schedule).get_next_fire_time(None, moment + dt.timedelta(microseconds=1))
    return fire.timestamp() if fire is not None else None


class CronService:
    def __init__(
        self,
        writer: StoreWriter,
        submissions: Submissions,
        scheduler: Any,
        clock: Callable[[], float],
    ) -> None:
        self.writer = writer
        self.submissions = submissions
        self.clock = clock
        self.scheduler = scheduler  # an APScheduler AsyncIOScheduler
        self.entries: dict[int, CronEntry] = {}

    async def start(self) -> None:
        """Load entries, make up once for fires missed while down, schedule the rest."""
        now = self.clock()
        for entry in await self.writer.read(lambda s: s.cron_entries()):
            self.entries[entry.id] = entry
            missed = next_fire(entry.schedule, entry.last_fire or entry.created_at)
            if missed is not None and missed <= now:
                await self._fire(entry.id, reason=f"makes up for the fire missed at {missed:.0f}")
            self._schedule(entry)

    def _schedule(self, entry: CronEntry) -> None:
        self.scheduler.add_job(
            self._fire,
            trigger(entry.schedule),
            args=(entry.id,),
            id=f"cron-{entry.id}",
            misfire_grace_time=60,
            coalesce=True,
            max_instances=1,
            replace_existing=True,
        )

    async def _fire(self, entry_id: int, reason: str = "") -> None:
        entry = self.entries.get(entry_id)
        if entry is None:
            return
        now = self.clock()
        try:
            cause = Cause.chore(f"cron entry {entry_id}")
            ids = await self.submissions.submit(entry.spec, entry.user, cause)
            log.info("cron entry %d submitted job %s %s", entry_id, ids[0], reason)
        except Exception:
            log.exception("cron entry %d could not submit its job", entry_id)
        await self.writer.write(lambda tx: tx.cron_fired(entry_id, now))
        self.entries[entry_id] = CronEntry(
            entry.id, entry.user, entry.schedule, entry.spec, entry.created_at, now
        )

    async def add(self, schedule: str, spec: JobSpec, user: str) -> CronEntry:
        now = self.clock()
        if next_fire(schedule, now) is None:  # one clear error before anything is stored
            raise InvalidInput("schedule", schedule, "never fires (no such date)")
        await self.submissions.check(spec, user)
        entry_id = await self.writer.write(lambda tx: tx.add_cron(user, schedule, spec, now))
        entry = CronEntry(entry_id, user, schedule, spec, now, now)
        self.entries[entry_id] = entry
        self._schedule(entry)
        return entry

    async def remove(self, entry_id: int, caller: Caller) -> CronEntry:
        entry = self.entries.get(entry_id)
        if entry is None:
            raise NotFound(f"no cron entry {entry_id}")
        check_removes_cron(caller, entry.user, entry_id)
        if entry.user != caller.user:
            log.warning("admin %s removed cron entry %d of %s", caller.user, entry_id, entry.user)
        await self.writer.write(lambda tx: tx.remove_cron(entry_id))
        del self.entries[entry_id]
        if self.scheduler.get_job(f"cron-{entry_id}") is not None:
            self.scheduler.remove_job(f"cron-{entry_id}")
        return entry

    def list(self) -> list[CronEntry]:
        return sorted(self.entries.values(), key=lambda e: e.id)
