"""A job runs once, even when its node dies (issue 23's acceptance, with real processes).

Node a's agent is killed, frozen or cut off while it runs jobs; node timeout 20 s, fence_time
8 s. Every job keeps its own record (start with node and GPU, a beat every 0.1 s, end), and
the records, not the coordinator, say whether a job ever ran on two nodes at once."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from e2e_cluster import Cluster, wait_for
from test_network_cut_e2e import BlackholeProxy

from gpuq.domain.states import JobState

pytestmark = pytest.mark.timeout(240)

FENCE_TIME = 8.0
NODE_TIMEOUT = 20.0
JOBS = 8
CPUS = "[agent]\ncpus = 32\n"  # eight 1-CPU jobs at once on any machine


def fencing_cluster(root: Path) -> Cluster:
    return Cluster(root, CPUS, fence_time=FENCE_TIME, node_timeout=NODE_TIMEOUT)


def record_script(root: Path, on_b_beats: int) -> str:
    """A job that records its run in rec-<id>: on node a it runs until stopped, on node b it
    ends by itself after `on_b_beats` beats."""
    return (
        "f={root}/rec-$GPUQ_JOB_ID; "
        'echo "start $GPUQ_NODE $CUDA_VISIBLE_DEVICES $(date +%s.%N)" >> $f; '
        "trap 'echo \"end $GPUQ_NODE $(date +%s.%N)\" >> $f; exit 143' TERM; n=0; "
        'while :; do echo "beat $GPUQ_NODE $(date +%s.%N)" >> $f; '
        f"if [ $GPUQ_NODE = b ]; then n=$((n+1)); [ $n -ge {on_b_beats} ] && break; fi; "
        "sleep 0.1; done; "
        'echo "end $GPUQ_NODE $(date +%s.%N)" >> $f'
    ).replace("{root}", str(root))


@dataclass
class Run:
    node: str
    gpus: str
    start: float
    last: float
    ended: bool = False
    beats: list[float] = field(default_factory=list)


def runs(record: Path) -> list[Run]:
    """The job's runs, as it recorded them."""
    found: list[Run] = []
    for line in record.read_text().splitlines():
        kind, node, *rest = line.split()
        if not rest:  # a beat whose `date` the fence's SIGTERM killed: no time to read
            continue
        at = float(rest[-1])
        if kind == "start":
            found.append(Run(node, rest[0] if len(rest) > 1 else "", at, at))
            continue
        run = next(r for r in reversed(found) if r.node == node)
        run.last = max(run.last, at)
        run.ended = run.ended or kind == "end"
        if kind == "beat":
            run.beats.append(at)
    return found


def never_on_two_nodes_at_once(cluster: Cluster, ids: list[int]) -> dict[int, list[Run]]:
    """Each job completed exactly once, on b, after its run on a had certainly stopped."""
    every: dict[int, list[Run]] = {}
    for job_id in ids:
        job = cluster.wait_state(job_id, "completed", "failed", "cancelled", timeout=60)
        assert job.state is JobState.COMPLETED and job.node == "b", job
        _, history = cluster.client().detail(job_id)
        assert [e.to_state for e in history].count(JobState.COMPLETED) == 1
        found = runs(cluster.root / f"rec-{job_id}")
        assert [r.node for r in found] == ["a", "b"], found
        on_a, on_b = found
        assert on_a.last < on_b.start, (job_id, on_a, on_b)  # no overlap, by its own record
        every[job_id] = found
    return every


def eight_running_on_a(cluster: Cluster) -> list[int]:
    cluster.start_coordinator()
    cluster.start_agent("a", f"{JOBS}xA100-80GB")
    ids = [cluster.submit(record_script(cluster.root, 20), gpus=1) for _ in range(JOBS)]
    for job_id in ids:
        assert cluster.wait_state(job_id, "running").node == "a"
    wait_for(
        lambda: all((cluster.root / f"rec-{i}").exists() for i in ids), what="every job to start"
    )
    cluster.start_agent("b", f"{JOBS}xA100-80GB")  # free, for the requeued jobs
    return ids


