"""Watch streams (the Watch RPC, the dashboard's live feed): job events as they commit.

A watcher names jobs (or arrays) or nothing (every job); it listens on the event bus and gets
its events in batches, and ends once every job it watches has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable

from gpuq.domain.model import Job, JobEvent

WATCH_GAP = 0.003  # seconds between two batches of events to one watcher under load

Queue = asyncio.Queue[tuple[JobEvent, int | None, str]]  # an event, its array, its job's owner
# what a watcher may see of an event of a job of an owner (its reason's job names hidden)
View = Callable[[JobEvent, str], JobEvent]


class Watchers:
    def __init__(self, is_live: Callable[[int], bool]) -> None:
        self._is_live = is_live  # the job, or a task of the array of that id, may still run
        self._watchers: set[tuple[frozenset[int], Queue]] = set()

    def published(self, event: JobEvent, job: Job | None) -> None:
        """To watchers of the job, or of its array (an event bus listener)."""
        array = job.array_job_id if job is not None else None
        owner = job.user if job is not None else ""  # unknown: hidden from all but admins
        for wanted, queue in self._watchers:
            if not wanted or event.job_id in wanted or array in wanted:
                queue.put_nowait((event, array, owner))

    async def watch(
        self, job_ids: Iterable[int], view: View | None = None
    ) -> AsyncIterator[list[JobEvent]]:
        """Events as they commit, in batches (whatever queued up since the last one); ends
        once every watched job has finished. `view`: what the watcher may see of each.

        Under load (a batch came within WATCH_GAP of the one before, twice in a row) batches
        leave WATCH_GAP apart, so one message carries many events; otherwise an event leaves
        at once, and the few events of one job (submitted, running, ended) are not delayed."""
        loop = asyncio.get_running_loop()
        last = -WATCH_GAP
        busy = False
        wanted = frozenset(job_ids)
        queue: Queue = asyncio.Queue()
        entry = (wanted, queue)
        self._watchers.add(entry)
        try:
            # memory holds every live job: what is not there has ended
            remaining = {i for i in wanted if self._is_live(i)}
            while not wanted or remaining or not queue.empty():
                items = [await queue.get()]
                gap = last + WATCH_GAP - loop.time()
                if gap > 0 and busy:
                    await asyncio.sleep(gap)
                busy = gap > 0
                while not queue.empty():
                    items.append(queue.get_nowait())
                last = loop.time()  # when it left: the yield returns once it was written
                if view is None:
                    yield [event for event, _, _ in items]
                else:
                    yield [view(event, owner) for event, _, owner in items]
                touched = {i for e, a, _ in items for i in (e.job_id, a) if i in wanted}
                remaining -= {i for i in touched if not self._is_live(i)}
                remaining |= {i for i in touched if self._is_live(i)}
        finally:
            self._watchers.discard(entry)
