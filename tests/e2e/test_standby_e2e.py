"""A standby coordinator (issue 9): two coordinators on one PostgreSQL database, each with its
own GPUQ_HOME and TCP port; the leader serves and the standby waits, listening nowhere. Agents
and clients are given both addresses and follow the leader. After kill -9 of the leader the
standby takes over within 15 s, and every accepted job completes exactly once.

Also without PostgreSQL: a client and an agent given several addresses skip the unreachable
ones, and `--standby` on SQLite is refused with one line."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_cluster import Cluster, free_port, wait_for

from gpuq.client import Client, listing_request
from gpuq.config.loading import load_settings
from gpuq.errors import ServerUnavailable

TAKEOVER_LIMIT = 15.0  # seconds from the leader's death to the first answer from the standby


def listen_address(cluster: Cluster) -> str:
    """The TCP address the cluster's coordinator is configured to listen on."""
    match = re.search(r'listen = "([^"]+)"', (cluster.home / "config.toml").read_text())
    assert match is not None
    return match.group(1)


def log_text(cluster: Cluster, name: str) -> str:
    path = cluster.root / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def start_standby(standby: Cluster, leader: Cluster) -> subprocess.Popen[bytes]:
    """`gpuq coordinator --standby` in its own home, knowing the leader's nodes (as an admin
    copies the node keys to the standby's host); returns once it says it is standing by."""
    config = standby.home / "config.toml"
    nodes = f'nodes_dir = "{leader.home / "nodes"}"\n'
    config.write_text(config.read_text().replace("[coordinator]\n", "[coordinator]\n" + nodes, 1))
    process = standby._spawn(["coordinator", "--standby"], "coordinator")
    standby.coordinator = process
    wait_for(
        lambda: "standing by" in log_text(standby, "coordinator") or process.poll() is not None,
        timeout=30,
        what="the standby to stand by",
    )
    assert process.poll() is None, log_text(standby, "coordinator")
    return process


def mark_job(marks: Path) -> str:
    """A job that appends one line to its own file: a second run would leave two."""
    return f'echo "ran on $GPUQ_NODE" >> {marks}/$GPUQ_JOB_ID.txt && sleep 2'


def marks_of(marks: Path, job_id: int) -> list[str]:
    path = marks / f"{job_id}.txt"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.postgres
