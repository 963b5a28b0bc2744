"""TLS for gRPC over TCP (a Unix socket never uses it: the kernel says who calls).

Three kinds of port and channel:

- the coordinator's `listen` port: server-authenticated TLS when [coordinator] tls_cert and
  tls_key are set. No client certificate is asked for there (users prove who they are with
  tokens), so a certificate can never be presented on that port unverified.
- the coordinator's `agent_listen` port: mutual TLS, always. An agent must present a client
  certificate that the site CA ([coordinator] tls_ca) signed; its common name is the node's
  name (peer_common_name), which the agent servicer binds to the node that registers.
- channels: a client or agent connecting to HOST:PORT verifies the coordinator's certificate
  against the site CA ([client] tls_ca, [agent] tls_ca); the certificate must name HOST (a DNS
  or IP subject alternative name: `gpuq admin certs --coordinator HOST,...`).

Plaintext TCP is refused on any address but loopback unless [coordinator] insecure_tcp = true
(check_listen_security): the token would cross the network in the clear.

Every file problem is one line naming the setting and the file (ConfigError). Nothing here
imports `cryptography` unless a certificate and key pair is checked (the daemons do; a client
command stays fast).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from gpuq.config.settings import Settings
from gpuq.errors import ConfigError, GpuqError

PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
PEM_KEY_MARKERS = (b"PRIVATE KEY-----",)  # PKCS#8, EC, RSA: "-----BEGIN ... PRIVATE KEY-----"
MAX_PEM = 1 << 20  # a certificate chain or key is a few KiB; a bigger file is the wrong one
HOW_TO_MAKE = "`gpuq admin certs` makes a site CA and certificates"


def read_pem(path: str | Path, key: str, *, private: bool = False) -> bytes:
    """The PEM file the setting `key` names: bytes, or ConfigError in one line (missing,
    unreadable, empty, not PEM)."""
    source = "config"
    try:
        with open(Path(path).expanduser(), "rb") as file:
            data = file.read(MAX_PEM + 1)
    except FileNotFoundError:
        raise ConfigError(source, key, str(path), f"no such file ({HOW_TO_MAKE})") from None
    except IsADirectoryError:
        raise ConfigError(source, key, str(path), "a folder, not a PEM file") from None
    except PermissionError:
        raise ConfigError(
            source, key, str(path), "cannot be read by this user (permission denied)"
        ) from None
    except OSError as exc:
        raise ConfigError(source, key, str(path), f"cannot be read: {exc.strerror}") from None
    if len(data) > MAX_PEM:
        raise ConfigError(source, key, str(path), "larger than 1 MiB: not a PEM file")
    wanted = PEM_KEY_MARKERS if private else (PEM_CERTIFICATE,)
    if not any(marker in data for marker in wanted):
        what = "a PEM private key" if private else "a PEM certificate"
        raise ConfigError(source, key, str(path), f"not {what}")
    return data


def load_key_pair(cert_path: str, key_path: str, section: str) -> tuple[bytes, bytes]:
    """(key, certificate chain) of a `[section] tls_cert` / `tls_key` pair, checked: both
    readable, the key is the certificate's, and the certificate is valid now."""
    cert_key, key_key = f"[{section}] tls_cert", f"[{section}] tls_key"
    cert = read_pem(cert_path, cert_key)
    key = read_pem(key_path, key_key, private=True)
    # cryptography parses the PEM for the checks grpc would report only as a failed handshake
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    try:
        certificate = x509.load_pem_x509_certificate(cert)
    except ValueError as exc:
        raise ConfigError(
            "config", cert_key, cert_path, f"not a valid certificate: {exc}"
        ) from None
    try:
        private_key = serialization.load_pem_private_key(key, password=None)
    except TypeError:
        raise ConfigError(
            "config", key_key, key_path, "the key is encrypted; gpuq needs it without a passphrase"
        ) from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ConfigError("config", key_key, key_path, f"not a valid private key: {exc}") from None
    if _public_bytes(private_key.public_key()) != _public_bytes(certificate.public_key()):
        raise ConfigError(
            "config", key_key, key_path, f"this key does not belong to the certificate {cert_path}"
        )
    now = datetime.datetime.now(datetime.UTC)
    if certificate.not_valid_after_utc < now:
        expired = certificate.not_valid_after_utc.strftime("%Y-%m-%d")
        raise ConfigError(
            "config", cert_key, cert_path, f"the certificate expired on {expired} ({HOW_TO_MAKE})"
        )
    if certificate.not_valid_before_utc > now:
        start = certificate.not_valid_before_utc.strftime("%Y-%m-%d %H:%M UTC")
        raise ConfigError(
            "config", cert_key, cert_path, f"the certificate is valid only from {start} (clock?)"
        )
    return key, cert


