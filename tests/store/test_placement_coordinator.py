"""Placement through the front door of the assembled coordinator in process, on a real store
(SQLite and PostgreSQL), with agents that run nothing and register what real agents with fake
GPUs register (tests/harness.py): `--gpus h100:1` lands only on an H100 of a mixed node and
waits, saying why, while it is busy, rather than take the A100; --nodelist, --exclude,
--constraint over node features and GPU types, --partition; MPS shares of a shared GPU; and
requests no node can ever meet refused at submit time. (These were end-to-end tests; the
command line's flags and what `gpuq show` and `gpuq nodes` print of placement, and features
from an agent's config, stay in tests/e2e/test_placement_e2e.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from harness import FakeAgent, InProcessClient, eventually, run, started_on

from gpuq.coordinator.server import Coordinator
from gpuq.errors import InvalidInput, Unsatisfiable
from gpuq.store.api import Store


async def placed(co: Coordinator) -> dict[str, FakeAgent]:
    """Node `mixed` (one H100 and one A100, features nvlink and ib) and node `plain` (two L4,
    feature debug)."""
    return {
        "mixed": await FakeAgent(
            co, "mixed", "1xH100-80GB,1xA100-40GB", features=["nvlink", "ib"]
        ).connect(),
        "plain": await FakeAgent(co, "plain", "2xL4-24GB", features=["debug"]).connect(),
    }


def units_by_type(client: InProcessClient) -> dict[str, str]:
    """uuid -> NVML name, over every node."""
    return {g.uuid: g.name for n in client.nodes() for g in n.gpus}


async def reasons(client: InProcessClient, job_id: int) -> str:
    job, _ = await client.detail(job_id)
    return "; ".join(job.pending.reasons)


def test_a_typed_job_lands_only_on_its_type_and_waits_for_it(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        mixed = (await placed(co))["mixed"]
        alice = InProcessClient(co, "alice")
        names = units_by_type(alice)
        first = await alice.submit("sleep 30", gpus="h100:1")
        launch = await mixed.started(first)
        job = await alice.wait_state(first, "running")
        assert job.node == "mixed" and list(launch.gpus) == list(job.gpus)
        assert [names[u] for u in job.gpus] == ["NVIDIA H100 80GB HBM3"]

        second = await alice.submit(gpus="h100:1")
        text = await eventually(lambda: reasons(alice, second))
        assert "needs 1 h100 GPU on one node" in text, text
        assert await alice.state(second) == "pending"  # the free A100 is not taken

        a100 = await alice.submit(gpus="a100:1")
        await mixed.started(a100)
        mixed.end(a100)
        done = await alice.wait_state(a100, "completed")
        assert [names[u] for u in done.gpus] == ["NVIDIA A100-SXM4-40GB"]

        await alice.cancel(str(first))
        await mixed.started(second)
        mixed.end(second)
        done = await alice.wait_state(second, "completed")
        assert [names[u] for u in done.gpus] == ["NVIDIA H100 80GB HBM3"]

    run(store, body)


def test_nodelist_exclude_constraint_and_partition(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agents = await placed(co)
        alice = InProcessClient(co, "alice")

        async def node_of(**options: Any) -> str | None:
            job_id = await alice.submit(**options)
            (await started_on(agents.values(), job_id)).end(job_id)
            return (await alice.wait_state(job_id, "completed")).node

        assert await node_of(nodelist="plain") == "plain"
        assert await node_of(nodelist="mixed,plain", exclude="mixed") == "plain"
        assert await node_of(exclude="plain") == "mixed"
        assert await node_of(constraint="nvlink&ib") == "mixed"
        assert await node_of(constraint="debug|nope") == "plain"
        assert await node_of(constraint="l4", gpus="1") == "plain"  # a GPU type is a feature
        assert await node_of(partition="debug") == "plain"
        assert await node_of(nodelist="mixed", constraint="ib") == "mixed"
        features = {n.name: list(n.features) for n in alice.nodes()}
        assert features == {"mixed": ["nvlink", "ib"], "plain": ["debug"]}

    run(store, body)


def test_requests_no_node_can_meet_are_refused(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        await placed(co)
        alice = InProcessClient(co, "alice")
        with pytest.raises(Unsatisfiable, match="no node has v100 GPUs"):
            await alice.submit(gpus="v100:1")
        with pytest.raises(Unsatisfiable, match="a100:2 can never run"):
            await alice.submit(gpus="a100:2")
        with pytest.raises(Unsatisfiable, match="nodelist: n9 is not known"):
            await alice.submit(nodelist="n9")
        with pytest.raises(Unsatisfiable, match="constraint: no node has nvlink&debug"):
            await alice.submit(constraint="nvlink&debug")
        with pytest.raises(Unsatisfiable, match="no node has nope"):
            await alice.submit(partition="nope")
        assert await alice.list_raw() == []

    run(store, body)


# ---- MPS shares (were tests/e2e/test_gpu_shares_e2e.py, with a raw agent stream) ----------


def test_two_shares_of_one_user_share_a_gpu_and_a_third_waits(store: Store) -> None:
    """A node with one shared GPU and one that is not: two 50% shares of one user are
    dispatched to the shared unit together; a third waits with the reason; whole-GPU jobs get
    the other unit only; the job record says which enforcement each has."""

    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "raw", 2, shared=(0,)).connect()
        alice = InProcessClient(co, "alice")
        first = await alice.submit("sleep 600", gpu_share=50, gpu_mem="20G")
        second = await alice.submit("sleep 600", gpu_share="50%", gpu_mem="20G")
        for job in (first, second):
            assert list((await agent.started(job)).gpus) == ["GPU-raw-0"]
            await alice.wait_state(job, "running")
        detail, _ = await alice.detail(first)
        assert detail.gpu_enforcement == "MPS (limits)"
        assert detail.spec.resources.gpu_share == 50

        third = await alice.submit("sleep 600", gpu_share=50, gpu_mem="20G")

        async def share_reasons() -> list[str]:
            return [r for r in (await alice.detail(third))[0].pending.reasons if "%" in r]

        reason = (await eventually(share_reasons))[0]
        assert reason.startswith("needs a 50% share of a shared GPU with 20G free: "), reason
        assert "node raw's shared GPU 0 has only 0% left" in reason, reason

        # whole GPUs: the unshared one only, while shares live on the shared one
        whole = await alice.submit("sleep 600", gpus=1)
        assert list((await agent.started(whole)).gpus) == ["GPU-raw-1"]
        await alice.wait_state(whole, "running")
        assert (await alice.detail(whole))[0].gpu_enforcement == "exclusive"
        waiting = await alice.submit("sleep 600", gpus=1)
        # the scheduler says why it waits: the shared GPU is not given out whole
        why = await eventually(lambda: reasons(alice, waiting))
        assert "largest free block is 0" in why, why
        assert await alice.state(waiting) == "pending"

        # one share ends: the third takes its place beside the other
        await alice.cancel(first)
        assert list((await agent.started(third)).gpus) == ["GPU-raw-0"]
        await alice.wait_state(third, "running")
        assert await alice.state(waiting) == "pending"

    run(store, body)


def test_a_share_no_shared_gpu_can_hold_is_refused_at_submit(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        await FakeAgent(co, "raw", 2, shared=(0,)).connect()
        alice = InProcessClient(co, "alice")
        with pytest.raises(Unsatisfiable, match="no shared GPU has that much memory"):
            await alice.submit(gpu_share=50, gpu_mem="200G")
        with pytest.raises(InvalidInput, match="needs --gpu-mem"):
            await alice.submit(gpu_share=50)
        with pytest.raises(InvalidInput, match="a share is of one GPU"):
            await alice.submit(gpu_share=50, gpu_mem="20G", gpus=2)

    run(store, body)
