"""ListJobs in pages through the coordinator, on a real store (SQLite and PostgreSQL): every
job once across the pages, at most the coordinator's largest page, filters and limits that
hold across pages, bad tokens refused, and a long listing that leaves the event loop to
other calls (issue 23); a page asked again shows what changed since (issue 27: pages are
kept while nothing in them changed)."""

from __future__ import annotations

import asyncio
import time

import pytest
from harness import Clock, cancel, eventually, passes_ran, run, submit
from helpers import make_spec

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.server import Coordinator, assemble
from gpuq.domain.array_specs import ArraySpec
from gpuq.errors import InvalidInput
from gpuq.identity import Caller
from gpuq.store.api import Store
from gpuq.store.records import NewJob
from gpuq.v1 import queue_pb2

PAGE = 3
SMALL = CoordinatorSettings(list_page_size=PAGE)
ALICE = Caller("alice", None)


async def page(co: Coordinator, request: queue_pb2.ListJobsRequest) -> queue_pb2.ListJobsReply:
    """One page, as the Client reads it (the front door answers it as the wire carries it)."""
    return queue_pb2.ListJobsReply.FromString(await co.queries.list_jobs(ALICE, request))


async def pages(
    co: Coordinator, request: queue_pb2.ListJobsRequest
) -> list[list[queue_pb2.ListJobsReply]]:
    """Every page of a listing, as the Client asks them."""
    replies = []
    while True:
        reply = await page(co, request)
        replies.append(reply)
        if not reply.next_page_token:
            return replies
        request.page_token = reply.next_page_token


def ids(replies: list[queue_pb2.ListJobsReply]) -> list[int]:
    return [j.id for reply in replies for j in reply.jobs]