def _public_bytes(public_key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    data: bytes = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return data


def cert_pair(
    cert: str | Path | None, key: str | Path | None, section: str
) -> tuple[str, str] | None:
    """A certificate and its key file, both or neither ([SECTION] tls_cert, tls_key): None
    when neither is set, a ConfigError naming the missing one when only one is."""
    if not cert and not key:
        return None
    if not cert or not key:
        given, missing = ("tls_cert", "tls_key") if cert else ("tls_key", "tls_cert")
        raise ConfigError(
            "config", f"[{section}] {given}", str(cert or key), f"needs [{section}] {missing} too"
        )
    return str(cert), str(key)


def coordinator_cert_files(settings: Settings) -> tuple[str, str] | None:
    """The coordinator's certificate and key files ([coordinator] tls_cert, tls_key), which
    every TCP port of it presents; None when neither is set."""
    return cert_pair(settings.coordinator.tls_cert, settings.coordinator.tls_key, "coordinator")


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS for the `listen` port: the coordinator's certificate, no client certificate asked
    for (users authenticate with tokens). None when tls_cert and tls_key are not set."""
    files = coordinator_cert_files(settings)
    if files is None:
        return None
    pair = load_key_pair(*files, "coordinator")
    # no root certificates: grpc asks no client for a certificate here, so no name on this
    # port can come from a certificate nobody verified (tests/unit/test_certs.py)
    return grpc.ssl_server_credentials([pair])


def agent_server_credentials(settings: Settings) -> grpc.ServerCredentials:
    """Mutual TLS for the `agent_listen` port: the coordinator's certificate, and a client
    certificate signed by the site CA required of every caller."""
    cfg = settings.coordinator
    missing = [name for name in ("tls_cert", "tls_key", "tls_ca") if not getattr(cfg, name)]
    if missing:
        raise ConfigError(
            "config",
            "[coordinator] agent_listen",
            cfg.agent_listen,
            f"needs mutual TLS: set [coordinator] {', '.join(missing)} ({HOW_TO_MAKE})",
        )
    assert cfg.tls_cert and cfg.tls_key and cfg.tls_ca
    pair = load_key_pair(cfg.tls_cert, cfg.tls_key, "coordinator")
    ca = read_pem(cfg.tls_ca, "[coordinator] tls_ca")
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=True)


def channel_credentials(
    ca: str | Path, cert: str | Path | None = None, key: str | Path | None = None, *, section: str
) -> grpc.ChannelCredentials:
    """TLS for a channel: the coordinator is verified against the CA file `ca`; with `cert`
    and `key` this side presents a client certificate too (an agent on agent_listen).
    `section` names the settings in errors ("agent", "client")."""
    root = read_pem(ca, f"[{section}] tls_ca")
    pair = cert_pair(cert, key, section)
    if pair is not None:
        private, chain = load_key_pair(*pair, section)
        return grpc.ssl_channel_credentials(root, private, chain)
    return grpc.ssl_channel_credentials(root)


def is_unix(address: str) -> bool:
    return address.startswith("unix:") or address.startswith("unix-abstract:")


def client_channel(
    address: str, tls_ca: str | None, options: Sequence[tuple[str, Any]]
) -> grpc.Channel:
    """A client's channel to `address`: TLS verified against `tls_ca` for HOST:PORT when the
    CA is set; plaintext on a Unix socket, or over TCP without it."""
    if tls_ca and not is_unix(address):
        credentials = channel_credentials(tls_ca, section="client")
        return grpc.secure_channel(address, credentials, options=list(options))
    return grpc.insecure_channel(address, options=list(options))


def agent_channel(
    address: str, settings: Any, options: Sequence[tuple[str, Any]]
) -> grpc.aio.Channel:
    """An agent's channel (`settings`: gpuq.config.settings.AgentSettings): TLS for HOST:PORT when
    [agent] tls_ca is set, presenting the node's certificate when tls_cert and tls_key are.
    Files are read at each connection, so renewed certificates are used without a restart."""
    if is_unix(address):
        return grpc.aio.insecure_channel(address, options=list(options))
    if not settings.tls_ca:
        if settings.tls_cert or settings.tls_key:
            raise ConfigError(
                "config",
                "[agent] tls_cert" if settings.tls_cert else "[agent] tls_key",
                settings.tls_cert or settings.tls_key,
                "needs [agent] tls_ca too (the site CA that signed the coordinator's certificate)",
            )
        return grpc.aio.insecure_channel(address, options=list(options))
    credentials = channel_credentials(
        settings.tls_ca, settings.tls_cert, settings.tls_key, section="agent"
    )
    return grpc.aio.secure_channel(address, credentials, options=list(options))


def explain_unavailable(details: str | None, tls_on: bool, section: str = "client") -> str | None:
    """What a TLS failure behind an UNAVAILABLE means, from grpc's details, in words; None
    when the details show none (the coordinator is then simply not there). `tls_on`: did this
    side use TLS; `section`: whose settings to name ("client" or "agent")."""
    text = details or ""
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return (
            f"the coordinator's TLS certificate is not signed by the CA in [{section}] tls_ca "
            "(another site's CA, or an old one?)"
        )
    if "Hostname Verification" in text:
        return (
            "the coordinator's TLS certificate does not name the host connected to: use a name "
            "it has, or make it again with that name (`gpuq admin certs --coordinator HOST,...`)"
        )
    if "WRONG_VERSION_NUMBER" in text:
        return f"this side uses TLS ([{section}] tls_ca) but the coordinator's port is plaintext"
    if "Socket closed" in text and not tls_on:
        return f"if the coordinator uses TLS, set [{section}] tls_ca to the site CA"
    if "Socket closed" in text and section == "agent":
        return (
            "closed during TLS: on agent_listen this node needs [agent] tls_cert and tls_key, "
            "a certificate the site CA signed"
        )
    return None


def is_loopback_host(host: str) -> bool:
    """Is HOST (of HOST:PORT) a loopback address: localhost, 127.0.0.0/8 or ::1. A host name
    other than localhost is not resolved: it counts as reachable from the network."""
    bare = host.strip("[]")
    if bare.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def check_listen_security(
    listen: str, tls_on: bool, insecure_tcp: bool, crossing: str = "tokens"
) -> None:
    """Refuse plaintext TCP on an address other than loopback, unless the admin said so
    ([coordinator] insecure_tcp = true): `crossing` would cross the network readable."""
    host = listen.rpartition(":")[0]
    if tls_on or insecure_tcp or is_loopback_host(host):
        return
    raise GpuqError(
        f"refusing to listen on {listen} without TLS ({crossing} would cross the network in "
        "plaintext): set [coordinator] tls_cert and tls_key (`gpuq admin certs` makes them), "
        "listen on 127.0.0.1, or set [coordinator] insecure_tcp = true to accept plaintext"
    )


def check_coordinator_tls(settings: Settings) -> None:
    """Every TLS check the coordinator's ports need, without binding anything: call it before
    opening the store (or as a standby, before waiting), so a bad file or a plaintext public
    address is said at once."""
    cfg = settings.coordinator
    if cfg.listen:
        credentials = server_credentials(settings)
        check_listen_security(cfg.listen, credentials is not None, cfg.insecure_tcp)
    if cfg.agent_listen:
        agent_server_credentials(settings)
    tls_on = bool(cfg.tls_cert and cfg.tls_key)
    if cfg.web_listen:  # the dashboard (gpuq.web.dashboard)
        check_listen_security(cfg.web_listen, tls_on, cfg.insecure_tcp, "session cookies")
    if cfg.metrics_listen:  # unauthenticated, as Prometheus expects (gpuq.coordinator.metrics)
        check_listen_security(cfg.metrics_listen, tls_on, cfg.insecure_tcp, "the metrics")


def peer_common_name(context: Any) -> str | None:
    """The common name of the client certificate the caller presented and the site CA
    verified (grpc.aio.ServicerContext), or None when it presented none: only the mutual-TLS
    agent_listen port asks for one, so a name here is always a verified one."""
    auth = context.auth_context()
    if not auth:
        return None
    kinds = auth.get("transport_security_type") or []
    if b"ssl" not in kinds and "ssl" not in kinds:
        return None
    names = auth.get("x509_common_name") or []
    if not names:
        return None
    name = names[0]
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
