"""Sending one notification: a mail through the local MTA, or a webhook's POST in a thread.

A user's URL may not reach the coordinator's own networks (SSRF): the host is resolved once,
the address checked (gpuq.domain.notices.address_allowed, with [coordinator] notify_allow) and
the connection made to that address; HTTPS checks the certificate against the URL's host name.
Redirects are not followed. Refused is what no retry can help.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import ssl
from urllib.parse import urlsplit

from gpuq import __version__
from gpuq.domain.notices import address_allowed, retryable

HTTP_TIMEOUT = 10.0
MAIL_TIMEOUT = 30.0


class Refused(Exception):
    """A delivery that no retry can help (a refused address, a 4xx answer)."""


async def send_mail(program: str, recipient: str, data: bytes) -> None:
    """`mail_program -oi -- RECIPIENT`, the message on stdin (SLURM's MailProg way)."""
    process = await asyncio.create_subprocess_exec(
        program,
        "-oi",
        "--",
        recipient,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, errors = await asyncio.wait_for(process.communicate(data), MAIL_TIMEOUT)
    except (TimeoutError, asyncio.CancelledError):
        process.kill()
        await process.wait()
        raise
    if process.returncode != 0:
        said = errors.decode(errors="replace").strip()[:200]
        raise OSError(f"{program} exited {process.returncode}: {said}")


class _PinnedHTTP(http.client.HTTPConnection):
    """Connects to the address that was checked, not to whatever the name resolves to now."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(
        self, host: str, port: int, address: str, timeout: float, context: ssl.SSLContext
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._address = address
        self._tls = context

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        try:
            self.sock = self._tls.wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise


def resolve(host: str, port: int, trusted: bool, allow: tuple[str, ...]) -> str:
    """The address to connect to: the first the name resolves to that a user's webhook may
    reach (any, for an admin's). Refused when none may."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise OSError(f"cannot resolve the host: {exc.strerror}") from None
    addresses = [str(info[4][0]) for info in found]
    for address in addresses:
        if trusted or address_allowed(address, allow):
            return address
    raise Refused(
        f"the host resolves to {', '.join(sorted(set(addresses))[:4])}: not a public address "
        "and not in [coordinator] notify_allow"
    )


def post(url: str, body: bytes, trusted: bool, allow: tuple[str, ...]) -> int:
    """POST `body` as JSON; the status when 2xx. Raises Refused for what a retry cannot
    help (a refused address, a redirect, another 4xx), OSError for what it may."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    address = resolve(host, port, trusted, allow)
    connection: http.client.HTTPConnection
    if https:
        connection = _PinnedHTTPS(host, port, address, HTTP_TIMEOUT, ssl.create_default_context())
    else:
        connection = _PinnedHTTP(host, port, address, HTTP_TIMEOUT)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    headers = {"Content-Type": "application/json", "User-Agent": f"gpuq/{__version__}"}
    if parts.username is not None:  # user:password@host: basic authentication
        import base64

        pair = f"{parts.username}:{parts.password or ''}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        status = response.status
        response.read(65536)
    except http.client.HTTPException as exc:
        raise OSError(f"bad HTTP answer: {type(exc).__name__}") from None
    finally:
        connection.close()
    if 200 <= status < 300:
        return status
    if retryable(status):
        raise OSError(f"HTTP {status}")
    raise Refused(f"HTTP {status}")