def test_live_jobs_come_once_each_in_pages_of_at_most_the_largest(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        plain = [(await submit(co, make_spec(hold=True), "alice"))[0] for _ in range(7)]
        sweep = [
            (await submit(co, make_spec(hold=True, name=f"sweep-{i}"), "bob"))[0] for i in range(4)
        ]
        [array] = await submit(co, make_spec(hold=True, array=ArraySpec(tuple(range(10)))), "alice")
        everything = sorted([*plain, *sweep, array])
        for asked in (0, 2, PAGE, 1000, 2**32 - 1):  # more than the largest: the largest
            replies = await pages(co, queue_pb2.ListJobsRequest(page_size=asked))
            assert ids(replies) == everything, asked
            assert all(len(r.jobs) <= min(asked or PAGE, PAGE) for r in replies)
        # the array's ten waiting tasks are one entry, as in one reply
        replies = await pages(co, queue_pb2.ListJobsRequest())
        (entry,) = [j for r in replies for j in r.jobs if j.id == array]
        assert entry.array_tasks == "0-9"
        # a filter and a limit hold across pages
        named = await pages(co, queue_pb2.ListJobsRequest(names=["sweep*"], page_size=1))
        assert ids(named) == sweep
        limited = await pages(co, queue_pb2.ListJobsRequest(limit=5))
        assert ids(limited) == everything[:5] and len(limited) == 2
        # jobs that end or come between two pages: the others still come once each
        first = await page(co, queue_pb2.ListJobsRequest())
        await cancel(co, [str(plain[5])], "alice")
        [late] = await submit(co, make_spec(hold=True), "alice")
        rest = await pages(co, queue_pb2.ListJobsRequest(page_token=first.next_page_token))
        seen = ids([first, *rest])
        assert seen == sorted({*everything, late} - {plain[5]})

    run(store, body, SMALL)


def test_a_full_last_page_says_it_is_the_last(store: Store) -> None:
    """A listing of exactly two pages is two replies, not two and an empty third: the page
    that fills up says whether any job follows (live ones from memory, ended ones from the
    store), so `gpuq queue` of 500 jobs in pages of 250 makes two calls."""

    async def body(co: Coordinator) -> None:
        held = [(await submit(co, make_spec(hold=True), "alice"))[0] for _ in range(2 * PAGE)]
        live = await pages(co, queue_pb2.ListJobsRequest())
        assert ids(live) == held and [len(r.jobs) for r in live] == [PAGE, PAGE]
        one_more = await pages(co, queue_pb2.ListJobsRequest(page_size=PAGE - 1))
        assert ids(one_more) == held and [len(r.jobs) for r in one_more] == [2, 2, 2]
        await cancel(co, [str(i) for i in held], "alice")
        ended = await pages(co, queue_pb2.ListJobsRequest(finished=True))
        assert ids(ended) == held[::-1] and [len(r.jobs) for r in ended] == [PAGE, PAGE]
        by_two = await pages(co, queue_pb2.ListJobsRequest(finished=True, page_size=PAGE - 1))
        assert ids(by_two) == held[::-1] and [len(r.jobs) for r in by_two] == [2, 2, 2]
        [old] = await submit(co, make_spec(hold=True), "alice")
        await cancel(co, [str(old)], "alice")
        ended = await pages(co, queue_pb2.ListJobsRequest(finished=True))
        assert [len(r.jobs) for r in ended] == [PAGE, PAGE, 1]

    run(store, body, SMALL)


def test_a_listing_asked_again_shows_what_changed_since(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        first, second = [(await submit(co, make_spec(gpus=1), "alice"))[0] for _ in range(2)]
        await passes_ran(co)
        request = queue_pb2.ListJobsRequest()
        before = await page(co, request)
        assert [(j.id, j.state) for j in before.jobs] == [(first, "pending"), (second, "pending")]
        assert all(j.pending.reasons for j in before.jobs)  # why each waits (no node here)
        assert await page(co, request) == before  # nothing changed: the same page
        await cancel(co, [str(first)], "alice")
        [held] = await submit(co, make_spec(hold=True), "alice")
        await passes_ran(co)
        after = await page(co, request)
        assert [(j.id, j.state) for j in after.jobs] == [(second, "pending"), (held, "held")]
        assert after.jobs[0].pending.reasons and not after.jobs[1].HasField("pending")
        # an admin's page is another than alice's, and answers as it should
        admin = queue_pb2.ListJobsReply.FromString(
            await co.queries.list_jobs(Caller("root", 0, admin=True), request)
        )
        assert [j.id for j in admin.jobs] == [second, held]

    run(store, body, SMALL)


def test_a_job_submitted_just_after_a_listing_shows_its_own_reason(store: Store) -> None:
    """A listing explains the queue at most once a second; a pass that saw the queue change
    makes the next listing explain afresh, so a job submitted and listed at once says why it
    waits ("begin time"), not "waiting for the next scheduling pass" (CI saw it)."""

    async def body(co: Coordinator) -> None:
        await submit(co, make_spec(gpus=1), "alice")
        await passes_ran(co)
        request = queue_pb2.ListJobsRequest()
        assert (await page(co, request)).jobs[0].pending.reasons  # explained just now
        [later] = await submit(co, make_spec(begin_time=time.time() + 86400), "alice")
        await passes_ran(co)
        [entry] = [j for j in (await page(co, request)).jobs if j.id == later]
        assert any("begin time" in r for r in entry.pending.reasons), entry.pending.reasons

    run(store, body, SMALL)


def test_a_long_queues_explanation_is_made_again_after_the_wall_clock_stepped_back(
    store: Store,
) -> None:
    """How often a long queue is explained (at most once per EXPLAIN_SHARE times what it
    takes) is counted on the steady clock: after the wall clock stepped back an hour, why a
    job waits was still given as it stood before the step, for that hour."""
    wall, steady = Clock(1_800_000_000.0), Clock(5_000.0)

    async def main() -> None:
        co = assemble(store, SMALL, wall, steady=steady)
        await co.start()
        try:
            [first] = await submit(co, make_spec(gpus=1), "alice")
            await passes_ran(co)
            explaining = co.scheduling
            assert first in explaining.explained()
            # as a queue of tens of thousands takes to explain: in the background, and at
            # most once per EXPLAIN_SHARE times that
            explaining._explain_took = 0.06
            wall.advance(-3600.0)
            [second] = await submit(co, make_spec(gpus=1), "alice")
            await passes_ran(co)
            steady.advance(2.0)
            wall.advance(2.0)

            async def explained_second() -> bool | None:
                return second in explaining.explained() or None

            await eventually(explained_second, timeout=5.0)
        finally:
            await co.close()

    asyncio.run(main())


def test_ended_jobs_and_ids_come_in_pages_from_the_store(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        jobs = [(await submit(co, make_spec(hold=True), "alice"))[0] for _ in range(8)]
        await cancel(co, [str(j) for j in jobs[:7]], "alice")
        history = await pages(co, queue_pb2.ListJobsRequest(finished=True))
        assert ids(history) == sorted(jobs[:7], reverse=True)  # newest first
        assert max(len(r.jobs) for r in history) == PAGE
        last = await pages(co, queue_pb2.ListJobsRequest(finished=True, limit=4))
        assert ids(last) == sorted(jobs[:7], reverse=True)[:4]
        by_id = await pages(co, queue_pb2.ListJobsRequest(job_ids=jobs[::-1]))
        assert ids(by_id) == jobs
        [array] = await submit(co, make_spec(hold=True, array=ArraySpec(tuple(range(5)))), "alice")
        tasks = await pages(co, queue_pb2.ListJobsRequest(array_job_id=array))
        assert ids(tasks) == [array]

    run(store, body, SMALL)


def test_bad_page_tokens_are_one_clear_refusal(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        for _ in range(5):
            await submit(co, make_spec(hold=True), "alice")
        first = await page(co, queue_pb2.ListJobsRequest())
        token = first.next_page_token
        for bad in ("garbage", token[:-3], token + "x" * 300, "🙂"):
            with pytest.raises(InvalidInput, match="page_token"):
                await co.queries.list_jobs(ALICE, queue_pb2.ListJobsRequest(page_token=bad))
        for other in (
            queue_pb2.ListJobsRequest(user="bob", page_token=token),
            queue_pb2.ListJobsRequest(finished=True, page_token=token),
            queue_pb2.ListJobsRequest(limit=2, page_token=token),
        ):
            with pytest.raises(InvalidInput, match="another listing"):
                await co.queries.list_jobs(ALICE, other)

    run(store, body, SMALL)


def test_a_long_listing_leaves_the_loop_to_other_calls(store: Store) -> None:
    """While one page of 3,000 jobs is built, `gpuq nodes` is answered: the listing gives the
    loop back between its chunks (no timing: the order the loop runs them in)."""
    spec = make_spec(hold=True)
    with store.transaction() as tx:
        tx.add_jobs([NewJob(spec, "alice", "normal", 0) for _ in range(3000)], time.time())

    async def body(co: Coordinator) -> None:
        listing = asyncio.create_task(
            co.queries.list_jobs(ALICE, queue_pb2.ListJobsRequest(page_size=5000))
        )

        async def nodes() -> bool:
            co.queries.list_nodes()
            return listing.done()

        assert await asyncio.create_task(nodes()) is False
        reply = queue_pb2.ListJobsReply.FromString(await listing)
        assert len(reply.jobs) == 3000 and not reply.next_page_token

    run(store, body, CoordinatorSettings(list_page_size=5000))
