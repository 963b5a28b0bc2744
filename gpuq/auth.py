"""The shared-secret token every call presents until per-user identity lands.

The coordinator writes a random token to `GPUQ_HOME/auth.token` (mode 0600, folder 0700) on
first start. Whoever can read it can act as the coordinator's user, which is exactly who can
already reach the Unix socket; over TCP it keeps other local users out.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from gpuq.errors import PermissionDenied, ServerUnavailable

METADATA_KEY = "authorization"


def ensure_private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)


def ensure_token(path: Path) -> str:
    """Read the token, creating it first if missing."""
    ensure_private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_token(path)
    import secrets

    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token


def read_token(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except PermissionError:
        raise PermissionDenied(f"cannot read {path}: gpuq runs as another user") from None
    except FileNotFoundError:
        raise ServerUnavailable(
            f"no gpuq coordinator has run with GPUQ_HOME={path.parent} (no {path.name}); "
            "start one with `gpuq serve`"
        ) from None
    if not token:
        raise PermissionDenied(f"{path} is empty")
    return token


def bearer(token: str) -> tuple[str, str]:
    return (METADATA_KEY, f"Bearer {token}")


def token_matches(expected: str, presented: str | None) -> bool:
    if presented is None or not presented.startswith("Bearer "):
        return False
    return hmac.compare_digest(expected.encode(), presented[7:].encode())
