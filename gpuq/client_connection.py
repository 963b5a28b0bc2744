"""The coordinators one gpuq.Client talks to: a channel per address (made on first use), the
caller's credential for each, and which address answered last.

The address may name several coordinators, comma-separated (a leader and its standbys on one
PostgreSQL store): a call goes to the one that answered last (at first, the first one), and
one that finds it unreachable (UNAVAILABLE) tries the next, so a standby that took over is
found without a restart.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import grpc

from gpuq.client_errors import translate, unreachable
from gpuq.config.settings import auth_socket_for
from gpuq.errors import GpuqError, ServerUnavailable
from gpuq.identity import METADATA_KEY, credential_expiry, fetch_credential, read_user_token
from gpuq.tls import client_channel
from gpuq.v1 import queue_pb2_grpc


class Connection:
    """Channels, stubs and credentials per address, and the address in use."""

    def __init__(
        self, addresses: list[str], token: str | None, token_file: Path, tls_ca: str | None
    ) -> None:
        self.addresses = addresses
        self.current = 0  # the address that answered last
        self._token = token  # a per-user token for TCP; None: read from the token file
        self._token_file = token_file
        # each Unix socket address's credential (gpuq.identity), until shortly before it expires
        self._credentials: dict[str, str] = {}
        self._tls_ca = tls_ca  # verifies the coordinator over TCP (gpuq.tls)
        self.channels: list[grpc.Channel | None] = [None] * len(addresses)
        self._stubs: list[queue_pb2_grpc.QueueStub | None] = [None] * len(addresses)
        self._channels_lock = threading.Lock()

    def close(self) -> None:
        with self._channels_lock:
            for channel in self.channels:
                if channel is not None:
                    channel.close()

    @property
    def address(self) -> str:
        """The coordinator address in use (the one that answered last)."""
        return self.addresses[self.current]

    @property
    def where(self) -> str:
        """All the addresses, for messages."""
        return ", ".join(self.addresses)

    def stub_at(self, index: int) -> queue_pb2_grpc.QueueStub:
        stub = self._stubs[index]
        if stub is None:
            with self._channels_lock:
                stub = self._stubs[index]
                if stub is None:
                    # TLS for HOST:PORT when [client] tls_ca is set; a Unix socket never
                    channel = client_channel(
                        self.addresses[index],
                        self._tls_ca,
                        [("grpc.max_receive_message_length", 256 << 20)],
                    )
                    self.channels[index] = channel
                    stub = self._stubs[index] = queue_pb2_grpc.QueueStub(channel)
        return stub

    def unreachable_at(self, index: int) -> None:
        """The address `index` did not answer: the next call starts at the one after it
        (unless another thread has moved on already)."""
        if self.current == index:
            self.current = (index + 1) % len(self.addresses)

    def translate(self, error: grpc.RpcError) -> GpuqError:
        """The exception for a failed call, naming every address."""
        return translate(error, self.where, self._tls_ca is not None)

    def metadata(self, index: int) -> tuple[tuple[str, str], ...]:
        """On a Unix socket, a credential from the coordinator's handshake socket (the kernel
        tells it our uid); over TCP, this user's token."""
        address = self.addresses[index]
        if address.startswith("unix:"):
            credential = self._credentials.get(address)
            if credential is None or credential_expiry(credential) < time.time() + 60:
                socket_path = Path(address.removeprefix("unix:").removeprefix("//"))
                credential = fetch_credential(auth_socket_for(socket_path))
                self._credentials[address] = credential
            return ((METADATA_KEY, f"Bearer {credential}"),)
        if self._token is None:
            self._token = read_user_token(self._token_file)
        return ((METADATA_KEY, f"Token {self._token}"),)

    def call(self, method: str, request: Any, timeout: float | None) -> Any:
        """The reply from the address that answered last, or else from the first of the
        others that answers (each tried once)."""
        start, count = self.current, len(self.addresses)
        for attempt in range(count):
            index = (start + attempt) % count
            try:
                metadata = self.metadata(index)
            except ServerUnavailable:
                if attempt + 1 < count:
                    self.unreachable_at(index)
                    continue
                raise
            try:
                reply = getattr(self.stub_at(index), method)(
                    request, metadata=metadata, timeout=timeout
                )
            except grpc.RpcError as error:
                if attempt + 1 < count and unreachable(error):
                    self.unreachable_at(index)
                    continue
                raise self.translate(error) from None
            if index != start:
                self.current = index
            return reply
        raise AssertionError("unreachable")  # pragma: no cover

    def call_together(self, calls: list[tuple[str, Any]], timeout: float | None) -> list[Any]:
        """The replies to `calls` (method, request), sent at once to the address that answered
        last: a glance of four listings waits about one round trip instead of four (issue
        27). Where that address does not answer, one after another through `call`, which
        tries the others."""
        index = self.current
        try:
            metadata, stub = self.metadata(index), self.stub_at(index)
        except ServerUnavailable:
            if len(self.addresses) == 1:
                raise
            return [self.call(method, request, timeout) for method, request in calls]
        futures = [
            getattr(stub, method).future(request, metadata=metadata, timeout=timeout)
            for method, request in calls
        ]
        try:
            return [future.result() for future in futures]
        except grpc.RpcError as error:
            for future in futures:
                future.cancel()
            if len(self.addresses) > 1 and unreachable(error):
                self.unreachable_at(index)
                return [self.call(method, request, timeout) for method, request in calls]
            raise self.translate(error) from None
