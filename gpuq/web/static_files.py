"""The dashboard's page, script and style (gpuq/web/static, shipped in the wheel), served from
memory with a content hash as ETag: a reload asks "still this?" and gets a bodiless 304.

Only names listed in the folder are served (no path, no dot file, no link): a request names a
file, it never makes a path.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from gpuq.web.http_types import Response

STATIC = Path(__file__).parent / "static"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".woff2": "font/woff2",
    ".txt": "text/plain; charset=utf-8",
    ".map": "application/json",
}
PLACEHOLDER = (
    b"<!doctype html><meta charset=utf-8><title>gpuq</title><p>The dashboard's page is not "
    b"installed (gpuq/web/static/index.html).</p>\n"
)


@dataclass(frozen=True, slots=True)
class _Kept:
    body: bytes
    etag: str
    mtime_ns: int
    size: int


class StaticFiles:
    """The files of one folder, read again when one changes (size or modification time)."""

    def __init__(self, folder: Path = STATIC) -> None:
        self.folder = folder
        self._kept: dict[str, _Kept] = {}

    def page(self, if_none_match: str | None) -> Response:
        """The one page every view is (index.html), revalidated on each load."""
        found = self.file("index.html", if_none_match, revalidate=True)
        if found is None:
            return Response(200, PLACEHOLDER, TYPES[".html"], [("cache-control", "no-store")])
        return found

    def file(
        self, name: str, if_none_match: str | None, revalidate: bool = False
    ) -> Response | None:
        """The file `name` (None: no such file), or a 304 when `if_none_match` is its ETag."""
        if not name or "/" in name or name.startswith(".") or "\0" in name:
            return None
        try:
            names = os.listdir(self.folder)
        except OSError:
            names = []
        if name not in names:
            return None
        path = self.folder / name
        try:
            info = path.lstat()
            if not stat.S_ISREG(info.st_mode):
                return None
            kept = self._kept.get(name)
            if kept is None or (kept.mtime_ns, kept.size) != (info.st_mtime_ns, info.st_size):
                body = path.read_bytes()
                etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
                kept = self._kept[name] = _Kept(body, etag, info.st_mtime_ns, info.st_size)
        except OSError:
            return None
        content_type = TYPES.get(Path(name).suffix.lower(), "application/octet-stream")
        headers = [
            ("etag", kept.etag),
            ("cache-control", "no-cache" if revalidate else "public, max-age=300, must-revalidate"),
        ]
        if if_none_match == kept.etag:
            return Response(304, b"", content_type, headers)
        return Response(200, kept.body, content_type, headers)