def test_the_standby_takes_over_when_the_leader_is_killed(
    tmp_path: Path, pg_schema_url: str
) -> None:
    leader, standby = Cluster(tmp_path / "a"), Cluster(tmp_path / "b")
    for cluster in (leader, standby):
        cluster.env["GPUQ_DATABASE_URL"] = pg_schema_url
    marks = tmp_path / "marks"
    marks.mkdir()
    client: Client | None = None
    try:
        leader.start_coordinator()
        first, second = leader.tcp_address, listen_address(standby)
        both = f"{first},{second}"
        start_standby(standby, leader)
        # over TCP a user shows a token an admin issued (kept in the shared store)
        token = leader.client().issue_token("root")
        # the standby answers nobody while it waits, and leaves no address file
        settings = load_settings(home=leader.home)
        with (
            Client(address=second, settings=settings, timeout=5, token=token) as probe,
            pytest.raises(ServerUnavailable),
        ):
            probe.nodes()
        assert not (standby.home / "coordinator.json").exists()

        leader.agents["n1"] = leader._spawn(
            ["agent", "--node-name", "n1", "--fake-gpus", "2", "--coordinator", both], "agent-n1"
        )
        leader.wait_node("n1", "up")
        client = Client(
            address=both, settings=load_settings(home=leader.home), timeout=10, token=token
        )
        jobs = [
            client.submit(wrap=mark_job(marks), gpus=1, environ=leader.env, chdir=str(tmp_path))
            for _ in range(6)
        ]
        assert client.address == first
        # two run (one per GPU), four wait
        wait_for(
            lambda: sum(client.get(j).state.value == "running" for j in jobs) == 2,
            what="two jobs to run",
        )
        wait_for(
            lambda: sum(len(marks_of(marks, j)) for j in jobs) == 2,
            what="the two running jobs to have started on the node",
        )

        leader.kill(leader.coordinator)
        killed = time.monotonic()

        def answered() -> bool:
            assert client is not None
            try:
                client.nodes()
            except ServerUnavailable:
                return False
            return True

        wait_for(answered, timeout=TAKEOVER_LIMIT + 15, what="the standby to answer")
        takeover = time.monotonic() - killed
        print(f"\nstandby takeover: {takeover:.2f} s from kill -9 to the first answer")
        assert takeover < TAKEOVER_LIMIT, takeover
        assert client.address == second
        log = log_text(standby, "coordinator")
        assert "took the store lock" in log and "Traceback" not in log, log

        standby.wait_node("n1", "up", timeout=30)  # the agent followed the leader
        assert "registered with the coordinator at " + second in log_text(leader, "agent-n1")
        # new submissions work, through the client and through the command line
        jobs.append(
            client.submit(wrap=mark_job(marks), gpus=1, environ=leader.env, chdir=str(tmp_path))
        )
        cli_env = {**leader.env, "GPUQ_COORDINATOR": both}
        token_file = tmp_path / "token"  # the user's saved token: the command line calls by TCP
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        with (leader.home / "config.toml").open("a") as config:
            config.write(f'\n[client]\ntoken_file = "{token_file}"\n')
        result = subprocess.run(
            [*leader_cli(leader), "submit", "--gpus", "1", "--parsable", "--wrap", mark_job(marks)],
            cwd=tmp_path,
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        jobs.append(int(result.stdout.strip().split(";")[0]))

        def all_finished() -> bool:
            assert client is not None
            return not any(client.get(j).state.is_live for j in jobs)

        wait_for(all_finished, timeout=90, what=f"jobs {jobs} to finish")
        states = {j: client.get(j).state.value for j in jobs}
        assert set(states.values()) == {"completed"}, states
        runs = {j: marks_of(marks, j) for j in jobs}
        assert all(len(lines) == 1 for lines in runs.values()), runs
    finally:
        if client is not None:
            client.close()
        leader.close()
        standby.close()


def leader_cli(cluster: Cluster) -> list[str]:
    return [sys.executable, "-m", "gpuq.cli.main", "--home", str(cluster.home)]


@pytest.mark.postgres
def test_a_standby_stops_at_sigterm_while_it_waits(tmp_path: Path, pg_schema_url: str) -> None:
    leader, standby = Cluster(tmp_path / "a"), Cluster(tmp_path / "b")
    for cluster in (leader, standby):
        cluster.env["GPUQ_DATABASE_URL"] = pg_schema_url
    try:
        leader.start_coordinator()
        assert leader.coordinator is not None
        process = start_standby(standby, leader)
        log = log_text(standby, "coordinator")
        assert f"pid={leader.coordinator.pid}" in log, log
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0, log_text(standby, "coordinator")
        assert leader.coordinator.poll() is None
        assert leader.client().nodes() is not None
    finally:
        leader.close()
        standby.close()


def test_standby_on_sqlite_is_refused_with_one_line(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    try:
        result = cluster.gpuq("--home", str(cluster.home), "coordinator", "--standby", timeout=60)
        assert result.returncode == 2, (result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "PostgreSQL" in lines[0], result.stderr
        assert not (cluster.home / "gpuq.sock").exists()
    finally:
        cluster.close()


def test_clients_and_agents_skip_an_unreachable_address(tmp_path: Path) -> None:
    """The first address answers nobody: the client and the agent use the second, and the
    client keeps using it."""
    cluster = Cluster(tmp_path)
    client: Client | None = None
    try:
        cluster.start_coordinator()
        dead = f"127.0.0.1:{free_port()}"
        both = f"{dead}, {cluster.tcp_address}"
        cluster.agents["n1"] = cluster._spawn(
            ["agent", "--node-name", "n1", "--fake-gpus", "1", "--coordinator", both], "agent-n1"
        )
        cluster.wait_node("n1", "up")
        token = cluster.client().issue_token("root")
        client = Client(
            address=both, settings=load_settings(home=cluster.home), timeout=10, token=token
        )
        assert client.addresses == [dead, cluster.tcp_address]
        # `gpuq status`'s calls sent together skip the dead address too
        glance = Client(
            address=both, settings=load_settings(home=cluster.home), timeout=10, token=token
        )
        with glance:
            nodes, (listed,) = glance.nodes_and_listings(listing_request(user="root"))
            assert [n.name for n in nodes] == ["n1"] and listed == []
            assert glance.address == cluster.tcp_address
        assert client.nodes()
        assert client.address == cluster.tcp_address
        job = client.submit(wrap="true", gpus=1, environ=cluster.env, chdir=str(tmp_path))
        done = client.wait(job, timeout=30)
        assert done.state.value == "completed"
        # all unreachable: one line naming them all
        nowhere = f"{dead},127.0.0.1:{free_port()}"
        with (
            Client(
                address=nowhere, settings=load_settings(home=cluster.home), token=token
            ) as nobody,
            pytest.raises(ServerUnavailable, match=dead),
        ):
            nobody.nodes()
        with (
            Client(
                address=nowhere, settings=load_settings(home=cluster.home), token=token
            ) as nobody,
            pytest.raises(ServerUnavailable, match=dead),
        ):
            nobody.nodes_and_listings(listing_request())
    finally:
        if client is not None:
            client.close()
        cluster.close()
