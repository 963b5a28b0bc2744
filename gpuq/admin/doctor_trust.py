"""Doctor's checks of what this machine proves itself with: the TLS files its config names
(there, parse, valid now and for 30 more days, the key is the certificate's, signed by the
configured CA) and its key files (owned by the daemon's user or root, readable by nobody else:
gpuq.identity's rule, the one the daemons enforce)."""

from __future__ import annotations

import datetime
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuq.admin.checks import Check, DoctorContext
from gpuq.admin.doctor_node import NOT_LOADED
from gpuq.config.settings import Settings
from gpuq.errors import GpuqError

RENEW_WITHIN = datetime.timedelta(days=30)  # a certificate closer to its end: a warning
RENEW_FIX = (
    'make it again: gpuq admin certs --force ... (README "Security"), and copy it where '
    "the config says"
)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """One section's TLS settings: its certificate and key (a pair) and the CA it trusts."""

    section: str
    cert: str | None
    key: str | None
    ca: str | None


def configured_tls(settings: Settings) -> list[TlsFiles]:
    """Every section of the config that names a TLS file."""
    found = [
        TlsFiles("coordinator", c.tls_cert, c.tls_key, c.tls_ca)
        for c in [settings.coordinator]
        if c.tls_cert or c.tls_key or c.tls_ca
    ]
    agent = settings.agent
    if agent.tls_cert or agent.tls_key or agent.tls_ca:
        found.append(TlsFiles("agent", agent.tls_cert, agent.tls_key, agent.tls_ca))
    if settings.client.tls_ca:
        found.append(TlsFiles("client", None, None, settings.client.tls_ca))
    return found


def certificate_checks(context: DoctorContext) -> list[Check]:
    if context.config_error:
        return [Check("certificates", "skip", NOT_LOADED)]
    sections = configured_tls(context.settings)
    if not sections:
        return [Check("certificates", "skip", "no TLS files configured (no TCP beyond loopback)")]
    now = datetime.datetime.now(datetime.UTC)
    found: list[Check] = []
    for files in sections:
        found.append(_section_check(files, now))
    return found


def _section_check(files: TlsFiles, now: datetime.datetime) -> Check:
    name = f"TLS [{files.section}]"
    try:
        ca = _load_ca(files) if files.ca else None
        if files.cert or files.key:
            return _pair_check(name, files, ca, now)
    except GpuqError as error:
        return Check(name, "fail", str(error), _fix_for(str(error)))
    assert ca is not None
    return _validity(name, f"CA {files.ca}", ca, now)


def _load_ca(files: TlsFiles) -> Any:
    from cryptography import x509

    from gpuq.errors import ConfigError
    from gpuq.tls import read_pem

    key = f"[{files.section}] tls_ca"
    data = read_pem(str(files.ca), key)
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as exc:
        raise ConfigError("config", key, files.ca, f"not a valid certificate: {exc}") from None


def _pair_check(name: str, files: TlsFiles, ca: Any, now: datetime.datetime) -> Check:
    """The pair as the daemons load it (gpuq.tls.load_key_pair: readable, the key is the
    certificate's, valid now), then what they do not check: its CA and its time left."""
    from cryptography import x509

    from gpuq.tls import cert_pair, load_key_pair

    pair = cert_pair(files.cert, files.key, files.section)
    assert pair is not None  # only a section with a certificate or a key is checked
    _key, chain = load_key_pair(*pair, files.section)
    certificate = x509.load_pem_x509_certificate(chain)
    if ca is not None:
        try:
            certificate.verify_directly_issued_by(ca)
        except Exception:  # ValueError, TypeError, InvalidSignature: not this CA's
            return Check(
                name,
                "fail",
                f"the certificate {files.cert} is not signed by the CA {files.ca} "
                f"([{files.section}] tls_ca): the other side will refuse it",
                f"make the certificate with this CA (gpuq admin certs --dir "
                f"{Path(files.ca or '').parent} ...), or name the CA that signed it",
            )
    ca_check = _validity(name, f"CA {files.ca}", ca, now) if ca is not None else None
    if ca_check is not None and ca_check.status != "ok":
        return ca_check
    signed = f", signed by {files.ca}" if ca is not None else ""
    return _validity(name, f"{files.cert} (key {files.key}{signed})", certificate, now)


