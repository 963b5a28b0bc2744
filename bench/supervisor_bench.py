"""Supervision benchmark: how many `true` jobs one agent's supervisors and fork server complete
with 8 in flight, and the CPU each costs (prints figures, asserts nothing).

    python bench/supervisor_bench.py
"""

from __future__ import annotations

import asyncio
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

from supervisor_helpers import Reports, await_until, make_spec

from gpuq.agent.jobs import process_tree
from gpuq.agent.jobs.supervisors import Supervisors

JOBS = 600
IN_FLIGHT = 8


def cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def main(tmp_path: Path) -> None:
    async def scenario() -> tuple[float, float, float]:
        reports = Reports()
        hub = Supervisors(tmp_path / "state", reports, ack_wait=20)
        await hub.start()
        assert hub.forks.fork_server is not None
        fork_server = hub.forks.fork_server.process.pid
        ended: asyncio.Queue[int] = asyncio.Queue()
        hub.on_report = lambda r: ended.put_nowait(r.job_id) if r.kind == "ended" else None
        specs = [make_spec(tmp_path, i, "true\n", stdout_path="/dev/null") for i in range(JOBS)]
        self_0, children_0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        launches = [asyncio.ensure_future(hub.launch(spec)) for spec in specs[:IN_FLIGHT]]
        for _ in range(JOBS):
            await hub.ack(await ended.get())
            if len(launches) < JOBS:
                launches.append(asyncio.ensure_future(hub.launch(specs[len(launches)])))
        await asyncio.gather(*launches)
        elapsed = time.perf_counter() - began
        hub_cpu = cpu(resource.RUSAGE_SELF) - self_0
        # every supervisor reaped by the fork server, which close() reaps: all CPU is counted
        await await_until(lambda: not process_tree.children_of(fork_server), 10, "supervisors")
        await hub.close()
        return elapsed, hub_cpu, cpu(resource.RUSAGE_CHILDREN) - children_0

    elapsed, hub_cpu, children_cpu = asyncio.run(scenario())
    print(
        f"\n{JOBS / elapsed:.0f} jobs/s of `true`, {IN_FLIGHT} in flight; CPU per job: "
        f"hub {hub_cpu / JOBS * 1000:.2f} ms, fork server + supervisor + job "
        f"{children_cpu / JOBS * 1000:.2f} ms"
    )


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        main(Path(folder))
