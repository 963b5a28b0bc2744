"""`gpuq admin certs` and gpuq.tls (issue 11): the certificates it makes are what TLS needs
(CN, SANs, EKU, a CA that signed them), keys are private, nothing is overwritten without
--force; TLS files are checked with one-line errors; plaintext on a public address is refused;
and, on real grpc servers, a node's verified certificate names it on the mutual-TLS port
while the users' port never takes a client certificate at all."""

from __future__ import annotations

import ipaddress
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuq import tls
from gpuq.cli.certs import Made, certs, make_certificates
from gpuq.config.settings import CoordinatorSettings, Settings
from gpuq.errors import ConfigError, GpuqError, InvalidInput


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def common_name(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_certificates_have_the_right_names_and_uses(tmp_path: Path) -> None:
    made = make_certificates(
        tmp_path / "tls", ["gpu-head.lab", "10.0.0.5", "127.0.0.1", "::1"], ["n1", "n2"]
    )
    ca = load(made.ca_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not made.ca_reused
    assert made.coordinator is not None
    server = load(made.coordinator[0])
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["gpu-head.lab"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.5"),
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert isinstance(server.public_key(), ec.EllipticCurvePublicKey)
    assert server.public_key().curve.name == "secp256r1"
    lifetime = server.not_valid_after_utc - server.not_valid_before_utc
    assert 729 <= lifetime.days <= 731
    assert (ca.not_valid_after_utc - ca.not_valid_before_utc).days >= 3650
    for name in ("n1", "n2"):
        cert_path, key_path = made.nodes[name]
        node = load(cert_path)
        node.verify_directly_issued_by(ca)
        assert common_name(node) == name
        eku = node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
        assert cert_path.name == f"node-{name}.pem" and key_path.name == f"node-{name}.key"
    keys = [made.ca_key, made.coordinator[1], *(k for _, k in made.nodes.values())]
    for key in keys:
        assert mode(key) == 0o600, key
    assert mode(made.ca_cert) == 0o644
    # each pair loads as gpuq.tls checks it (the key is the certificate's, valid now)
    tls.load_key_pair(str(made.coordinator[0]), str(made.coordinator[1]), "coordinator")


def test_existing_keys_are_kept_unless_forced(tmp_path: Path) -> None:
    folder = tmp_path / "tls"
    first = make_certificates(folder, ["head"], ["n1"])
    ca_before, node_key_before = first.ca_key.read_bytes(), first.nodes["n1"][1].read_bytes()
    with pytest.raises(GpuqError, match=r"node-n1\.key exists already: pass --force"):
        make_certificates(folder, None, ["n2", "n1"])
    assert not (folder / "node-n2.key").exists()  # refused before anything was written
    # a new node: the CA is reused, the others untouched
    second = make_certificates(folder, None, ["n2"])
    assert second.ca_reused and second.coordinator is None
    assert first.ca_key.read_bytes() == ca_before
    load(second.nodes["n2"][0]).verify_directly_issued_by(load(first.ca_cert))
    forced = make_certificates(folder, None, ["n1"], force=True)
    assert forced.nodes["n1"][1].read_bytes() != node_key_before
    assert first.ca_key.read_bytes() == ca_before  # --force never replaces the CA
    assert mode(forced.nodes["n1"][1]) == 0o600


def test_bad_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="--node"):
        make_certificates(tmp_path, None, ["../etc"])
    with pytest.raises(InvalidInput, match="--coordinator"):
        make_certificates(tmp_path, ["bad host"], None)
    assert not list(tmp_path.iterdir())


def test_command_prints_the_config_to_paste(tmp_path: Path) -> None:
    folder = tmp_path / "tls"
    args = ["--dir", str(folder), "--coordinator", "head.lab,10.1.2.3", "--node", "n1"]
    result = CliRunner().invoke(certs, args)
    assert result.exit_code == 0, result.output
    assert f'tls_cert = "{folder}/coordinator.pem"' in result.output
    assert f'tls_key = "{folder}/node-n1.key"' in result.output
    assert 'coordinator = "head.lab:7818"' in result.output
    assert "[client]" in result.output
    again = CliRunner().invoke(certs, args)
    assert again.exit_code != 0
    assert isinstance(again.exception, GpuqError)
    assert "exists already" in str(again.exception)


# ---- gpuq.tls: files, settings ---------------------------------------------------------------


def settings_with(tmp_path: Path, **coordinator: Any) -> Settings:
    return Settings(home=tmp_path, coordinator=replace(CoordinatorSettings(), **coordinator))


def test_tls_file_problems_are_one_line(tmp_path: Path) -> None:
    made = make_certificates(tmp_path / "tls", ["127.0.0.1"], ["n1"])
    assert made.coordinator is not None
    cert, key = (str(p) for p in made.coordinator)
    node_key = str(made.nodes["n1"][1])
    with pytest.raises(ConfigError, match=r"\[coordinator\] tls_key .*does not belong"):
        tls.load_key_pair(cert, node_key, "coordinator")
    with pytest.raises(ConfigError, match=r"\[coordinator\] tls_cert .*no such file"):
        tls.load_key_pair(str(tmp_path / "missing.pem"), key, "coordinator")
    with pytest.raises(ConfigError, match="not a PEM private key"):
        tls.load_key_pair(cert, cert, "coordinator")
    with pytest.raises(
        ConfigError, match=r"\[coordinator\] tls_cert .*needs \[coordinator\] tls_key"
    ):
        tls.server_credentials(settings_with(tmp_path, tls_cert=cert))
    with pytest.raises(ConfigError, match=r"agent_listen .*set \[coordinator\] tls_ca"):
        tls.agent_server_credentials(
            settings_with(tmp_path, tls_cert=cert, tls_key=key, agent_listen="0.0.0.0:0")
        )
    assert tls.server_credentials(settings_with(tmp_path)) is None
    assert tls.server_credentials(settings_with(tmp_path, tls_cert=cert, tls_key=key))
    for error in (ConfigError,):
        with pytest.raises(error) as caught:
            tls.read_pem(tmp_path, "[client] tls_ca")
        assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("listen", "allowed"),
    [
        ("127.0.0.1:7817", True),
        ("127.0.1.1:0", True),
        ("localhost:7817", True),
        ("[::1]:7817", True),
        ("0.0.0.0:7817", False),
        ("[::]:7817", False),
        ("10.0.0.5:7817", False),
        ("gpu-head:7817", False),
    ],
)
def test_plaintext_only_on_loopback(listen: str, allowed: bool) -> None:
    tls.check_listen_security(listen, tls_on=True, insecure_tcp=False)
    tls.check_listen_security(listen, tls_on=False, insecure_tcp=True)
    if allowed:
        tls.check_listen_security(listen, tls_on=False, insecure_tcp=False)
    else:
        with pytest.raises(GpuqError, match=r"refusing to listen .* insecure_tcp = true"):
            tls.check_listen_security(listen, tls_on=False, insecure_tcp=False)


# ---- real grpc servers -----------------------------------------------------------------------

METHOD = "/test.Echo/Who"


def _who(request: bytes, context: Any) -> bytes:
    return (tls.peer_common_name(context) or "-").encode()


@dataclass
class Servers:
    main: str  # the users' port: TLS, no client certificate
    agent: str  # the agents' port: mutual TLS
    made: Made


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    made = make_certificates(tmp_path / "tls", ["127.0.0.1", "localhost"], ["n1"])
    assert made.coordinator is not None
    settings = settings_with(
        tmp_path,
        tls_cert=str(made.coordinator[0]),
        tls_key=str(made.coordinator[1]),
        tls_ca=str(made.ca_cert),
        agent_listen="127.0.0.1:0",
    )
    server = grpc.server(ThreadPoolExecutor(4))
    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Who": grpc.unary_unary_rpc_method_handler(_who)}
    )
    server.add_generic_rpc_handlers((handler,))
    main_credentials = tls.server_credentials(settings)
    assert main_credentials is not None
    main = server.add_secure_port("127.0.0.1:0", main_credentials)
    agent = server.add_secure_port("127.0.0.1:0", tls.agent_server_credentials(settings))
    server.start()
    try:
        yield Servers(f"127.0.0.1:{main}", f"127.0.0.1:{agent}", made)
    finally:
        server.stop(0)


