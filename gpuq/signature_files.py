"""The failure signatures in force: gpuq's own (gpuq/diagnosis_signatures.toml) and an admin's
file, `[coordinator] diagnosis_signatures` (entries with the same name replace gpuq's). Read
once when the coordinator starts, so that a bad file is one clear error then, not a crash on
the first `gpuq diagnose` (README "Diagnosis signatures")."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from gpuq.domain.log_signatures import Signature, merged, parse_signatures
from gpuq.errors import ConfigError

PACKAGED = "diagnosis_signatures.toml"
SETTING = "[coordinator] diagnosis_signatures"


def load_signatures(admin_file: str | None = None) -> tuple[Signature, ...]:
    """gpuq's signatures, with the admin's file (a path; None: none) over them."""
    own = parse_signatures(resources.files("gpuq").joinpath(PACKAGED).read_text(), PACKAGED)
    if admin_file is None:
        return merged(own)
    path = Path(admin_file).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            SETTING, "diagnosis_signatures", admin_file, f"unreadable: {exc}"
        ) from None
    return merged(own, parse_signatures(text, str(path)))
