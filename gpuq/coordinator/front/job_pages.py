"""ListJobs in pages: each reply is at most a page ([coordinator] list_page_size entries), and
what it costs the event loop is that page's, never the queue's.

Measured (issue 23): with 20,000 held jobs a whole listing took 2 s of the loop, half building
each entry's message (job_to_proto: 40 us a job), half "why pending" explanations that went
stale in the middle of the listing and were computed again; the reply serialized in 16 ms.
Under four listing clients, the dashboard's JSON printer (protobuf's MessageToDict, 50 us a
job) then took 65% of the coordinator. So:

- A page walks live ids in order from where the last one stopped (`LiveJobs.ids_after`: a
  bisection, not a sort of the whole queue), SCAN ids at a time with the loop free in between;
  ended jobs, ids and arrays are read by the store (off the loop) a page at a time, by key.
- A live job's entry is kept, as bytes and (once the dashboard asks) as JSON, until the job
  changes (memory's Job is a new object then) or its flags do; only why a pending job waits,
  which changes without the job changing, is kept per explanation and priority. Entries are
  built for at most TURN (0.1 ms) at a time with the loop free in between: a kept one costs
  a dictionary look-up. A running job's progress, which only its owner and admins see, is
  added to their entries (kept, as bytes and JSON, until its next reading).
- Listings take turns (`_lane`): pages are built one at a time, so a call that comes meanwhile
  (`gpuq nodes`, a submission) waits behind one small chunk of one listing.
- A page of live jobs is kept too, as the reply's bytes, per request and kind of caller (user,
  admin), while memory (LiveJobs.version) and the queue's explanation are the same and so are
  its running jobs' flags and progress: a listing that nothing changed since costs a
  look-up, not a walk of its entries (issue 27: 500 pending jobs, 2.4 ms of walk a listing;
  squeue costs 1.7 ms), nor a parse of its request (`kept`, asked first: the same bytes from
  the same kind of caller passed the same checks). Why a job waits is kept by value (the
  explanation's Waiting): an explanation made anew mostly says the same of most jobs.

Order and tokens: gpuq.coordinator.front.page_tokens.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from gpuq.coordinator.access.permissions import hides_name
from gpuq.coordinator.changes.store_writer import StoreWriter
from gpuq.coordinator.front.job_messages import JobMessages, collapse_arrays, progress_part
from gpuq.coordinator.front.page_tokens import Cursor, decode, digest, encode, page_size
from gpuq.coordinator.memory.live_jobs import LiveJobs
from gpuq.domain.model import Job
from gpuq.domain.states import JobState
from gpuq.identity import Caller
from gpuq.scheduler.snapshot import Waiting
from gpuq.store.records import JobQuery
from gpuq.v1 import queue_pb2
from gpuq.v1 import types_pb2 as pb

SCAN = 250  # live ids looked at between two turns of the event loop (~0.2 ms)
# seconds of building entries between two turns of the event loop: what a call that comes
# meanwhile waits at most for a listing (a kept entry takes ~2 us, one built afresh 50-100 us)
TURN = 0.0001
WAITING = (JobState.PENDING, JobState.HELD)
Entry = tuple[Job, Job | None]  # a listed job, and for a collapsed array the task explained
# which live jobs (None: every one); or the store's query
Wanted = Callable[[Job], bool] | JobQuery | None
PAGES_KEPT = 256  # live pages kept (per request and kind of caller), at most


@dataclass(slots=True)
class Kept:
    """A live job's entry as last built: for as long as memory holds this same Job."""

    job: Job
    flags: tuple[str, ...]
    body: bytes  # the entry on the wire, but why it waits
    json: str | None = None  # the same as the dashboard's JSON, once it asked


@dataclass(slots=True)
class KeptWait:
    """Why a listed job waits, as last built: for as long as why it waits (the explanation's
    Waiting, by value), the job (and an array entry's explained task) and its priority are
    the same."""

    waiting: Waiting | None
    job: Job
    explained: Job | None
    priority: float
    body: bytes  # a Job message holding only `pending` (b"": it does not wait)
    json: str | None = None  # `pending` as the dashboard's JSON, once it asked


@dataclass(slots=True)
class KeptProgress:
    """A running job's progress, as a Job message holding only it (and its collapse flag),
    for as long as the coordinator holds this same reading."""

    shown: pb.JobThroughput  # the coordinator's own (RunningProgress.shown)
    body: bytes  # progress_part(shown) on the wire
    collapse: bool  # its flags hold the collapse: its JSON merges with the entry's flags
    json: str | None = None  # `"progress":{...}`, a member to add, once the dashboard asked


