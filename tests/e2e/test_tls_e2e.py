"""TLS on TCP (issue 11), with real processes: a coordinator serving TLS on its users' port
and mutual TLS on agent_listen, with certificates from `gpuq admin certs` (gpuq.cli.certs).

A client that trusts the site CA gets in; one that trusts another CA, or speaks plaintext, is
refused at once with UNAVAILABLE (never a hang). An agent presenting its node certificate
registers over agent_listen and runs a job; one without a certificate, or with one another CA
signed, never registers. Plaintext TCP on a public address is refused at start-up in one line,
unless [coordinator] insecure_tcp says so."""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from e2e_cluster import Cluster, free_port

from gpuq import tls
from gpuq.cli.certs import Made, make_certificates
from gpuq.client import Client
from gpuq.config.loading import load_settings
from gpuq.config.settings import ClientSettings
from gpuq.errors import ServerUnavailable
from gpuq.v1 import queue_pb2, queue_pb2_grpc

FAST = 5.0  # seconds: a refused handshake must be said well within this


@pytest.fixture
def pki(tmp_path: Path) -> Made:
    return make_certificates(tmp_path / "tls", ["127.0.0.1", "localhost"], ["tn1", "tn2"])


@pytest.fixture
def other_pki(tmp_path: Path) -> Made:
    """Another site's CA, with a certificate for a node of the same name."""
    return make_certificates(tmp_path / "other", ["127.0.0.1"], ["tn1"])


def tls_config(made: Made, agent_port: int) -> str:
    assert made.coordinator is not None
    cert, key = made.coordinator
    return (
        f'tls_cert = "{cert}"\n'
        f'tls_key = "{key}"\n'
        f'tls_ca = "{made.ca_cert}"\n'
        f'agent_listen = "127.0.0.1:{agent_port}"\n'
    )


def set_listen(cluster: Cluster, listen: str, extra: str = "") -> None:
    """Replace the harness's listen line (TOML allows a key once)."""
    config = cluster.home / "config.toml"
    text = re.sub(r'(?m)^listen = ".*"$', f'listen = "{listen}"', config.read_text())
    config.write_text(text.replace("[coordinator]\n", f"[coordinator]\n{extra}", 1))


ROOT = os.geteuid() == 0


def allow_root_jobs(cluster: Cluster) -> None:
    """Tests run as root in CI containers: let root's test jobs run (unless the harness did)."""
    config = cluster.home / "config.toml"
    text = config.read_text()
    if ROOT and "allow_root_jobs" not in text:
        config.write_text(
            text.replace("[coordinator]\n", "[coordinator]\nallow_root_jobs = true\n", 1)
        )


@pytest.fixture
def tls_cluster(tmp_path: Path, pki: Made) -> Iterator[Cluster]:
    running = Cluster(tmp_path / "c", tls_config(pki, free_port()))
    allow_root_jobs(running)
    try:
        running.start_coordinator()
        yield running
    finally:
        running.close()


def addresses(cluster: Cluster) -> tuple[str, str]:
    """(the users' TCP port, the agents' port) as the coordinator bound them."""
    info = json.loads((cluster.home / "coordinator.json").read_text())
    return str(info["tcp"]), str(info["agent"])


