"""What a job asks to be told about, and where: SLURM's --mail-type/--mail-user and gpuq's
--notify URL (a webhook). Pure checks; delivery is gpuq.coordinator.notifications'.

Mail types are SLURM's names. ALL is BEGIN, END, FAIL, REQUEUE, INVALID_DEPEND and TIME_LIMIT
(as in SLURM, not the TIME_LIMIT_NN warnings and not ARRAY_TASKS); NONE clears the list.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from gpuq.domain.limits import check_text, shown
from gpuq.errors import InvalidInput

MAIL_TYPES = (
    "BEGIN",
    "END",
    "FAIL",
    "REQUEUE",
    "INVALID_DEPEND",
    "TIME_LIMIT",
    "TIME_LIMIT_50",
    "TIME_LIMIT_80",
    "TIME_LIMIT_90",
    "ARRAY_TASKS",
)
MAIL_ALL = ("BEGIN", "END", "FAIL", "REQUEUE", "INVALID_DEPEND", "TIME_LIMIT")
MAX_MAIL_USER = 254  # an e-mail address's longest form (RFC 5321 path limit)
MAX_NOTIFY_URL = 2048
# a local user name, or an address: no spaces, quotes, angle brackets or leading '-' (it is
# passed to the MTA as an argument after "--", and as a header)
_MAIL_USER = re.compile(
    r"[A-Za-z0-9_.+=][A-Za-z0-9_.+=-]*(@[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)?"
)


def parse_mail_types(text: str) -> tuple[str, ...]:
    """`END,FAIL` -> ("END", "FAIL"), in MAIL_TYPES' order; NONE -> (); case-insensitive."""
    check_text("--mail-type", text, 256)
    names = [part.strip().upper() for part in text.split(",") if part.strip()]
    if not names:
        raise InvalidInput("--mail-type", text, f"expected one or more of {_choices()}")
    chosen: set[str] = set()
    for name in names:
        if name == "NONE":
            chosen.clear()
        elif name == "ALL":
            chosen.update(MAIL_ALL)
        elif name in MAIL_TYPES:
            chosen.add(name)
        else:
            raise InvalidInput("--mail-type", shown(name), f"unknown; expected {_choices()}")
    return tuple(t for t in MAIL_TYPES if t in chosen)


def check_mail_types(types: tuple[str, ...]) -> None:
    """A stored or wire list: known names, each once, in MAIL_TYPES' order."""
    if types != tuple(t for t in MAIL_TYPES if t in types) or len(set(types)) != len(types):
        raise InvalidInput("--mail-type", shown(",".join(types)), f"expected {_choices()}")


def check_mail_user(user: str) -> None:
    check_text("--mail-user", user, MAX_MAIL_USER)
    if not _MAIL_USER.fullmatch(user):
        raise InvalidInput(
            "--mail-user", shown(user), "expected a user name or an address like ada@example.org"
        )


def check_notify_url(url: str) -> None:
    """An http(s) URL with a host, as text that can be shown; where it may point (no loopback
    or private address unless the admin allows) is decided when it is called."""
    check_text("--notify", url, MAX_NOTIFY_URL)
    if not url.isascii() or any(c.isspace() for c in url):
        raise InvalidInput("--notify", shown(url), "must be ASCII without spaces")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidInput("--notify", shown(url), f"not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput("--notify", shown(url), "expected an http:// or https:// URL")
    if port == 0:
        raise InvalidInput("--notify", shown(url), "port 0 is not a port")


def _choices() -> str:
    return ", ".join((*MAIL_TYPES, "ALL", "NONE"))
