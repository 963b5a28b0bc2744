"""Newline-delimited JSON over a stream transport: how the agent talks to its fork server and to
its supervisors (the formats are in gpuq.agent.jobs.job_folder and gpuq.agent.jobs.fork_server)."""

from __future__ import annotations

import asyncio
import json
import logging

from gpuq.agent.jobs.job_folder import Message

log = logging.getLogger(__name__)


class JsonLinesProtocol(asyncio.Protocol):
    """One JSON object a line, each handed to on_message; a malformed line is logged and
    skipped."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pending = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        *lines, self.pending = (self.pending + data).split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                log.warning("ignoring a malformed line: %r", line[:200])
                continue
            if isinstance(message, dict):
                self.on_message(message)

    def send(self, message: Message) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def on_message(self, message: Message) -> None:
        raise NotImplementedError
