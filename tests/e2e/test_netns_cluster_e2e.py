"""Several nodes on one machine with real, distinct addresses (tests/netns.py): the network
namespaces reach each other and nothing else, a real rendezvous runs across them, a gpuq
cluster's agents run in them, and nothing of it is left afterwards."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_cluster import pid_alive, wait_for
from netns import NetnsCluster, TestNetwork, require_netns, start_netns_cluster

from gpuq.domain.states import JobState

ALLREDUCE = Path(__file__).resolve().parents[1] / "programs" / "allreduce.py"
LINE = re.compile(r"^rank=(\d+) world=(\d+) sum=(\d+) addr=(\S+) host=(\S+)$", re.MULTILINE)


def start_ranks(network: TestNetwork, port: int, *options: str) -> list[subprocess.Popen[str]]:
    """allreduce.py as rank i in namespace i, MASTER_ADDR the first namespace's address."""
    ranks = []
    for namespace in network.namespaces:
        env = {
            "PATH": "/usr/bin:/bin",
            "MASTER_ADDR": network[0].address,
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(network.count),
            "RANK": str(namespace.index),
        }
        ranks.append(
            namespace.popen(
                [sys.executable, str(ALLREDUCE), "--timeout", "20", *options],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return ranks


def test_ranks_in_two_namespaces_rendezvous_at_distinct_real_addresses(tmp_path: Path) -> None:
    """Rank 0 listens on its namespace's address, rank 1 connects from the other: both see a
    world of 2 and the sum 1+2, each from its own address; a namespace reaches nothing
    outside the test subnet; closing the network kills what still runs inside and leaves no
    namespace, veth or bridge."""
    require_netns()
    network = TestNetwork(2)
    with network:
        assert network[0].address != network[1].address
        ranks = start_ranks(network, 29500)
        lines = []
        for rank in ranks:
            out, err = rank.communicate(timeout=40)
            assert rank.returncode == 0, err
            lines.append(out)
        found = [LINE.search(out) for out in lines]
        assert all(found), lines
        parsed = [m.groups() for m in found if m]
        master = f"{network[0].address}:29500"
        assert parsed == [
            ("0", "2", "3", master, network[0].address),
            ("1", "2", "3", master, network[1].address),
        ]

        # no route out: TEST-NET addresses (this host's own network included) fail at once
        probe = (
            "import socket, time\n"
            "for host in ('192.0.2.1', '198.51.100.1'):\n"
            "    t = time.monotonic()\n"
            "    try:\n"
            "        socket.create_connection((host, 80), timeout=5)\n"
            "    except OSError as e:\n"
            "        print(e.errno, round(time.monotonic() - t, 2))\n"
        )
        done = network[1].run([sys.executable, "-c", probe])
        outcomes = [line.split() for line in done.stdout.splitlines()]
        assert [errno for errno, _ in outcomes] == ["101", "101"], done  # ENETUNREACH
        assert all(float(took) < 1.0 for _, took in outcomes)

        # a process left running inside is killed when the network is removed
        left = network[1].popen(["sleep", "600"])
        # `ip netns exec` enters the namespace a moment after it starts
        wait_for(lambda: network[1].pids() == [left.pid], 10, "sleep to be in the namespace")
    assert left.wait(5) == -9
    assert network.leftovers() == []
    names = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    names += subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert network.prefix not in names


def test_a_rank_that_dies_after_the_rendezvous_leaves_the_other_blocked(
    netns_network: TestNetwork,
) -> None:
    """--fail-rank 1: rank 1 exits 1 right after the all-reduce, while rank 0 blocks reading
    from it (a hung collective), as the multi-node failure tests need."""
    rank0, rank1 = start_ranks(netns_network, 29501, "--fail-rank", "1", "--hang", "60")
    out1, _ = rank1.communicate(timeout=40)
    assert rank1.returncode == 1
    assert "rank=1 world=2 sum=3" in out1
    assert rank0.stdout is not None
    assert rank0.stdout.readline().startswith("rank=0 world=2 sum=3")
    with pytest.raises(subprocess.TimeoutExpired):
        rank0.wait(1.0)  # still blocked a second after its peer died


def job_output(cluster: NetnsCluster, job_id: int) -> str:
    return (cluster.root / f"gpuq-{job_id}.out").read_text()


# what a job prints: its node, `hostname -I`, and the address its socket toward the bridge
# leaves from
SHOW_ADDRESS = (
    'echo "node=$GPUQ_NODE"; echo "hostname=$(hostname -I)"; '
    "{python} -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
    's.connect(("{bridge}", 9)); print("socket=" + s.getsockname()[0])\''
)


def test_agents_in_namespaces_run_jobs_at_their_own_addresses(tmp_path: Path) -> None:
    """A coordinator on the bridge, agents n0 and n1 each in its own namespace over TCP: both
    nodes are up, a job pinned to each runs there and sees that node's address, and when the
    cluster is closed no namespace, veth or bridge is left."""
    require_netns()
    started = time.monotonic()
    with start_netns_cluster(tmp_path) as cluster:
        network = cluster.network
        nodes = {n.name: n for n in cluster.client().nodes()}
        assert {name: nodes[name].state for name in ("n0", "n1")} == {"n0": "up", "n1": "up"}
        listed = cluster.gpuq("nodes")
        assert listed.returncode == 0, listed.stderr
        assert re.search(r"^n0\s.*\bup\b", listed.stdout, re.MULTILINE), listed.stdout
        assert re.search(r"^n1\s.*\bup\b", listed.stdout, re.MULTILINE), listed.stdout

        command = SHOW_ADDRESS.format(python=sys.executable, bridge=network.bridge_address)
        jobs = {node: cluster.submit(command, nodelist=node, gpus=1) for node in ("n0", "n1")}
        for node, job_id in jobs.items():
            job = cluster.wait_state(job_id, "completed", "failed", "cancelled")
            assert job.state is JobState.COMPLETED, job_output(cluster, job_id)
            assert job.node == node
            address = cluster.address(node)
            assert job_output(cluster, job_id).split() == [
                f"node={node}",
                f"hostname={address}",
                f"socket={address}",
            ]
        assert cluster.address("n0") != cluster.address("n1")
        assert {cluster.address(n) for n in ("n0", "n1")} == set(network.addresses())
    assert network.leftovers() == []
    assert time.monotonic() - started < 60


def test_a_killed_agent_and_its_supervisors_leave_its_job_orphaned_and_the_node_down(
    netns_cluster: NetnsCluster,
) -> None:
    """kill_agent: node n1's agent and its job's supervisor die at once (kill -9), the job's
    own process stays (as after a crash of gpuq alone), the node goes down; kill_node then
    takes everything left in n1's namespace."""
    cluster = netns_cluster
    pid_file = cluster.root / "job.pid"
    job_id = cluster.submit(f"echo $$ > {pid_file}; exec sleep 600", nodelist="n1", gpus=1)
    cluster.wait_state(job_id, "running")
    pid = wait_for(lambda: pid_file.exists() and int(pid_file.read_text() or 0), what="job pid")
    [supervisor] = wait_for(lambda: cluster.supervisors("n1"), what="n1's supervisor")
    killed = cluster.kill_agent("n1")
    assert set(killed) == {cluster.agents["n1"].pid, supervisor}
    assert pid_alive(pid) and pid in cluster.node_namespaces["n1"].pids()
    cluster.wait_node("n1", "down", timeout=20)
    cluster.kill_node("n1")
    wait_for(lambda: not pid_alive(pid), 10, "the orphaned job process to die with its node")
    assert cluster.node_namespaces["n1"].pids() == []
    assert cluster.agents["n0"].pid in cluster.node_namespaces["n0"].pids()
    cluster.wait_node("n0", "up")  # the other node lives on


def test_ranks_read_slurm_variables_and_several_share_a_namespace(
    netns_network: TestNetwork,
) -> None:
    """Without RANK and WORLD_SIZE, SLURM_PROCID and SLURM_NTASKS say them (as srun sets):
    three ranks, two on the second node, all-reduce 1+2+3 at the first node's address."""
    master = netns_network[0].address
    ranks = []
    for rank, namespace in enumerate([netns_network[0], netns_network[1], netns_network[1]]):
        env = {"MASTER_ADDR": master, "MASTER_PORT": "29502"}
        env |= {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "3"}
        ranks.append(
            namespace.popen(
                [sys.executable, str(ALLREDUCE), "--timeout", "20"],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    outputs = [rank.communicate(timeout=40)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0, 0]
    hosts = [netns_network[0].address, netns_network[1].address, netns_network[1].address]
    assert outputs == [
        f"rank={i} world=3 sum=6 addr={master}:29502 host={host}\n" for i, host in enumerate(hosts)
    ]


def test_a_cut_node_goes_down_and_comes_back_when_mended(netns_cluster: NetnsCluster) -> None:
    """cut: n1's packets are dropped (its connection hangs, nothing closes it): the
    coordinator hears nothing and marks it down; mend: its agent is heard again."""
    netns_cluster.cut("n1")
    netns_cluster.wait_node("n1", "down", timeout=20)
    netns_cluster.wait_node("n0", "up")
    netns_cluster.mend("n1")
    netns_cluster.wait_node("n1", "up", timeout=60)
