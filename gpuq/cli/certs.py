"""`gpuq admin certs`: a site CA and the certificates TLS needs, in one command (labs have no
PKI). Keys are EC P-256, written mode 0600; the CA is valid 10 years, the coordinator's and
the nodes' certificates 2 years (run the command again with --force to renew them).

    DIR/ca.pem, ca.key                the site CA (made once, then reused; keep ca.key off
                                      the nodes: it can sign a certificate for any node)
    DIR/coordinator.pem, .key         the coordinator's server certificate: every HOST given
                                      as a subject alternative name (an IP address as an IP
                                      name), so clients and agents can connect by any of them
    DIR/node-NAME.pem, .key           a node's client certificate: CN=NAME, clientAuth only;
                                      the coordinator binds it to the node NAME on agent_listen

Made with the `cryptography` package rather than the openssl command line: one well-kept
library, the same on every distribution, and no output of another program to parse.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from gpuq.errors import GpuqError, InvalidInput

CA_DAYS = 3650  # 10 years
LEAF_DAYS = 730  # 2 years
CLOCK_SKEW = datetime.timedelta(minutes=5)  # certificates start a little in the past
DEFAULT_AGENT_PORT = 7818  # suggested in the printed config
_DNS_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9*]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9-]{1,63})*\.?")
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # as [agent] node_name


@dataclass(frozen=True, slots=True)
class Made:
    """What make_certificates wrote (paths), and what it reused."""

    ca_cert: Path
    ca_key: Path
    ca_reused: bool
    coordinator: tuple[Path, Path] | None
    nodes: dict[str, tuple[Path, Path]]


def _names(hosts: list[str]) -> list[Any]:
    from cryptography import x509

    names: list[Any] = []
    for host in hosts:
        bare = host.strip("[]")
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(bare)))
            continue
        except ValueError:
            pass
        if not _DNS_NAME.fullmatch(bare):
            raise InvalidInput("--coordinator", host, "expected a host name or an IP address")
        names.append(x509.DNSName(bare.rstrip(".").lower()))
    return names


def _new_key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    data: bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return data


def _cert_pem(cert: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    data: bytes = cert.public_bytes(serialization.Encoding.PEM)
    return data


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write via a private temporary file renamed into place: never a half-written file, and
    a key is never readable by others, not even for a moment."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.unlink(missing_ok=True)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, mode)  # whatever the umask
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _builder(subject: str, issuer: Any, public_key: Any, days: int) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _make_ca(common_name: str) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _builder(common_name, name, key.public_key(), CA_DAYS)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _make_leaf(
    ca_key: Any, ca_cert: Any, common_name: str, san: list[Any], server: bool
) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = _new_key()
    builder = (
        _builder(common_name, ca_cert.subject, key.public_key(), LEAF_DAYS)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _load_ca(cert_path: Path, key_path: Path) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except FileNotFoundError:
        raise GpuqError(
            f"{key_path} exists but {cert_path} does not: put the CA certificate back, or "
            "remove the key to make a new CA (every certificate must then be made again)"
        ) from None
    except ValueError as exc:
        raise GpuqError(f"{cert_path}: not a valid certificate: {exc}") from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise GpuqError(f"{key_path}: not a usable private key: {exc}") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, public) != cert.public_key().public_bytes(der, public):
        raise GpuqError(f"{key_path} is not the key of the CA certificate {cert_path}")
    return key, cert


def make_certificates(
    folder: Path,
    coordinator_hosts: list[str] | None = None,
    nodes: list[str] | None = None,
    force: bool = False,
) -> Made:
    """The site CA in `folder` (made if missing, else reused), a coordinator certificate for
    `coordinator_hosts`, and a client certificate per node. An existing key is never replaced
    without `force` (GpuqError naming it, before anything is written)."""
    folder = folder.expanduser().absolute()
    hosts = [h for h in (coordinator_hosts or []) if h]
    san = _names(hosts)
    names = list(dict.fromkeys(nodes or []))
    for name in names:
        if not _NODE_NAME.fullmatch(name):
            raise InvalidInput(
                "--node", name, "a name of letters, digits, '.', '_' and '-' (at most 63)"
            )
    ca_cert_path, ca_key_path = folder / "ca.pem", folder / "ca.key"
    leaves: list[tuple[str, Path, Path]] = []
    if hosts:
        leaves.append(("", folder / "coordinator.pem", folder / "coordinator.key"))
    leaves += [(n, folder / f"node-{n}.pem", folder / f"node-{n}.key") for n in names]
    existing = [key for _, _, key in leaves if key.exists()]
    if existing and not force:
        raise GpuqError(
            f"{existing[0]} exists already: pass --force to replace "
            f"{'it' if len(existing) == 1 else 'these keys'} (certificates made with the old "
            "key stop working)"
        )
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    reused = ca_key_path.exists()
    if reused:
        ca_key, ca_cert = _load_ca(ca_cert_path, ca_key_path)
    else:
        ca_key, ca_cert = _make_ca(f"gpuq site CA ({socket.gethostname()})")
        _write(ca_key_path, _key_pem(ca_key), 0o600)
        _write(ca_cert_path, _cert_pem(ca_cert), 0o644)
    coordinator: tuple[Path, Path] | None = None
    made_nodes: dict[str, tuple[Path, Path]] = {}
    for node, cert_path, key_path in leaves:
        if node:
            key, cert = _make_leaf(ca_key, ca_cert, node, [], server=False)
        else:
            first = hosts[0].strip("[]")
            key, cert = _make_leaf(ca_key, ca_cert, first, san, server=True)
        _write(key_path, _key_pem(key), 0o600)
        _write(cert_path, _cert_pem(cert), 0o644)
        if node:
            made_nodes[node] = (cert_path, key_path)
        else:
            coordinator = (cert_path, key_path)
    return Made(ca_cert_path, ca_key_path, reused, coordinator, made_nodes)


def config_lines(made: Made, hosts: list[str]) -> str:
    """The config to paste, for the coordinator, each node, and clients."""
    ca = made.ca_cert
    out: list[str] = []
    if made.coordinator is not None:
        cert, key = made.coordinator
        out += [
            "# the coordinator's config (/etc/gpuq/config.toml); its user must be able to read",
            f"# {key.name} (chown it to that user when it is not root):",
            "[coordinator]",
            'listen = "0.0.0.0:7817"  # users: TLS, with their tokens',
            f'agent_listen = "0.0.0.0:{DEFAULT_AGENT_PORT}"  # agents: mutual TLS',
            f'tls_cert = "{cert}"',
            f'tls_key = "{key}"',
            f'tls_ca = "{ca}"',
            "",
        ]
    host = hosts[0] if hosts else "COORDINATOR-HOST"
    for node, (cert, key) in made.nodes.items():
        out += [
            f"# node {node}: copy {ca.name}, {cert.name} and {key.name} (mode 0600) there;",
            "# its config:",
            "[agent]",
            f'node_name = "{node}"',
            f'coordinator = "{host}:{DEFAULT_AGENT_PORT}"',
            f'tls_ca = "{ca}"',
            f'tls_cert = "{cert}"',
            f'tls_key = "{key}"',
            "",
        ]
    out += [
        f"# users' machines (copy {ca.name}; it is not secret):",
        "[client]",
        f'tls_ca = "{ca}"',
    ]
    return "\n".join(out)


@click.command()
@click.option(
    "--dir",
    "folder",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("/etc/gpuq/tls"),
    show_default=True,
    help="where the CA, certificates and keys go",
)
@click.option(
    "--coordinator",
    "hosts",
    metavar="HOST[,HOST...]",
    multiple=True,
    help="make the coordinator's certificate, valid for these host names and IP addresses "
    "(the names clients and agents connect to)",
)
@click.option(
    "--node", "nodes", metavar="NAME", multiple=True, help="make a certificate for this node"
)
@click.option("--force", is_flag=True, help="replace existing coordinator or node keys")
def certs(folder: Path, hosts: tuple[str, ...], nodes: tuple[str, ...], force: bool) -> int:
    """Make a site CA (once) and TLS certificates for the coordinator and nodes, and print the
    config lines to use them. EC P-256 keys (mode 0600); the CA is valid 10 years, other
    certificates 2 years. The CA is reused when DIR has one; an existing key is replaced only
    with --force."""
    names = [h.strip() for group in hosts for h in group.split(",") if h.strip()]
    made = make_certificates(folder, names, list(nodes), force)
    wrote = [] if made.ca_reused else [made.ca_cert, made.ca_key]
    if made.coordinator:
        wrote += list(made.coordinator)
    for pair in made.nodes.values():
        wrote += list(pair)
    state = "reused" if made.ca_reused else "made"
    click.echo(f"# site CA {state}: {made.ca_cert} (keep {made.ca_key.name} off the nodes)")
    for path in wrote:
        click.echo(f"# wrote {path}")
    click.echo(config_lines(made, names))
    return 0
