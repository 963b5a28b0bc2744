"""Fencing (issue 23's acceptance, as figures): prints, asserts nothing.

    python bench/fencing_bench.py [--part kill|stop|all]

Node a (8 fake GPUs) runs 8 one-GPU jobs; node b (8 GPUs) is free; heartbeat_timeout 20 s,
fence_time 8 s, kill_grace 2 s. Node a's agent is killed (`kill`: SIGKILL) or frozen (`stop`:
SIGSTOP for 35 s). Each job records its own runs (tests/e2e/test_fencing_e2e.py's script):
for each, when its run on a last showed life and when its run on b started, relative to the
fault, and how long the two overlapped (the issue saw 8 of 8 overlap for about 40 s and 22 s).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))
from e2e_cluster import wait_for
from test_fencing_e2e import eight_running_on_a, fencing_cluster, runs

from gpuq.domain.states import JobState


def part(kind: str) -> None:
    with tempfile.TemporaryDirectory(prefix="gpuq-fencing-") as folder:
        cluster = fencing_cluster(Path(folder))
        try:
            ids = eight_running_on_a(cluster)
            agent = cluster.agents["a"]
            fault = time.time()
            if kind == "kill":
                cluster.kill(agent)
            else:
                agent.send_signal(signal.SIGSTOP)
            try:
                ended = [
                    cluster.wait_state(i, "completed", "failed", "cancelled", timeout=90)
                    for i in ids
                ]
                if kind == "stop":
                    wait_for(lambda: time.time() > fault + 35, timeout=40, what="35 s")
            finally:
                if kind == "stop":
                    agent.send_signal(signal.SIGCONT)
            report(kind, fault, ids, ended, cluster.root)
        finally:
            cluster.close()


def report(kind: str, fault: float, ids: list[int], ended: list, root: Path) -> None:
    last_a, start_b, overlaps = [], [], []
    for job_id in ids:
        found = runs(root / f"rec-{job_id}")
        on_a = [r for r in found if r.node == "a"]
        on_b = [r for r in found if r.node == "b"]
        last_a.append(max(r.last for r in on_a) - fault)
        if on_b:
            start_b.append(on_b[0].start - fault)
            overlaps.append(max(0.0, max(r.last for r in on_a) - on_b[0].start))
    completed = sum(job.state is JobState.COMPLETED for job in ended)
    overlapped = sum(o > 0 for o in overlaps)
    print(f"{kind}: {completed}/{len(ids)} completed once; {overlapped} overlapped", end="")
    print(f" (longest {max(overlaps, default=0.0):.2f} s)")
    print(f"  last sign of the run on a: median +{statistics.median(last_a):.2f} s after the fault")
    print(f"  (min +{min(last_a):.2f}, max +{max(last_a):.2f}); fence_time 8 s")
    if start_b:
        print(f"  run on b started: median +{statistics.median(start_b):.2f} s (min ", end="")
        print(f"+{min(start_b):.2f}); node timeout 20 s")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("kill", "stop", "all"), default="all")
    chosen = parser.parse_args().part
    for kind in ("kill", "stop"):
        if chosen in (kind, "all"):
            part(kind)


if __name__ == "__main__":
    main()
