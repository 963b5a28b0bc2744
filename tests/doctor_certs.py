"""Certificates for `gpuq admin doctor`'s tests: a site CA and a node's pair as `gpuq admin certs`
makes them, and a certificate with the end date a test needs (expired, expiring soon)."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpuq.cli.certs import make_certificates


def site(folder: Path, node: str = "n1") -> dict[str, Path]:
    """A site CA and node `node`'s certificate and key in `folder` (gpuq admin certs)."""
    made = make_certificates(folder, [], [node])
    cert, key = made.nodes[node]
    return {"ca": made.ca_cert, "ca_key": made.ca_key, "cert": cert, "key": key}


def reissue(files: dict[str, Path], days_left: float, name: str = "n1") -> None:
    """Replace files["cert"] and files["key"] with a pair the same CA signed, ending
    `days_left` days from now (negative: it has expired)."""
    ca_key = serialization.load_pem_private_key(files["ca_key"].read_bytes(), password=None)
    ca = x509.load_pem_x509_certificate(files["ca"].read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    end = now + datetime.timedelta(days=days_left)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(min(now, end) - datetime.timedelta(days=400))
        .not_valid_after(end)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    files["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files["key"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
