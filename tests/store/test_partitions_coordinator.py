"""Partitions through the front door of the assembled coordinator in process, on a real store
(SQLite and PostgreSQL): a job lands only on its partitions' nodes (`-p a,b`: any of them),
waits saying which partition is busy, takes the partition's default time and QOS, is refused
for an unknown partition, an over-long --time or a group it is not in, keeps its partition
across a coordinator restart, and `gpuq nodes`' data says which partitions each node is in.
The command line: tests/e2e/test_partitions_e2e.py; the pure rules:
tests/unit/test_partitions.py."""

from __future__ import annotations

import pytest
from harness import FakeAgent, InProcessClient, eventually, run, started_on

from gpuq.config.settings import CoordinatorSettings
from gpuq.coordinator.server import Coordinator
from gpuq.domain.partitions import Partition
from gpuq.errors import InvalidInput, PermissionDenied
from gpuq.store.api import Store

SETTINGS = CoordinatorSettings(
    partitions={
        "debug": Partition("debug", ("d1",), default_time=600, max_time=3600, qos="high"),
        "gpu": Partition("gpu", ("g[1-2]",), default=True),
        "closed": Partition("closed", ("g*",), allow_groups=("no-such-group-gpuq",)),
    }
)


async def nodes(co: Coordinator) -> dict[str, FakeAgent]:
    return {name: await FakeAgent(co, name, "1xL4-24GB").connect() for name in ("d1", "g1", "g2")}


async def reasons(client: InProcessClient, job_id: int) -> str:
    job, _ = await client.detail(job_id)
    return "; ".join(job.pending.reasons)


def test_jobs_run_only_in_their_partitions_and_wait_naming_them(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agents = await nodes(co)
        alice = InProcessClient(co, "alice")

        debug = await alice.submit("sleep 30", partition="debug", gpus="1")
        assert (await started_on(agents.values(), debug)) is agents["d1"]
        job = await alice.get(debug)
        assert job.spec.placement.partitions == ("debug",)
        assert (job.spec.resources.time_limit, job.qos) == (600, "high")  # its defaults

        waiting = await alice.submit(partition="debug", gpus="1")
        text = await eventually(lambda: reasons(alice, waiting))
        assert text.startswith("partition debug: "), text
        assert await alice.state(waiting) == "pending"  # the free g1, g2 are not taken

        plain = await alice.submit("sleep 30", gpus="1")  # no -p: the default partition
        gpu_nodes = (agents["g1"], agents["g2"])
        assert (await started_on(agents.values(), plain)) in gpu_nodes
        assert (await alice.get(plain)).spec.placement.partitions == ("gpu",)
        either = await alice.submit("sleep 30", partition="debug,gpu", gpus="1")
        assert (await started_on(agents.values(), either)) in gpu_nodes  # d1 is busy

        with pytest.raises(InvalidInput) as unknown:
            await alice.submit(partition="nope")
        assert str(unknown.value) == "no partition nope; partitions: debug, gpu, closed"
        with pytest.raises(InvalidInput) as long:
            await alice.submit(partition="debug", time="3-00:00:00")
        assert "--time 3-00:00:00 is over partition debug's max_time 01:00:00" in str(long.value)
        with pytest.raises(PermissionDenied, match="partition closed is for groups"):
            await alice.submit(partition="closed")

        listed = {n.name: (list(n.partitions), n.default_partition) for n in alice.nodes()}
        assert listed == {
            "d1": (["debug"], ""),
            "g1": (["gpu", "closed"], "gpu"),
            "g2": (["gpu", "closed"], "gpu"),
        }

    run(store, body, SETTINGS)


def test_a_jobs_partition_survives_a_restart(store: Store) -> None:
    kept: list[int] = []

    async def submit(co: Coordinator) -> None:
        kept.append(await InProcessClient(co, "alice").submit(partition="debug", hold=True))

    async def read(co: Coordinator) -> None:
        job = await InProcessClient(co, "alice").get(kept[0])
        assert job.spec.placement.partitions == ("debug",)

    run(store, submit, SETTINGS)
    run(store, read, SETTINGS)


def test_without_partitions_dash_p_is_still_a_node_feature(store: Store) -> None:
    async def body(co: Coordinator) -> None:
        agent = await FakeAgent(co, "n1", "1xL4-24GB", features=["debug"]).connect()
        alice = InProcessClient(co, "alice")
        job_id = await alice.submit(partition="debug")
        await agent.started(job_id)
        placement = (await alice.get(job_id)).spec.placement
        assert (placement.constraint, placement.partitions) == ("debug", ())
        assert [list(n.partitions) for n in alice.nodes()] == [[]]

    run(store, body)
