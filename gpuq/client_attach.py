"""The client's end of an interactive job's terminal (gpuq run, gpuq alloc): one open Attach
stream to the coordinator, which relays it to the job's agent (gpuq.Client.attach opens it)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import grpc

from gpuq.client_errors import translate
from gpuq.v1 import queue_pb2, queue_pb2_grpc

ATTACH_CHUNK = 16 << 10  # bytes of input in one AttachRequest (the coordinator takes 64 KiB)


class Attachment:
    """One open Attach stream. The send methods may be called from any thread (and from a
    signal handler: they only queue); the replies are read by one thread."""

    def __init__(
        self,
        stub: queue_pb2_grpc.QueueStub,
        metadata: tuple[Any, ...],
        job_id: int,
        where: str = "",
    ) -> None:
        self.job_id = job_id
        self._where = where
        self._requests: queue.SimpleQueue[queue_pb2.AttachRequest | None] = queue.SimpleQueue()
        self._requests.put(queue_pb2.AttachRequest(job_id=job_id))
        self._replies = stub.Attach(iter(self._requests.get, None), metadata=metadata)

    def send(self, data: bytes) -> None:
        """Input for the job's terminal (cut into pieces the coordinator takes)."""
        for start in range(0, len(data), ATTACH_CHUNK):
            self._requests.put(queue_pb2.AttachRequest(input=data[start : start + ATTACH_CHUNK]))

    def resize(self, rows: int, cols: int) -> None:
        if 1 <= rows <= 65535 and 1 <= cols <= 65535:
            self._requests.put(queue_pb2.AttachRequest(rows=rows, cols=cols))

    def signal(self, number: int) -> None:
        self._requests.put(queue_pb2.AttachRequest(signal=number))

    def eof(self) -> None:
        self._requests.put(queue_pb2.AttachRequest(eof=True))

    def replies(self) -> Iterator[queue_pb2.AttachReply]:
        """The coordinator's replies until the last (`ended`); GpuqError when the stream
        fails (a refusal, or the coordinator went away)."""
        try:
            yield from self._replies
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.CANCELLED and self._replies.cancelled():
                return  # we closed it
            raise translate(error, self._where) from None

    def close(self) -> None:
        """End the stream (the job is cancelled if it has not ended)."""
        self._requests.put(None)
        self._replies.cancel()