def probe(address: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    """The status of one call with no credentials of gpuq's own: UNAVAILABLE when the
    connection (TLS) failed; anything else means the coordinator's servicer answered."""
    if credentials is None:
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(address, credentials)
    with channel:
        stub = queue_pb2_grpc.QueueStub(channel)
        try:
            stub.ListNodes(queue_pb2.ListNodesRequest(), timeout=FAST)
        except grpc.RpcError as error:
            code: grpc.StatusCode = error.code()
            return code
    return grpc.StatusCode.OK


def tcp_client(cluster: Cluster, address: str, ca: Path, token: str | None) -> Client:
    settings = load_settings(home=cluster.home)
    settings = replace(settings, client=ClientSettings(tls_ca=str(ca)))
    return Client(address=address, token=token, settings=settings, timeout=FAST)


def test_clients_verify_the_coordinator(tls_cluster: Cluster, pki: Made, other_pki: Made) -> None:
    tcp, _ = addresses(tls_cluster)
    right = tls.channel_credentials(pki.ca_cert, section="client")
    wrong = tls.channel_credentials(other_pki.ca_cert, section="client")
    # the handshake completes with the site CA (the servicer answers, whatever it says)
    assert probe(tcp, right) != grpc.StatusCode.UNAVAILABLE
    for credentials in (wrong, None):  # another CA; plaintext to the TLS port
        started = time.monotonic()
        assert probe(tcp, credentials) == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < FAST
    # gpuq.Client over TCP with [client] tls_ca and a per-user token
    user = pwd.getpwuid(os.geteuid()).pw_name
    token = tls_cluster.client().issue_token(user)
    with tcp_client(tls_cluster, tcp, pki.ca_cert, token) as client:
        assert client.nodes() is not None
    with tcp_client(tls_cluster, tcp, other_pki.ca_cert, token) as client:
        started = time.monotonic()
        with pytest.raises(ServerUnavailable) as caught:
            client.nodes()
        assert time.monotonic() - started < 3 * FAST
        assert "\n" not in str(caught.value)


def start_tls_agent(
    cluster: Cluster, name: str, agent_address: str, ca: Path, cert: Path | None, key: Path | None
) -> subprocess.Popen[bytes]:
    """An agent with a config of its own ([agent] TLS files), reaching agent_listen."""
    lines = ["[agent]", f'tls_ca = "{ca}"'] + (["allow_root_jobs = true"] if ROOT else [])
    if cert is not None and key is not None:
        lines += [f'tls_cert = "{cert}"', f'tls_key = "{key}"']
    config = cluster.root / f"agent-{name}.toml"
    config.write_text("\n".join(lines) + "\n")
    args = ["--config", str(config), "agent", "--node-name", name, "--fake-gpus", "1"]
    process = cluster._spawn([*args, "--coordinator", agent_address], f"agent-{name}")
    cluster.agents[name] = process
    return process


def never_up(cluster: Cluster, name: str, seconds: float = 3.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        nodes = {n.name: n for n in cluster.client().nodes()}
        node = nodes.get(name)
        assert node is None or node.reason == "agent not connected", node
        time.sleep(0.2)


def test_agent_with_node_certificate_runs_jobs(tls_cluster: Cluster, pki: Made) -> None:
    _, agent_address = addresses(tls_cluster)
    cert, key = pki.nodes["tn1"]
    start_tls_agent(tls_cluster, "tn1", agent_address, pki.ca_cert, cert, key)
    tls_cluster.wait_node("tn1", "up")
    job = tls_cluster.submit("echo over-tls", gpus=1)
    done = tls_cluster.wait_state(job, "completed", "failed")
    assert done.state.value == "completed", done
    assert done.node == "tn1"


def test_agent_port_needs_a_certificate_of_the_site(
    tls_cluster: Cluster, pki: Made, other_pki: Made
) -> None:
    _, agent_address = addresses(tls_cluster)
    # at the TLS level: no client certificate, or another CA's, is refused at once
    no_cert = tls.channel_credentials(pki.ca_cert, section="client")
    stranger = tls.channel_credentials(pki.ca_cert, *other_pki.nodes["tn1"], section="agent")
    for credentials in (no_cert, stranger):
        assert probe(agent_address, credentials) == grpc.StatusCode.UNAVAILABLE
    # real agents: neither registers
    start_tls_agent(tls_cluster, "tn1", agent_address, pki.ca_cert, None, None)
    start_tls_agent(tls_cluster, "tn2", agent_address, pki.ca_cert, *other_pki.nodes["tn1"])
    never_up(tls_cluster, "tn1")
    never_up(tls_cluster, "tn2", 0.5)


def test_node_certificate_is_bound_to_its_name(tls_cluster: Cluster, pki: Made) -> None:
    """tn1's certificate does not let an agent register as tn2 (the agent servicer compares
    the certificate's CN with the node name)."""
    _, agent_address = addresses(tls_cluster)
    start_tls_agent(tls_cluster, "tn2", agent_address, pki.ca_cert, *pki.nodes["tn1"])
    never_up(tls_cluster, "tn2")


def test_public_plaintext_needs_insecure_tcp(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "c")
    try:
        set_listen(cluster, f"0.0.0.0:{free_port()}")
        result = cluster.gpuq("coordinator", timeout=30)
        assert result.returncode == 2, (result.returncode, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert "refusing to listen on 0.0.0.0:" in lines[0]
        assert "insecure_tcp = true" in lines[0]
        assert not (cluster.home / "coordinator.json").exists()
        # the admin says so: it starts
        set_listen(cluster, f"0.0.0.0:{free_port()}", "insecure_tcp = true\n")
        cluster.start_coordinator()
        assert cluster.tcp_address.startswith("0.0.0.0:")
    finally:
        cluster.close()


def test_agent_listen_needs_mutual_tls_files(tmp_path: Path, pki: Made) -> None:
    assert pki.coordinator is not None
    cert, key = pki.coordinator
    config = f'tls_cert = "{cert}"\ntls_key = "{key}"\nagent_listen = "127.0.0.1:{free_port()}"\n'
    cluster = Cluster(tmp_path / "c", config)
    try:
        result = cluster.gpuq("coordinator", timeout=30)
        assert result.returncode == 2, (result.returncode, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert "agent_listen" in lines[0] and "tls_ca" in lines[0]
    finally:
        cluster.close()


def test_admin_certs_command(tmp_path: Path) -> None:
    """The real command line: files made, config printed; a second run refuses to replace
    the keys in one line."""
    cluster = Cluster(tmp_path / "c")
    folder = tmp_path / "pki"
    args = ["admin", "certs", "--dir", str(folder), "--coordinator", "127.0.0.1,head.lab"]
    made = cluster.gpuq(*args, "--node", "tn1")
    assert made.returncode == 0, made.stderr
    for name in ("ca.pem", "ca.key", "coordinator.pem", "coordinator.key", "node-tn1.key"):
        assert (folder / name).is_file(), name
    assert f'tls_ca = "{folder}/ca.pem"' in made.stdout
    again = cluster.gpuq(*args)
    assert again.returncode == 2, again.stderr
    assert again.stderr.count("\n") == 1 and "coordinator.key exists already" in again.stderr
