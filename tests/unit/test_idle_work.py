"""What an idle node and an idle coordinator do: GPUs no job holds are read for their health,
not their telemetry; NVML's critical events still reach the agent from its event thread; the
periodic scheduling pass runs only while jobs wait."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from harness import run, submit
from helpers import make_spec, until

from gpuq.agent.fake.gpu_backend import FakeGpuBackend
from gpuq.agent.fake.gpu_spec import GIB
from gpuq.agent.fake.gpu_state import claim_fake_vram
from gpuq.agent.gpu.node_gpus import NodeGpus
from gpuq.config.settings import AgentSettings, CoordinatorSettings
from gpuq.coordinator.server import Coordinator
from gpuq.domain.states import JobState
from gpuq.store.api import Store

TELEMETRY_CALLS = ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTotalEnergyConsumption")


class Jobs:
    """The node's running jobs, as NodeGpus sees them (job id -> its units)."""

    def __init__(self) -> None:
        self.running: dict[int, tuple[str, ...]] = {}

    def running_jobs(self) -> list[int]:
        return sorted(self.running)

    def launch_spec_of(self, job_id: int) -> None:
        return None

    def supervisor_pids(self) -> dict[int, int]:
        return {}


def node(
    tmp_path: Path, stops: list[tuple[int, str, str]] | None = None, rescan: float = 60.0
) -> NodeGpus:
    backend = FakeGpuBackend("4xH100-80GB", "n1", state_dir=tmp_path / "fake-gpus")

    async def stop(job_id: int, state: str, reason: str, grace: float) -> None:
        if stops is not None:
            stops.append((job_id, state, reason))

    return NodeGpus(
        backend,
        AgentSettings(node_name="n1", gpu_rescan=rescan),
        Jobs(),
        beat_now=lambda: None,
        units_changed=lambda: None,
        stop_job=stop,
    )


def count_calls(gpus: NodeGpus) -> Counter[tuple[str, int]]:
    """(NVML call, GPU index) -> how often the backend made it from now on."""
    library: Any = gpus.backend.library  # type: ignore[attr-defined]
    counts: Counter[tuple[str, int]] = Counter()
    for name in (*TELEMETRY_CALLS, "nvmlDeviceGetMemoryInfo"):
        real = getattr(library, name)

        def counted(handle: Any, *args: Any, _real: Any = real, _name: str = name) -> Any:
            counts[(_name, handle.index)] += 1
            return _real(handle, *args)

        setattr(library, name, counted)
    return counts


def start_job(gpus: NodeGpus, job_id: int, *units: str) -> None:
    gpus.jobs.running[job_id] = units  # type: ignore[attr-defined]
    gpus.holders.job_units[job_id] = units


def test_an_idle_node_reads_its_gpus_health_and_no_telemetry(tmp_path: Path) -> None:
    gpus = node(tmp_path)
    units = [u.uuid for u in gpus.inventory.units]
    calls = count_calls(gpus)

    idle = gpus.reads.usage()
    assert [u.health for u in idle] == ["ok"] * 4
    assert [u.utilization for u in idle] == [0] * 4  # what `gpuq nodes` and metrics show
    assert not [c for c in calls if c[0] in TELEMETRY_CALLS]
    assert {c[1] for c in calls if c[0] == "nvmlDeviceGetMemoryInfo"} == {0, 1, 2, 3}

    start_job(gpus, 7, units[1])
    calls.clear()
    gpus.reads.usage()
    assert {c for c in calls if c[0] in TELEMETRY_CALLS} == {(name, 1) for name in TELEMETRY_CALLS}
    assert gpus.telemetry.job_samples(), "the job's telemetry is sampled"


def test_a_process_on_a_free_gpu_has_its_utilisation_read(tmp_path: Path) -> None:
    gpus = node(tmp_path)
    units = [u.uuid for u in gpus.inventory.units]
    claim_fake_vram(units[2], 3 * GIB, pid=os.getpid(), state_dir=tmp_path / "fake-gpus")
    calls = count_calls(gpus)
    figures = {u.uuid: u for u in gpus.reads.usage()}
    assert calls[("nvmlDeviceGetUtilizationRates", 2)] == 1
    assert calls[("nvmlDeviceGetTotalEnergyConsumption", 2)] == 0  # a job's figure only
    assert figures[units[2]].memory_used >= 3 * GIB


def test_a_hardware_xid_reaches_the_agent_from_its_event_thread(tmp_path: Path) -> None:
    stops: list[tuple[int, str, str]] = []
    gpus = node(tmp_path, stops)
    units = [u.uuid for u in gpus.inventory.units]
    start_job(gpus, 7, units[0])

    async def main() -> None:
        duties = asyncio.create_task(gpus.run())
        try:
            folder = tmp_path / "fake-gpus" / units[0]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "xid").write_text("48\n")
            deadline = time.monotonic() + 10
            while not stops:
                assert time.monotonic() < deadline, "the XID never reached the agent"
                await asyncio.sleep(0.02)
        finally:
            duties.cancel()
            await asyncio.gather(duties, return_exceptions=True)

    asyncio.run(main())
    assert stops == [(7, JobState.NODE_FAIL, "GPU 0 failed: XID 48 (double-bit ECC error (DBE))")]
    gpus.backend.close()


def test_a_read_that_wants_a_refresh_has_the_inventory_read_at_once(tmp_path: Path) -> None:
    """The rescan loop looks at nothing between two [agent] gpu_rescan (an hour here): a read
    of the units that met an error a refresh may cure (a reset GPU, stale handles) has the
    inventory read again at once, from the reading thread."""
    gpus = node(tmp_path, rescan=3600.0)
    units = [u.uuid for u in gpus.inventory.units]
    refreshed: list[bool] = []
    refresh = gpus.backend.refresh

    def counted() -> bool:
        changed = refresh()
        refreshed.append(changed)
        return changed

    gpus.backend.refresh = counted  # type: ignore[method-assign]

    async def main() -> None:
        duties = asyncio.create_task(gpus.run())
        try:
            await asyncio.to_thread(gpus.reads.usage)  # healthy: nothing wanted
            (tmp_path / "fake-gpus" / "errors").write_text(
                f"nvmlDeviceGetMemoryInfo_v2 Unknown {units[1]}\n"
            )
            await asyncio.to_thread(gpus.reads.usage)
            await until(lambda: refreshed, what="a refresh")
            assert not gpus.backend.needs_refresh  # type: ignore[attr-defined]
        finally:
            duties.cancel()
            await asyncio.gather(duties, return_exceptions=True)

    asyncio.run(main())
    assert refreshed == [False]  # once, and the units stayed the same


def test_the_periodic_pass_runs_only_while_jobs_wait(sqlite_url: str) -> None:
    store = Store.open(sqlite_url)

    async def settled(co: Coordinator) -> None:
        """Until the scheduling loop has taken every ask for a pass."""
        deadline = time.monotonic() + 10
        while co.loop.requests.event.is_set():
            assert time.monotonic() < deadline, "the scheduling loop never ran"
            await asyncio.sleep(0.01)

    async def body(co: Coordinator) -> None:
        await settled(co)
        co.periodic_wake()
        assert not co.loop.requests.event.is_set(), "nothing waits: no pass"
        [job] = await submit(co, make_spec(begin_time=time.time() + 3600), "alice")
        assert co.jobs.jobs[job].state is JobState.PENDING
        await settled(co)
        co.periodic_wake()
        assert co.loop.requests.event.is_set(), "a job waits for its begin time: a pass"

    try:
        run(store, body, CoordinatorSettings())
    finally:
        store.close()
