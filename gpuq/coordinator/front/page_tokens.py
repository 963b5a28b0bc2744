"""Page tokens of ListJobs: where a listing goes on, and for which listing.

A token holds the sort key of the last entry a page gave (a job id; an array's task index
and id), how many entries the listing has given so far (for its `limit`), and a digest of the
request's filters, so that a token is only good for the listing that gave it: a token of
another filter, or one that is not a token at all, is one INVALID_ARGUMENT, never a wrong
page. It is opaque to callers (base64 of a short JSON list) but not secret: it names job ids
any listing shows.

Keyset, not offset: a job that stays listed is given once across the pages even when jobs
before it end or new ones arrive meanwhile (an offset would skip or repeat them).

Pure: no I/O, tested without a server.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from gpuq.domain.limits import brief
from gpuq.errors import InvalidInput

MAX_TOKEN = 200  # characters: what a token this module writes takes, with room
_VERSION = 1


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a listing stands: after the entry of sort key `after`, `given` entries given."""

    after: tuple[int, ...]
    given: int


def digest(request: Any) -> str:
    """What makes two requests the same listing: every field but the paging's own."""
    listing = type(request)()
    listing.CopyFrom(request)
    listing.ClearField("page_size")
    listing.ClearField("page_token")
    return hashlib.sha256(listing.SerializeToString(deterministic=True)).hexdigest()[:16]


def encode(cursor: Cursor, listing: str) -> str:
    text = json.dumps([_VERSION, listing, list(cursor.after), cursor.given], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode(token: str, listing: str) -> Cursor | None:
    """The cursor of `token` (None for the first page); InvalidInput when it is not a token
    of this listing (garbage, cut, another filter's, another version's)."""
    if not token:
        return None
    try:
        if len(token) > MAX_TOKEN:
            raise ValueError("too long")
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        version, digest_of, after, given = json.loads(text)
        cursor = Cursor(tuple(_count(k) for k in after), _count(given))
        if version != _VERSION or not 1 <= len(after) <= 2:
            raise ValueError("not this version's")
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise InvalidInput(
            "page_token", brief(token), "not a page token: list again from the first page"
        ) from None
    if digest_of != listing:
        raise InvalidInput(
            "page_token",
            brief(token),
            "a token of another listing (other filters or limit): list again from the first page",
        )
    return cursor


def page_size(asked: int, largest: int) -> int:
    """Entries in one page: what was asked, at most the coordinator's largest page (a
    larger ask gets the largest, as 0 does, rather than an error: a caller that pages on
    gets everything either way)."""
    return min(asked, largest) if asked > 0 else largest


def _count(value: Any) -> int:
    if type(value) is not int or not 0 <= value < 2**63:
        raise ValueError("not a count")
    return value