def call(address: str, credentials: grpc.ChannelCredentials | None) -> str:
    if credentials is None:
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(address, credentials)
    with channel:
        who = channel.unary_unary(METHOD)
        reply: bytes = who(b"", timeout=5)
    return reply.decode()


def test_node_certificate_names_the_node_only_on_the_mutual_port(
    servers: Servers, tmp_path: Path
) -> None:
    ports, made = servers, servers.made
    ca = made.ca_cert
    node_cert, node_key = made.nodes["n1"]
    node = tls.channel_credentials(ca, node_cert, node_key, section="agent")
    user = tls.channel_credentials(ca, section="client")
    assert call(ports.agent, node) == "n1"
    # the users' port asks for no certificate: one offered there names nobody
    assert call(ports.main, node) == "-"
    assert call(ports.main, user) == "-"
    # no client certificate, or one of another CA: refused on the agents' port
    other = make_certificates(tmp_path / "other", None, ["n1"])
    stranger = tls.channel_credentials(
        ca, other.nodes["n1"][0], other.nodes["n1"][1], section="agent"
    )
    for credentials in (user, stranger):
        with pytest.raises(grpc.RpcError) as caught:
            call(ports.agent, credentials)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    # a client that trusts another CA, or speaks plaintext: refused at once, no hang
    wrong = tls.channel_credentials(other.ca_cert, section="client")
    for address, credentials in ((ports.main, wrong), (ports.main, None)):
        with pytest.raises(grpc.RpcError) as caught:
            call(address, credentials)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def details(address: str, credentials: grpc.ChannelCredentials | None) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        call(address, credentials)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    return str(caught.value.details())


def test_tls_failures_are_explained(servers: Servers, tmp_path: Path) -> None:
    """grpc says "failed to connect to all addresses"; gpuq.tls says why, where it can."""
    made = servers.made
    other = make_certificates(tmp_path / "other", None, None)
    wrong = tls.channel_credentials(other.ca_cert, section="client")
    reason = tls.explain_unavailable(details(servers.main, wrong), tls_on=True)
    assert reason is not None and "not signed by the CA in [client] tls_ca" in reason
    plain = tls.explain_unavailable(details(servers.main, None), tls_on=False)
    assert plain is not None and "set [client] tls_ca" in plain
    right = tls.channel_credentials(made.ca_cert, section="agent")
    reason = tls.explain_unavailable(details(servers.agent, right), True, "agent")
    assert reason is not None and "[agent] tls_cert and tls_key" in reason
    # the certificate names 127.0.0.1 and localhost, not the name checked here
    options = [("grpc.ssl_target_name_override", "elsewhere.example")]
    credentials = tls.channel_credentials(made.ca_cert, section="client")
    with (
        grpc.secure_channel(servers.main, credentials, options=options) as channel,
        pytest.raises(grpc.RpcError) as caught,
    ):
        channel.unary_unary(METHOD)(b"", timeout=5)
    reason = tls.explain_unavailable(caught.value.details(), True)
    assert reason is not None and "does not name the host" in reason
