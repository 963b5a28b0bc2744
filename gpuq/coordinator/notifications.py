"""Telling people: mail through the local MTA (SLURM's --mail-type), users' webhooks
(--notify URL) and admins' webhooks (node and GPU health).

The event bus hands every event to `published`, which only looks at the job's spec and
queues it: nothing here blocks or slows the scheduling path. A task decides (gpuq.domain.notices)
what each event means and starts one delivery task per message; deliveries run blocking I/O in
a small pool of threads of their own, at most a few at once per receiving host, so that one slow
or dead receiver delays others little. At most MAX_PENDING events and deliveries wait; beyond
that they are dropped, counted and logged (once a minute).

Deliveries survive a coordinator's crash or restart: each is first written to the store's
outbox (the `notifications` table, through the writer, which batches), then attempted; sent or
given up, its row is deleted; a failure worth retrying records its attempts and the time of the
next one there. `start` resumes the rows an earlier coordinator left (attempts counted on, a
user's webhook checked against SSRF again at send time, like any), before any new delivery is
written, so none is loaded twice; `close` leaves unsent rows for the next start. So a delivery
goes out at least once: one in flight when the coordinator dies may go out again. The store
being down never blocks the scheduling path (events only queue here) nor loses what is in
memory: a delivery whose row cannot be written is still attempted, from memory only (logged
once per outage). Events not yet turned into deliveries are still memory only.

Sending one delivery (the MTA, a webhook's POST pinned to the address that passed the SSRF
check) is gpuq.coordinator.notification_sending's.

`sent` counts outcomes for the metrics: (kind, outcome), kind "mail" or "webhook" (admin ones
too), outcome "sent", "failed" (given up) or "dropped" (the queue was full).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.background_tasks import Background
from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.coordinator.memory.node_table import NodeTable, unit_states
from gpuq.coordinator.memory.scheduler_inputs import SchedulerInputs
from gpuq.coordinator.notification_sending import Refused, post, send_mail
from gpuq.domain.model import Job, JobEvent
from gpuq.domain.notices import (
    Change,
    HealthChange,
    backoff,
    due_warnings,
    health_changes,
    mail_kinds,
    mail_message,
    passed_warnings,
    redact,
    triggered,
)
from gpuq.domain.notify import check_mail_user
from gpuq.domain.states import JobState
from gpuq.errors import InvalidInput
from gpuq.store.records import Notification

log = logging.getLogger(__name__)

MAX_PENDING = 10_000  # events and deliveries waiting, at most
MAX_PENDING_PER_USER = 1_000  # of them about one user's jobs
THREADS = 8  # blocking deliveries at once
PER_HOST = 2  # of them to one receiving host (or to the MTA)
TICK = 1.0  # seconds between looks at time limits and at nodes' health
DROP_LOG_EVERY = 60.0
DIRTY_GRACE = 60.0  # seconds a unit stays dirty before admins are told
REMEMBERED = 10_000  # arrays whose BEGIN or END mail went out, remembered at most


@dataclass(frozen=True, slots=True)
class Delivery:
    kind: str  # "mail" or "webhook"
    target: str  # a recipient, or a URL
    data: bytes
    trusted: bool = False  # an admin's webhook: any address
    owner: str = ""  # the user whose job it tells of ("": an admin's, or resumed from the store)


class Notifier:
    def __init__(
        self,
        settings: CoordinatorSettings,
        writer: StoreWriter,
        jobs: LiveJobs,
        nodes: NodeTable,
        inputs: SchedulerInputs,
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.writer = writer
        self.jobs = jobs
        self.nodes = nodes
        self.inputs = inputs
        self.clock = clock
        self.sent: collections.Counter[tuple[str, str]] = collections.Counter()
        self._inbox: collections.deque[tuple[JobEvent, Job]] = collections.deque()
        self._wake = asyncio.Event()
        self._look_again = asyncio.Event()  # a job that wants time-limit warnings started
        self._pending = 0  # inbox items and deliveries not yet done
        self._background = Background("a notification")
        self._pool: ThreadPoolExecutor | None = None
        self._hosts: dict[str, asyncio.Semaphore] = {}
        self._dropped_logged = 0.0
        self._array_begun: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._array_ended: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._warned: dict[tuple[int, int], set[str]] = {}  # (job, start) -> warnings sent
        self._health: dict[tuple[str, str], tuple[str, str, int | None]] | None = None
        self._dirty_since: dict[tuple[str, str], float] = {}  # unit -> dirty since
        self._by_user: collections.Counter[str] = collections.Counter()  # pending per owner
        self._closed = False
        self._resumed = asyncio.Event()  # the outbox was read: new rows may be written
        self._outbox_down = False  # an outbox write failed (logged once until one lands)
        self._unkept = 0  # deliveries in memory only (their row could not be written)

    @property
    def pending(self) -> int:
        """Events and deliveries waiting or in progress."""
        return self._pending

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._background.spawn(self._resume())
        self._background.spawn(self._run())
        self._background.spawn(self._tick())

    async def close(self) -> None:
        """Stop at once: deliveries waiting or retrying stay in the outbox for the next start;
        what only memory held (events not yet decided, rows not written) is lost (logged)."""
        self._closed = True
        unkept = self._unkept + len(self._inbox)
        await self._background.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._pending:
            log.warning(
                "notifications: %d not delivered at shutdown: %d wait in the store for the "
                "next start, %d were in memory only and are lost",
                self._pending,
                self._pending - unkept,
                unkept,
            )

    async def _resume(self) -> None:
        """Take up the outbox rows an earlier coordinator left (its crash, its restart)."""
        room = max(0, MAX_PENDING - self._pending)
        try:
            rows = await self.writer.read(lambda s: s.due_notifications(math.inf, room))
        except Exception as exc:
            log.warning("notifications: the outbox was not read (%s); it waits a restart", exc)
            return
        finally:
            self._resumed.set()
        for row in rows:
            if self._closed or row.id is None:
                return
            if self._pending >= MAX_PENDING:  # left in the store, for a later start
                log.warning("notifications: the outbox holds more than there is room for")
                return
            self._pending += 1
            delivery = Delivery(row.kind, row.target, row.body, row.trusted)
            self._background.spawn(self._attempts(delivery, row.id, row.attempts, row.next_at))
        if rows:
            log.info("notifications: %d resumed from the outbox", len(rows))

    # ---- the scheduling path: queue only ------------------------------------------------

    def published(self, event: JobEvent, job: Job | None) -> None:
        """An event of `job` (an event bus listener): queued when its job asked to be told."""
        if job is None or self._closed:
            return
        spec = job.spec
        if not spec.mail_types and spec.notify_url is None:
            return
        if event.to_state is JobState.RUNNING and any(
            t.startswith("TIME_LIMIT_") for t in spec.mail_types
        ):
            self._look_again.set()  # its time limit's warnings are looked for each TICK
        if event.from_state is event.to_state:
            return  # an update, not a state change
        if not self._room(
            [k for k, v in (("mail", spec.mail_types), ("webhook", spec.notify_url)) if v],
            job.user,
        ):
            return
        self._inbox.append((event, job))
        self._wake.set()

    def _room(self, kinds: list[str], owner: str = "") -> bool:
        """Room for one more event or delivery: MAX_PENDING in all, MAX_PENDING_PER_USER of one
        user's (so that one user's thousands of jobs with a dead webhook cannot crowd out
        everyone else's); taken until `_release`."""
        mine = self._by_user[owner] if owner else 0
        if self._pending < MAX_PENDING and mine < MAX_PENDING_PER_USER:
            self._pending += 1
            if owner:
                self._by_user[owner] += 1
            return True
        for kind in kinds:
            self.sent[(kind, "dropped")] += 1
        now = time.monotonic()
        if now - self._dropped_logged >= DROP_LOG_EVERY:
            self._dropped_logged = now
            full = f"{owner} has {mine}" if mine >= MAX_PENDING_PER_USER else f"{self._pending}"
            log.warning(
                "notifications: %s waiting; dropping more (%d dropped so far)",
                full,
                sum(n for (_, outcome), n in self.sent.items() if outcome == "dropped"),
            )
        return False

    def _release(self, owner: str) -> None:
        self._pending -= 1
        if owner:
            self._by_user[owner] -= 1
            if not self._by_user[owner]:
                del self._by_user[owner]

    # ---- deciding ------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._inbox:
                event, job = self._inbox.popleft()
                try:
                    await self._decide(event, job)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("notification for job %d not decided", event.job_id)
                finally:
                    self._release(job.user)

    async def _decide(self, event: JobEvent, job: Job) -> None:
        spec = job.spec
        ended = not event.to_state.is_live
        if ended:
            # the store has the result by now (memory follows it): exit code, times
            job_id = event.job_id
            try:
                job = await self.writer.read(lambda s: s.get_job(job_id))
            except Exception as exc:  # the store blinked: tell without the exit code
                log.debug("job %d not read for its notification: %s", job_id, exc)
        # preempted or lost, and put straight back in the queue: a requeue, not an end
        current = self.jobs.jobs.get(event.job_id)
        requeued = ended and current is not None and current.state.is_live
        change = _change(event, job, self.jobs.jobs.get(event.job_id))
        split = event.from_state is None and job.array_job_id not in (None, job.id)
        if spec.notify_url is not None and not split:  # a split task is no state change
            self._deliver(Delivery("webhook", spec.notify_url, change.body(), owner=job.user))
        kinds = mail_kinds(
            spec.mail_types, triggered(event.from_state, event.to_state, event.reason, requeued)
        )
        if not kinds:
            return
        array = job.array_job_id
        if (
            array is not None
            and "ARRAY_TASKS" not in spec.mail_types
            and kinds
            & {
                "BEGIN",
                "END",
                "FAIL",
                "TIME_LIMIT",
            }
        ):
            await self._array_mail(change, kinds, array, job)
            return
        self._mail(change, kinds, job)

    async def _array_mail(
        self, change: Change, kinds: frozenset[str], array: int, job: Job
    ) -> None:
        """SLURM without ARRAY_TASKS: one BEGIN when its first task starts, one END (FAIL)
        when its last task ends, with the tasks' counts."""
        if "BEGIN" in kinds:
            if array not in self._array_begun:
                _remember(self._array_begun, array)
                self._mail(change, frozenset({"BEGIN"}), job)
            return
        if self.jobs.is_live(array) or array in self._array_ended:
            return
        _remember(self._array_ended, array)
        try:
            states = await self.writer.read(lambda s: s.array_states([array]))
        except Exception as exc:
            log.debug("array %d not read for its notification: %s", array, exc)
            states = {}
        counts = {state.value: n for state, n in states.get(array, {}).items()}
        wanted = set(job.spec.mail_types)
        found = {"END"} & wanted
        if any(JobState(s) is not JobState.COMPLETED for s in counts) and "FAIL" in wanted:
            found.add("FAIL")
        if JobState.TIMEOUT.value in counts and "TIME_LIMIT" in wanted:
            found.add("TIME_LIMIT")
        if found:
            self._mail(change, frozenset(found), job, counts or {change.state: 1})

    def _mail(
        self,
        change: Change,
        kinds: frozenset[str],
        job: Job,
        array_counts: dict[str, int] | None = None,
    ) -> None:
        recipient = job.spec.mail_user or job.user
        try:
            check_mail_user(recipient)  # never an option to the MTA, never a header's break
        except InvalidInput:
            log.warning("job %d: no mail to %r: not an address", job.id, recipient[:80])
            self.sent[("mail", "failed")] += 1
            return
        message = mail_message(change, kinds, self._sender(), recipient, array_counts)
        self._deliver(Delivery("mail", recipient, message.as_bytes(), owner=job.user))

    def _sender(self) -> str:
        return self.settings.mail_from or f"gpuq@{socket.gethostname()}"

    # ---- the periodic look: time limits, health ------------------------------------------

    async def _tick(self) -> None:
        """Look each TICK while there is something to look at: a running job that wants
        time-limit warnings, or admin webhooks for nodes' health. Else sleep until such a job
        starts (an idle coordinator's loop stays asleep)."""
        while True:
            try:
                self._time_limits()
                self._health_look()
            except Exception:
                log.exception("notifications: periodic look failed")
            if self._warned or self.settings.admin_webhooks:
                await asyncio.sleep(TICK)
            else:
                self._look_again.clear()
                await self._look_again.wait()

    def _time_limits(self) -> None:
        now = self.clock()
        running: set[tuple[int, int]] = set()
        for job in self.jobs.in_state(JobState.RUNNING):
            wanted = [t for t in job.spec.mail_types if t.startswith("TIME_LIMIT_")]
            if not wanted or job.start_time is None:
                continue
            limit = self.inputs.time_limit_seconds(job)
            if limit is None:
                continue
            key = (job.id, job.start_count)
            running.add(key)
            elapsed = now - job.start_time
            sent = self._warned.setdefault(key, set())
            due = due_warnings(wanted, elapsed, limit, sent)
            sent.update(passed_warnings(elapsed, limit))
            if due:
                change = _change(JobEvent(job.id, now, job.state, job.state, ""), job, job)
                self._mail(change, frozenset(due), job)
        for key in set(self._warned) - running:
            del self._warned[key]

    def _health_look(self) -> None:
        hooks = self.settings.admin_webhooks
        if not hooks:
            return
        at = self.clock()
        now: dict[tuple[str, str], tuple[str, str, int | None]] = {}
        for name, entry in self.nodes.nodes.items():
            down = entry.down_reason(self.nodes.drains.get((name, "")))
            if down is None:
                state = "up"
            elif entry.node.state.value != "up" or not entry.connected:
                state = "down"
            else:
                state = "drained"
            now[(name, "")] = (state, down or "", None)
            states = unit_states(entry, self.nodes.drains)
            for unit in entry.node.units:
                unit_state = states.get(unit.uuid)
                if unit_state is not None:
                    health = self._settled((name, unit.uuid), unit_state.health.value, at)
                    reason = unit_state.reason if health == unit_state.health.value else ""
                    now[(name, unit.uuid)] = (health, reason, unit.index)
        before, self._health = self._health, now
        if before is None:
            return  # the first look: what is, not a change
        for change in health_changes(before, now, self.clock()):
            self.health_changed(change)

    def _settled(self, key: tuple[str, str], health: str, at: float) -> str:
        """A unit is dirty for a few seconds after most job ends (the agent waits for the
        job's GPU processes to go): it counts as ok until it stayed dirty DIRTY_GRACE seconds,
        so admins hear of a stuck GPU, not of every job's end."""
        if health != "dirty":
            self._dirty_since.pop(key, None)
            return health
        since = self._dirty_since.setdefault(key, at)
        return health if at - since >= DIRTY_GRACE else "ok"

    def health_changed(self, change: HealthChange) -> None:
        """To every admin webhook."""
        for url in self.settings.admin_webhooks:
            self._deliver(Delivery("webhook", url, change.body(), trusted=True))

    # ---- delivering ----------------------------------------------------------------------

    def _deliver(self, delivery: Delivery) -> None:
        if self._closed or not self._room([delivery.kind], delivery.owner):
            return
        self._background.spawn(self._attempts(delivery))

    async def _attempts(
        self,
        delivery: Delivery,
        row_id: int | None = None,
        first: int = 0,
        next_at: float | None = None,
    ) -> None:
        """Deliver, retrying with backoff. A new delivery (row_id None) is written to the
        outbox first; a resumed one (its row, `first` attempts failed) waits until `next_at`."""
        retries = self.settings.notify_retries
        shown = delivery.target if delivery.kind == "mail" else redact(delivery.target)
        unkept = False
        try:
            if row_id is None:
                row_id = await self._keep(delivery)
                unkept = row_id is None
                self._unkept += unkept
            elif next_at is not None and next_at > self.clock():
                await asyncio.sleep(next_at - self.clock())
            outcome = "failed"
            if first > retries:
                log.warning("%s to %s failed %d times; giving up", delivery.kind, shown, first)
            for attempt in range(first, retries + 1):
                try:
                    async with self._slot(delivery):
                        await self._once(delivery)
                    outcome = "sent"
                    break
                except Refused as exc:
                    log.warning("%s to %s refused: %s", delivery.kind, shown, exc)
                    break
                except Exception as exc:  # a connection error, a 5xx, a failed MTA
                    if attempt == retries:
                        log.warning(
                            "%s to %s failed %d times; giving up: %s",
                            delivery.kind,
                            shown,
                            attempt + 1,
                            exc,
                        )
                        break
                    log.info("%s to %s failed (%s); trying again", delivery.kind, shown, exc)
                delay = backoff(attempt)
                if row_id is not None:
                    self._retry_later(row_id, attempt + 1, self.clock() + delay)
                await asyncio.sleep(delay)
            self.sent[(delivery.kind, outcome)] += 1
            if row_id is not None:
                self._background.spawn(self._forget(row_id))
        finally:
            self._release(delivery.owner)
            self._unkept -= unkept

    async def _keep(self, delivery: Delivery) -> int | None:
        """Write a new delivery to the outbox: its row's id, None when the store refused (it
        is then attempted from memory only). Waits until the outbox left by an earlier
        coordinator is read, so that this row is not resumed a second time."""
        await self._resumed.wait()
        now = self.clock()
        row = Notification(
            delivery.kind, delivery.target, delivery.data, delivery.trusted, 0, now, now
        )
        try:
            [row_id] = await self.writer.write(
                lambda tx: tx.add_notifications([row]), fail_fast=True
            )
        except Exception as exc:
            if not self._outbox_down:
                self._outbox_down = True
                log.warning(
                    "notifications: the outbox cannot be written (%s); deliveries are "
                    "attempted from memory only (a restart loses those waiting) until it can",
                    exc,
                )
            return None
        if self._outbox_down:
            self._outbox_down = False
            log.warning("notifications: the outbox is written again")
        return row_id

    def _retry_later(self, row_id: int, attempts: int, next_at: float) -> None:
        """Record a failed attempt in the outbox, at best: should the store be down, a
        restart only counts fewer attempts."""

        async def record() -> None:
            try:
                await self.writer.write(
                    lambda tx: tx.retry_notification(row_id, attempts, next_at), fail_fast=True
                )
            except Exception as exc:
                log.debug("notification %d: its attempts not recorded: %s", row_id, exc)

        self._background.spawn(record())

    async def _forget(self, row_id: int) -> None:
        """Delete a sent (or given up) delivery's row; a store that is down is waited out, so
        that a later start does not send it again (it still may, if this one stops first)."""
        await self.writer.write(lambda tx: tx.delete_notifications([row_id]))

    def _slot(self, delivery: Delivery) -> asyncio.Semaphore:
        if delivery.kind == "mail":
            key = "mail"
        else:
            try:
                key = urlsplit(delivery.target).hostname or ""
            except ValueError:
                key = ""
        if len(self._hosts) > 1000:  # forget the idle ones
            self._hosts = {k: s for k, s in self._hosts.items() if s.locked()}
        return self._hosts.setdefault(key, asyncio.Semaphore(PER_HOST))

    async def _once(self, delivery: Delivery) -> None:
        if delivery.kind == "mail":
            await send_mail(self.settings.mail_program, delivery.target, delivery.data)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="gpuq-notify")
        allow = () if delivery.trusted else self.settings.notify_allow
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            self._pool, post, delivery.target, delivery.data, delivery.trusted, allow
        )


def _remember(seen: collections.OrderedDict[int, None], key: int) -> None:
    seen[key] = None
    while len(seen) > REMEMBERED:
        seen.popitem(last=False)


def _change(event: JobEvent, job: Job, live: Job | None) -> Change:
    result = job.result
    start = job.start_time if job.start_time is not None else (live.start_time if live else None)
    return Change(
        job_id=event.job_id,
        array_job_id=job.array_job_id,
        array_task_id=job.array_task_id,
        name=job.spec.name,
        user=job.user,
        from_state=event.from_state.value if event.from_state is not None else None,
        state=event.to_state.value,
        reason=event.reason,
        at=event.at,
        exit_code=result.exit_code if result is not None else None,
        signal=result.signal if result is not None else None,
        submit_time=job.submit_time,
        start_time=event.at if event.to_state is JobState.RUNNING else start,
        end_time=job.end_time if not event.to_state.is_live else None,
    )
