"""`[coordinator] private_data = ["names"]`: a user who is neither the owner nor an admin never sees
another user's job name, wherever it would show: the job itself, `%x` in its output paths, its
history's reasons (an update's "name X -> Y"), and the events of Watch streams and the
dashboard's feed (one source: QueueQueries.job_events). Through the assembled coordinator, in
process, on a real store (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio

from harness import InProcessClient, run, until

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.front.job_messages import hide_names
from gpuq.coordinator.server import Coordinator
from gpuq.domain.model import JobEvent
from gpuq.store.api import Store


def test_names_are_hidden_from_other_users_everywhere(store: Store) -> None:
    seen: dict[str, list[str]] = {}

    async def body(co: Coordinator) -> None:
        alice = InProcessClient(co, "alice")
        bob = InProcessClient(co, "bob")
        admin = InProcessClient(co, "root", admin=True)
        watched: dict[str, list[JobEvent]] = {"alice": [], "bob": [], "root": []}

        async def watch(client: InProcessClient) -> None:
            async for batch in co.queries.job_events(client.caller):
                watched[client.caller.user].extend(batch)

        async def watch_wire(client: InProcessClient, job_id: int) -> None:
            async for reply in co.queries.watch(client.caller, [job_id]):
                watched[client.caller.user].extend(  # as the Watch RPC sends them
                    JobEvent(e.job_id, e.at, None, job.state, e.reason) for e in reply.events
                )

        feeds = [asyncio.create_task(watch(c)) for c in (alice, bob, admin)]
        await asyncio.sleep(0)
        first = await alice.submit(name="thesis-v2", hold=True, output="/tmp/%x-%j.out")
        job = await alice.get(first)
        wire = asyncio.create_task(watch_wire(bob, first))
        await asyncio.sleep(0.05)
        await alice.update(first, name="thesis-v3")
        await until(lambda: all(any("->" in e.reason for e in w) for w in watched.values()))
        await until(lambda: sum("->" in e.reason for e in watched["bob"]) == 2)
        for client in (alice, bob, admin):
            shown, events = await client.detail(first)
            [listed] = await client.list_raw()
            name = client.caller.user
            seen[name] = [
                shown.spec.name,
                shown.stdout_path,
                listed.spec.name,
                listed.stdout_path,
                *(e.reason for e in events),
                *(e.reason for e in watched[name]),
            ]
        for task in (*feeds, wire):
            task.cancel()

    run(store, body, CoordinatorSettings(private_data=("names",)))
    for name in ("alice", "root"):  # the owner and an admin see the names
        text = "\n".join(seen[name])
        assert "thesis-v3" in seen[name][0] and "/tmp/thesis-v3-" in seen[name][1], text
        assert "name thesis-v2 -> thesis-v3" in text, text
    text = "\n".join(seen["bob"])
    assert "thesis" not in text, text
    assert seen["bob"][0] == seen["bob"][2] == "(hidden)", text
    assert seen["bob"][1].startswith("/tmp/(hidden)-"), text
    assert "name (hidden) -> (hidden)" in text, text


def test_names_show_where_they_are_not_hidden(store: Store) -> None:
    seen: list[str] = []

    async def body(co: Coordinator) -> None:
        alice = InProcessClient(co, "alice")
        bob = InProcessClient(co, "bob")
        first = await alice.submit(name="thesis-v2", hold=True)
        await alice.update(first, name="thesis-v3")
        shown, events = await bob.detail(first)
        seen.extend([shown.spec.name, *(e.reason for e in events)])

    run(store, body)
    assert seen[0] == "thesis-v3" and any("name thesis-v2 -> thesis-v3" in r for r in seen)


def test_hide_names_hides_every_name_a_reason_holds() -> None:
    assert (
        hide_names("updated by alice: qos normal -> high; name a.b:c,d -> x+y@z=1; nice 0 -> 5")
        == "updated by alice: qos normal -> high; name (hidden) -> (hidden); nice 0 -> 5"
    )
    assert hide_names("singleton: job 4 named run-7 is running") == (
        "singleton: job 4 named (hidden) is running"
    )
    assert hide_names("cancelled by alice") == "cancelled by alice"