@dataclass(frozen=True, slots=True)
class KeptPage:
    """A page of live jobs as last answered (the reply's bytes) to a request, for one kind
    of caller: good while memory's version and the explanation are the same, and so are its
    running jobs' flags and progress (which change with neither)."""

    version: int
    explanation: object
    running: list[tuple[Job, tuple[str, ...], pb.JobThroughput | None]]
    reply: bytes


@dataclass(frozen=True, slots=True)
class Page:
    entries: list[Entry]
    last: tuple[int, ...] | None  # the sort key of the last entry, when more may follow


class JobPages:
    def __init__(
        self, largest: int, jobs: LiveJobs, writer: StoreWriter, messages: JobMessages
    ) -> None:
        self.largest = largest
        self.jobs = jobs
        self.writer = writer
        self.messages = messages
        self._kept: dict[tuple[int, bool], Kept] = {}  # by (job id, name hidden)
        self._waits: dict[tuple[int, bool], KeptWait] = {}  # the same
        self._progress: dict[int, KeptProgress] = {}  # by job id
        # by (user, admin, the request's bytes)
        self._pages: dict[tuple[str, bool, bytes], KeptPage] = {}
        # listings take turns: one page is built at a time, so a call that comes meanwhile
        # waits behind one chunk of one listing, not behind one of each listing at once
        self._lane = asyncio.Lock()

    async def page(
        self, caller: Caller, request: queue_pb2.ListJobsRequest, wanted: Wanted
    ) -> bytes:
        """One page of a listing: of live jobs from memory (`wanted` says which; None: all),
        or of the store's (`wanted` is the query, less its paging). As the wire carries the
        ListJobsReply: parsing it and serializing it again cost 0.5 ms a page of 250, a
        quarter of what a listing of 500 cost the coordinator (issue 27); the servicer's
        serializer passes bytes on (gpuq.coordinator.front.rpc_calls). A page of live jobs is
        kept (`kept` answers it while it would be built the same)."""
        live = not isinstance(wanted, JobQuery)
        version, explanation = self.jobs.version, self.messages.explanation()
        page, token = await self._select(request, wanted)
        parts: list[bytes] = []
        running: list[tuple[Job, tuple[str, ...], pb.JobThroughput | None]] = []
        async with self._lane:
            async for job, explained, hidden in self._in_turns(caller, page.entries):
                # bytes of messages joined: they merge (the progress's flags after the entry's)
                progress = self._kept_progress(job, caller)
                entry = self._kept_entry(job, hidden)
                body = (
                    entry.body
                    + self._kept_wait(job, explained, hidden, explanation).body
                    + (progress.body if progress is not None else b"")
                )
                parts += (b"\x0a", *_field(body))  # field 1, `jobs`
                if job.state is JobState.RUNNING:
                    shown = progress.shown if progress is not None else None
                    running.append((job, entry.flags, shown))
        if token:  # field 2, `next_page_token`
            parts += (b"\x12", *_field(token.encode()))
        reply = b"".join(parts)
        if live:  # as memory was when the page began: changed since, it is not used
            if len(self._pages) >= PAGES_KEPT:
                self._pages.clear()
            self._pages[_page_key(caller, request)] = KeptPage(version, explanation, running, reply)
        return reply

    def kept(self, caller: Caller, request: queue_pb2.ListJobsRequest) -> bytes | None:
        """The page of live jobs kept for this request and kind of caller, as it would be
        built now (None: none is). Its request was checked when it was built: the same bytes
        from the same kind of caller pass the same checks, so a caller may be answered this
        before the request is checked again (a listing's pages cost a look-up, not a parse of
        their filters: issue 27)."""
        kept = self._pages.get(_page_key(caller, request))
        if kept is None:
            return None
        version, explanation = self.jobs.version, self.messages.explanation()
        return kept.reply if self._still_good(kept, caller, version, explanation) else None

    def _still_good(
        self, kept: KeptPage, caller: Caller, version: int, explanation: object
    ) -> bool:
        """Would the kept page be built the same now?"""
        if kept.version != version or kept.explanation is not explanation:
            return False
        for job, flags, shown in kept.running:
            if self.messages.flags(job.id, job.start_count) != flags:
                return False
            if self.messages.progress_of(job, caller) is not shown:
                return False
        return True

    async def page_json(
        self, caller: Caller, request: queue_pb2.ListJobsRequest, wanted: Wanted
    ) -> tuple[list[str], str]:
        """The same page as proto3 JSON texts, one an entry, as the dashboard shows them (no
        array's list of task indices: its summary, array_tasks), and the next page's token.
        Kept as the bytes are: protobuf's JSON printer costs 50 us an entry."""
        page, token = await self._select(request, wanted)
        return await self.entries_json(caller, page.entries), token

    async def entries_json(self, caller: Caller, entries: list[Entry]) -> list[str]:
        """These entries as the dashboard's JSON texts (kept, as a page's are)."""
        texts: list[str] = []
        explanation = self.messages.explanation()
        async with self._lane:
            async for job, explained, hidden in self._in_turns(caller, entries):
                kept = self._kept_entry(job, hidden)
                if kept.json is None:
                    message = pb.Job.FromString(kept.body)
                    if message.spec.HasField("array"):
                        message.spec.array.ClearField("indices")
                    kept.json = json_text(message)
                wait = self._kept_wait(job, explained, hidden, explanation)
                text = kept.json
                if wait.body:
                    if wait.json is None:
                        wait.json = json_text(pb.Job.FromString(wait.body).pending)
                    text = f'{text[:-1]},"pending":{wait.json}}}'  # one more member
                progress = self._kept_progress(job, caller)
                if progress is not None and progress.collapse:  # its flags join the entry's
                    message = pb.Job.FromString(kept.body + wait.body + progress.body)
                    if message.spec.HasField("array"):
                        message.spec.array.ClearField("indices")
                    text = json_text(message)
                elif progress is not None:
                    if progress.json is None:
                        progress.json = json_text(pb.Job(progress=progress.shown))[1:-1]
                    text = f"{text[:-1]},{progress.json}}}"
                texts.append(text)
        return texts

    async def _in_turns(
        self, caller: Caller, entries: list[Entry]
    ) -> AsyncIterator[tuple[Job, Job | None, bool]]:
        """The page's entries (and whether the job's name is hidden from `caller`), with the
        loop free after each TURN of building them."""
        turn = time.perf_counter()
        for job, explained in entries:
            if time.perf_counter() - turn > TURN:
                await asyncio.sleep(0)
                turn = time.perf_counter()
            yield job, explained, self._hidden(caller, job)

    def _hidden(self, caller: Caller, job: Job) -> bool:
        return hides_name(caller, job.user, self.messages.private_data)

    async def _select(self, request: queue_pb2.ListJobsRequest, wanted: Wanted) -> tuple[Page, str]:
        """The page's entries, and the next page's token ("" after the last)."""
        listing = digest(request)
        cursor = decode(request.page_token, listing) or Cursor((0,), 0)
        size = page_size(request.page_size, self.largest)
        if request.limit:
            size = min(size, max(0, request.limit - cursor.given))
        if size == 0:
            return Page([], None), ""
        # whether a full page should look for one entry more (is a next page worth asking?):
        # not when the listing's limit ends it anyway
        ahead = not 0 < request.limit <= cursor.given + size
        if isinstance(wanted, JobQuery):  # a store's read waits off the loop, not in the lane
            page = await self._stored(wanted, cursor, size, ahead)
        else:
            async with self._lane:
                collapse = not request.expand_arrays
                page = await self._live(wanted, cursor.after[0], size, collapse, ahead)
        given = cursor.given + len(page.entries)
        if page.last is None or 0 < request.limit <= given:
            return page, ""
        return page, encode(Cursor(page.last, given), listing)

    async def _live(
        self,
        wanted: Callable[[Job], bool] | None,
        after: int,
        size: int,
        collapse: bool,
        ahead: bool,
    ) -> Page:
        """Live jobs by id from `after`: an array's waiting tasks as one entry (collapse)
        where its first one is, as squeue shows them. `ahead`: a full page says whether any
        entry follows (else that it may)."""
        entries: list[Entry] = []
        groups: dict[tuple[int, JobState], list[Job]] = {}
        last = after
        while ids := self.jobs.ids_after(after, SCAN):
            for job_id in ids:  # memory changes only between turns: each id is a live job
                after = job_id
                job = self.jobs.jobs[job_id]
                if wanted is not None and not wanted(job):
                    continue
                entry = self._collapsed(job, wanted, groups) if collapse else (job, None)
                if entry is None:
                    continue
                if len(entries) == size:  # one more follows: a next page is worth asking
                    return Page(entries, (last,))
                entries.append(entry)
                last = job_id
                if len(entries) == size and not ahead:
                    return Page(entries, (last,))
            await asyncio.sleep(0)
        return Page(entries, None)  # the listing's end: no empty page after a full one

    def _collapsed(
        self,
        job: Job,
        wanted: Callable[[Job], bool] | None,
        groups: dict[tuple[int, JobState], list[Job]],
    ) -> Entry | None:
        """The job's entry; for a waiting task of an array, the entry of all the array's
        wanted tasks in that state, given where the first of them is (None elsewhere)."""
        array = job.array_job_id
        if array is None or job.state not in WAITING:
            return (job, None)
        group = groups.get((array, job.state))
        if group is None:
            members = (self.jobs.jobs[i] for i in sorted(self.jobs.members[array]))
            group = [j for j in members if j.state is job.state and (wanted is None or wanted(j))]
            groups[(array, job.state)] = group
        return collapse_arrays(group)[0] if group[0] is job else None

    async def _stored(self, query: JobQuery, cursor: Cursor, size: int, ahead: bool) -> Page:
        """A page of the store's rows after the cursor, in the query's order (`ahead`: and
        one row more, to know whether a next page has any)."""
        after = cursor.after if cursor.given else None
        paged = _paged(query, after, size + 1 if ahead else size)
        jobs = await self.writer.read(lambda s: s.list_jobs(paged))
        if len(jobs) < size or (ahead and len(jobs) == size):
            return Page([(j, None) for j in jobs], None)
        del jobs[size:]
        return Page([(j, None) for j in jobs], sort_key(jobs[-1], query))

    def _kept_entry(self, job: Job, hidden: bool) -> Kept:
        """The job's entry but why it waits: kept while memory holds this same Job with the
        same flags (the store's copies, never asked twice, are not kept)."""
        running = job.state is JobState.RUNNING
        flags = self.messages.flags(job.id, job.start_count) if running else ()
        key = (job.id, hidden)
        kept = self._kept.get(key)
        if kept is not None and kept.job is job and kept.flags == flags:
            return kept
        kept = Kept(job, flags, self.messages.listed(job, hidden).SerializeToString())
        if self.jobs.jobs.get(job.id) is job:
            self._kept[key] = kept
            if len(self._kept) > 2 * len(self.jobs.jobs) + 1024:
                self._forget_ended()
        return kept

    def _kept_wait(
        self,
        job: Job,
        explained: Job | None,
        hidden: bool,
        explanation: Mapping[int, Waiting],
    ) -> KeptWait:
        """Why the job waits, kept while why it waits in the queue's explanation (by value),
        the job and its priority stay the same (building it costs more than the rest of a
        kept entry)."""
        first = explained or job
        waiting = explanation.get(first.id) if first.state is JobState.PENDING else None
        priority = self.jobs.priority.get(first.id, 0.0)
        key = (job.id, hidden)
        kept = self._waits.get(key)
        if (
            kept is not None
            and kept.job is job
            and kept.explained is explained
            and kept.priority == priority
            and (kept.waiting is waiting or kept.waiting == waiting)
        ):
            return kept
        pending = self.messages.pending(job, explained, hidden)
        body = b"" if pending is None else pb.Job(pending=pending).SerializeToString()
        kept = KeptWait(waiting, job, explained, priority, body)
        if self.jobs.jobs.get(job.id) is job:
            self._waits[key] = kept
            if len(self._waits) > 2 * len(self.jobs.jobs) + 1024:
                self._forget_ended()
        return kept

    def _kept_progress(self, job: Job, caller: Caller) -> KeptProgress | None:
        """The job's progress for `caller` (None for those who may not read its output:
        JobMessages.progress_of), kept while the coordinator holds the same reading."""
        shown = self.messages.progress_of(job, caller)
        if shown is None:
            return None
        kept = self._progress.get(job.id)
        if kept is None or kept.shown is not shown:
            kept = KeptProgress(
                shown, progress_part(shown).SerializeToString(), bool(shown.collapse)
            )
            self._progress[job.id] = kept
            if len(self._progress) > 2 * len(self.jobs.jobs) + 1024:
                self._forget_ended()
        return kept

    def _forget_ended(self) -> None:
        """Drop what is kept for jobs memory no longer holds as they were."""
        live = self.jobs.jobs
        self._kept = {k: v for k, v in self._kept.items() if live.get(k[0]) is v.job}
        self._waits = {k: v for k, v in self._waits.items() if live.get(k[0]) is v.job}
        self._progress = {
            k: v
            for k, v in self._progress.items()
            if k in live and self.messages.progress(k, live[k].start_count) is v.shown
        }


def sort_key(job: Job, query: JobQuery) -> tuple[int, ...]:
    """A stored job's place in the query's order: an array's tasks by index, the record
    first (the index shifted by one: a token holds no negative number), else the id."""
    if query.array_job_id is not None:
        task = job.array_task_id
        return ((task if task is not None else -1) + 1, job.id)
    return (job.id,)


def _paged(query: JobQuery, after: tuple[int, ...] | None, size: int) -> JobQuery:
    return replace(query, after=after, limit=size)


def json_text(message: Message) -> str:
    """proto3 JSON, with the .proto's field names (as the dashboard's API answers)."""
    data = MessageToDict(message, preserving_proto_field_name=True)
    return json.dumps(data, separators=(",", ":"))


def _page_key(caller: Caller, request: queue_pb2.ListJobsRequest) -> tuple[str, bool, bytes]:
    """What a kept page is kept by: the caller's user and kind, the request's bytes."""
    return (caller.user, caller.admin, request.SerializeToString(deterministic=True))


def _field(body: bytes) -> tuple[bytes, bytes]:
    """A length-delimited field's length and body (its tag goes before)."""
    return _varint(len(body)), body


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