def test_a_killed_agents_jobs_are_fenced_before_they_run_elsewhere(tmp_path: Path) -> None:
    cluster = fencing_cluster(tmp_path)
    try:
        ids = eight_running_on_a(cluster)
        cluster.kill(cluster.agents["a"])
        killed = time.time()
        every = never_on_two_nodes_at_once(cluster, ids)
        for job_id, (on_a, on_b) in every.items():
            # its supervisor stopped it fence_time after the last confirmed heartbeat (one
            # every 0.3 s), not at once; it ran again only after the node timeout
            assert killed + FENCE_TIME - 1.0 < on_a.last < killed + FENCE_TIME + 1.5, on_a
            assert on_a.ended  # SIGTERM: it recorded its end
            assert on_b.start > killed + NODE_TIMEOUT - 0.5
            _, history = cluster.client().detail(job_id)
            states = [e.to_state.value for e in history]
            assert states == ["pending", "running", "node_fail", "pending", "running", "completed"]
    finally:
        cluster.close()


def test_a_frozen_agents_jobs_are_fenced_before_they_run_elsewhere(tmp_path: Path) -> None:
    """SIGSTOP of the agent for 35 s: its jobs are fenced at fence_time, run again on b after
    the node timeout; when the agent thaws, their fenced ends go into their history."""
    cluster = fencing_cluster(tmp_path)
    try:
        ids = eight_running_on_a(cluster)
        agent = cluster.agents["a"]
        agent.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        try:
            every = never_on_two_nodes_at_once(cluster, ids)
            wait_for(lambda: time.monotonic() > frozen + 35, timeout=40, what="35 s frozen")
        finally:
            agent.send_signal(signal.SIGCONT)
        cluster.wait_node("a", "up", timeout=30)
        for job_id in ids:
            late = wait_for(
                lambda job_id=job_id: [  # type: ignore[misc]
                    e.reason
                    for e in cluster.client().detail(job_id)[1]
                    if "reported late" in e.reason
                ],
                what=f"job {job_id}'s fenced start in its history",
            )
            assert late[0].startswith("start 1 on node a ended node_fail at "), late
            assert "fenced: the node's agent stopped answering" in late[0], late
            assert every[job_id][0].ended
    finally:
        cluster.close()


def test_a_job_that_completed_during_a_cut_never_runs_again(tmp_path: Path) -> None:
    """A 40 s silent cut (a TCP proxy that drops everything) while 6 s jobs run on the only
    node: the jobs running at the cut complete during it; the coordinator gives the node up
    after 20 s and requeues them; when the cut heals, their late "completed" withdraws the
    requeue. Every job ran exactly once, by its own record."""
    cluster = fencing_cluster(tmp_path)
    proxy: BlackholeProxy | None = None
    try:
        cluster.start_coordinator()
        proxy = BlackholeProxy(cluster.tcp_address)
        args = ["agent", "--node-name", "a", "--fake-gpus", "4xA100-80GB"]
        cluster.agents["a"] = cluster._spawn([*args, "--coordinator", proxy.address], "agent-a")
        cluster.wait_node("a", "up")
        root = cluster.root
        script = (
            'f={root}/rec-$GPUQ_JOB_ID; echo "start a x $(date +%s.%N)" >> $f; sleep 6; '
            'echo "end a $(date +%s.%N)" >> $f'
        ).replace("{root}", str(root))
        ids = [cluster.submit(script, gpus=1) for _ in range(12)]
        first = wait_for(
            lambda: [i for i in ids if (root / f"rec-{i}").exists()], what="a first wave"
        )
        proxy.blackhole()
        cut = time.monotonic()
        wait_for(lambda: time.monotonic() > cut + 40, timeout=45, what="a 40 s cut")
        proxy.heal()
        withdrawn = 0
        for job_id in ids:
            job = cluster.wait_state(job_id, "completed", "failed", "cancelled", timeout=90)
            assert job.state is JobState.COMPLETED, job
            starts = [r for r in runs(root / f"rec-{job_id}")]
            assert len(starts) == 1 and starts[0].ended, (job_id, starts)
            _, history = cluster.client().detail(job_id)
            if any("its requeue is withdrawn" in e.reason for e in history):
                withdrawn += 1
        assert withdrawn >= len(first) > 0  # the jobs running at the cut came back late
    finally:
        cluster.close()
        if proxy is not None:
            proxy.close()
