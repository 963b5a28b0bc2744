"""Jobs on two nodes with real, distinct addresses (each agent in a network namespace of its
own, tests/netns.py): a script written for SLURM runs unchanged (`srun` on both nodes, SLURM's
and torch.distributed's variables per task, disjoint GPUs), a real rendezvous at MASTER_ADDR,
one job one fate (a failing rank ends the job within seconds and leaves no process on any
node), and a lost node ends the job everywhere and requeues it as one."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from e2e_cluster import wait_for
from netns import NetnsCluster

from gpuq.domain.states import JobState

ALLREDUCE = Path(__file__).resolve().parents[1] / "programs" / "allreduce.py"


def script(cluster: NetnsCluster, name: str, body: str, header: str = "") -> Path:
    path = cluster.root / name
    path.write_text(
        "#!/bin/bash\n"
        "#SBATCH --nodes=2\n"
        "#SBATCH --ntasks-per-node=1\n"
        "#SBATCH --gpus-per-node=2\n" + header + body + "\n"
    )
    return path


def submit(cluster: NetnsCluster, path: Path) -> int:
    return cluster.client().submit(path, environ=cluster.env, chdir=str(cluster.root))


def job_processes(cluster: NetnsCluster, node: str, token: str) -> list[int]:
    """Processes in the node's namespace whose command line holds `token` (a job's own)."""
    found = []
    for pid in cluster.node_namespaces[node].pids():
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in command:
            found.append(pid)
    return found


def output_of(cluster: NetnsCluster, job_id: int) -> str:
    path = cluster.root / f"gpuq-{job_id}.out"
    return path.read_text() if path.exists() else ""


def test_a_slurm_script_runs_a_step_on_both_nodes(netns_cluster: NetnsCluster) -> None:
    """The issue's acceptance: ranks 0 and 1, node ids 0 and 1, WORLD_SIZE 2, one
    MASTER_ADDR:MASTER_PORT (the first node's real address), two GPUs each, disjoint and the
    job's own on each node."""
    cluster = netns_cluster
    (cluster.root / "rec").mkdir()
    path = script(
        cluster,
        "records.sh",
        "srun sh -c 'echo $SLURM_PROCID $SLURM_NODEID $WORLD_SIZE "
        "$MASTER_ADDR:$MASTER_PORT $CUDA_VISIBLE_DEVICES > rec/$SLURM_PROCID'",
    )
    job_id = submit(cluster, path)
    job = cluster.wait_state(job_id, "completed", "failed", timeout=60)
    assert job.state.value == "completed", output_of(cluster, job_id)
    records = sorted(p.read_text().split() for p in (cluster.root / "rec").iterdir())
    assert [r[:3] for r in records] == [["0", "0", "2"], ["1", "1", "2"]]
    first = job.nodes[0]
    assert {r[3] for r in records} == {f"{cluster.address(first)}:{records[0][3].split(':')[1]}"}
    gpus = [set(r[4].split(",")) for r in records]
    assert all(len(g) == 2 for g in gpus) and not gpus[0] & gpus[1]
    assert gpus[0] | gpus[1] == set(job.gpus)
    by_node = {n.name: {g.uuid for g in n.gpus} for n in cluster.client().nodes()}
    assert gpus[0] <= by_node[job.nodes[0]] and gpus[1] <= by_node[job.nodes[1]]


def test_ranks_rendezvous_at_master_addr_and_all_reduce(netns_cluster: NetnsCluster) -> None:
    """A real rendezvous: each rank connects to MASTER_ADDR:MASTER_PORT from its own node's
    address and all-reduces; every rank reports WORLD_SIZE 2 and the sum; srun forwards both
    ranks' output to the job's output file."""
    cluster = netns_cluster
    path = script(cluster, "allreduce.sh", f"srun {sys.executable} {ALLREDUCE} --timeout 30")
    job_id = submit(cluster, path)
    job = cluster.wait_state(job_id, "completed", "failed", timeout=60)
    output = output_of(cluster, job_id)
    assert job.state.value == "completed", output
    lines = sorted(line for line in output.splitlines() if line.startswith("rank="))
    master = cluster.address(job.nodes[0])
    assert [line.split()[:3] for line in lines] == [
        ["rank=0", "world=2", "sum=3"],
        ["rank=1", "world=2", "sum=3"],
    ]
    hosts = {line.split("host=")[1] for line in lines}
    assert hosts == {cluster.address(n) for n in job.nodes}
    assert all(f"addr={master}:" in line for line in lines)


def test_a_failing_rank_ends_the_job_on_every_node_within_seconds(
    netns_cluster: NetnsCluster,
) -> None:
    """Rank 1 exits 1 after the rendezvous while rank 0 blocks reading from it (a hung
    collective): the job ends failed within 10 s, its reason names task 1, and no process of
    it is left on either node."""
    cluster = netns_cluster
    token = f"hang{os.getpid()}x{time.monotonic_ns()}"
    path = script(
        cluster,
        "hang.sh",
        f"srun {sys.executable} {ALLREDUCE} --fail-after-rendezvous --fail-rank 1 "
        f"--hang 300 --timeout 30 --value 1 # {token}",
    )
    job_id = submit(cluster, path)
    cluster.wait_state(job_id, "running", timeout=30)
    wait_for(
        lambda: (
            "rank=1" in output_of(cluster, job_id) or cluster.job(job_id).state.value != "running"
        ),
        30,
        "rank 1 to pass the rendezvous",
    )
    began = time.monotonic()
    job = cluster.wait_state(job_id, "failed", timeout=10)
    assert time.monotonic() - began < 10
    assert "task 1" in job.reason, job.reason
    for node in job.nodes:
        wait_for(
            lambda node=node: not job_processes(cluster, node, str(ALLREDUCE)),
            10,
            f"no rank left on {node}",
        )


def test_the_issues_failing_step(netns_cluster: NetnsCluster) -> None:
    """The issue's second acceptance: rank 1 `exit 1`, rank 0 `sleep 300`: failed within 15 s
    and no `sleep 300` left."""
    cluster = netns_cluster
    path = script(
        cluster,
        "exit1.sh",
        "srun sh -c 'if [ \"$SLURM_PROCID\" = 1 ]; then exit 1; fi; exec sleep 300'",
    )
    job_id = submit(cluster, path)
    job = cluster.wait_state(job_id, "failed", "completed", timeout=15)
    assert job.state.value == "failed", output_of(cluster, job_id)
    for node in ("n0", "n1"):
        wait_for(
            lambda node=node: not job_processes(cluster, node, "sleep\x00300"),
            5,
            f"no sleep 300 left on {node}",
        )


def test_a_lost_node_ends_the_job_everywhere_and_requeues_it(
    netns_cluster: NetnsCluster,
) -> None:
    """kill -9 of one node's agent and supervisors: the job ends node_fail, nothing of it is
    left on the surviving node within the fence time, and it is queued again as one job."""
    cluster = netns_cluster
    token = f"lost{os.getpid()}x{time.monotonic_ns()}"
    path = script(cluster, "lost.sh", f"srun sh -c 'exec sleep 300 # {token}'")
    job_id = submit(cluster, path)
    job = cluster.wait_state(job_id, "running", timeout=30)
    wait_for(
        lambda: all(job_processes(cluster, n, "sleep\x00300") for n in job.nodes),
        20,
        "a task on each node",
    )
    lost, alive = job.nodes[1], job.nodes[0]
    cluster.kill_agent(lost)
    again = cluster.wait_state(job_id, "pending", timeout=30)
    assert again.requeue_count == 1
    wait_for(
        lambda: not job_processes(cluster, alive, "sleep\x00300"),
        10,
        f"nothing of the job left on {alive}",
    )


def test_a_nodes_agent_killed_alone_has_its_part_fenced_and_the_job_requeued(
    netns_cluster: NetnsCluster,
) -> None:
    """kill -9 of one node's agent only: its part's supervisor stops the part when its lease
    runs out, srun sees the task go, and the coordinator, which has not heard from that node
    for its fence_time, ends the job node_fail (not failed) and requeues it once, as one job;
    nothing of it is left on either node."""
    cluster = netns_cluster
    token = "sleep\x00301"  # the tasks' command line (exec: no shell around it)
    path = script(cluster, "fenced.sh", "srun sh -c 'exec sleep 301'")
    job_id = submit(cluster, path)
    job = cluster.wait_state(job_id, "running", timeout=30)
    wait_for(lambda: all(job_processes(cluster, n, token) for n in job.nodes), 20, "a task on each")
    lost, alive = job.nodes[1], job.nodes[0]
    cluster.kill(cluster.agents[lost])  # its supervisors and the task go on, unwatched

    def node_fail() -> list[str]:
        _, events = cluster.client().detail(job_id)
        return [e.reason for e in events if e.to_state is JobState.NODE_FAIL]

    [reason] = wait_for(node_fail, 30, "the job to end node_fail")
    assert f"node {lost} stopped answering (its part of the job was fenced)" in reason, reason
    assert not job_processes(cluster, lost, token)  # fenced before srun saw it go
    wait_for(lambda: not job_processes(cluster, alive, token), 10, f"nothing left on {alive}")
    assert cluster.job(job_id).requeue_count == 1