def _validity(name: str, what: str, certificate: Any, now: datetime.datetime) -> Check:
    end = certificate.not_valid_after_utc
    day = end.strftime("%Y-%m-%d")
    if end < now:
        return Check(name, "fail", f"{what}: expired on {day}", RENEW_FIX)
    if certificate.not_valid_before_utc > now:
        start = certificate.not_valid_before_utc.strftime("%Y-%m-%d %H:%M UTC")
        return Check(
            name,
            "fail",
            f"{what}: valid only from {start}",
            "check this machine's clock (see the clock line)",
        )
    if end - now < RENEW_WITHIN:
        left = (end - now).days
        return Check(name, "warn", f"{what}: expires on {day}, in {left} days", RENEW_FIX)
    return Check(name, "ok", f"{what}: valid until {day}")


def _fix_for(problem: str) -> str:
    if "expired" in problem:
        return RENEW_FIX
    if "permission denied" in problem:
        return "make it readable by the daemon's user (chown it to that user)"
    return 'correct the file or the setting named (README "Security" sets them up)'


# ---- key files ----------------------------------------------------------------------------------


def key_file_checks(context: DoctorContext) -> list[Check]:
    """Every key file this machine's daemons read, by gpuq.identity.key_file_problem; one line
    per bad file (each with its fix), one for all the good ones."""
    if context.config_error:
        return [Check("key files", "skip", NOT_LOADED)]
    from gpuq.identity import key_file_problem, problem_fix, service_uid

    user = _daemon_user(context.settings)
    service = service_uid(context.settings.coordinator.service_user)
    found: list[Check] = []
    good: list[str] = []
    for path, missing in key_files(context):
        try:
            info = path.lstat()
        except FileNotFoundError:
            if missing:
                found.append(Check("key file", "fail", f"{path}: {missing}", _missing_fix(path)))
            continue
        except OSError as error:
            found.append(Check("key file", "fail", f"{path}: {error.strerror}", ""))
            continue
        problem = key_file_problem(info, user, service)
        if problem is None:
            good.append(str(path))
            continue
        mode = stat.S_IMODE(info.st_mode)
        detail = f"{path} {problem} (mode {mode:04o}, owner uid {info.st_uid})"
        if stat.S_ISLNK(info.st_mode):
            detail = f"{path} {problem} (a symbolic link: the daemons refuse one)"
        found.append(Check("key file", "fail", detail, problem_fix(problem, path)))
    if good:
        shown = ", ".join(good[:4]) + (f" and {len(good) - 4} more" if len(good) > 4 else "")
        found.append(Check("key files", "ok", f"private: {shown}"))
    if not found:
        found.append(Check("key files", "skip", "no key files here yet"))
    return found


def key_files(context: DoctorContext) -> list[tuple[Path, str]]:
    """(path, what its absence means: "" when it is fine) of every key file to look at."""
    settings = context.settings
    files: list[tuple[Path, str]] = []
    if "coordinator" in context.roles:
        files.append((settings.key_path, ""))  # made by the coordinator at its start
        if settings.nodes_dir.is_dir():
            files += [(path, "") for path in sorted(settings.nodes_dir.glob("*.key"))]
    if "agent" in context.roles:
        configured = bool(settings.agent.node_key)
        missing = "no such file ([agent] node_key): the agent cannot start" if configured else ""
        files.append((settings.node_key_path, missing))
    for tls in configured_tls(settings):
        if tls.key:
            files.append((Path(tls.key).expanduser(), ""))  # the certificates' line says so
    unique: dict[Path, str] = {}
    for path, missing in files:  # a node key in the coordinator's nodes folder: once
        unique.setdefault(path, missing)
    return list(unique.items())


def _daemon_user(settings: Settings) -> int:
    """The uid the daemons run as: GPUQ_HOME's owner (they made it), else this process's."""
    try:
        return settings.home.stat().st_uid
    except OSError:
        return os.geteuid()


def _missing_fix(path: Path) -> str:
    return (
        f"copy this node's key from the coordinator (`gpuq admin node-key NODE` there makes "
        f"it) to {path}, mode 0600, or correct [agent] node_key"
    )
