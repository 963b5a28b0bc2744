"""How a gpuq.Client submits: over each thread's open Submit stream (a message costs both
sides much less than a call), and again, with the same request key, when no answer came.

A submission that got no answer is sent again (on a new stream; the key makes the repeat no
second job) after each of SUBMIT_RETRY_DELAYS; an answer, an error included, is final. With
several addresses, an unreachable one passes the request to the next at once; the pause comes
when each has been tried.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from typing import Any

import grpc

from gpuq.client_connection import Connection
from gpuq.client_errors import transient, unreachable
from gpuq.errors import ServerUnavailable
from gpuq.v1 import queue_pb2, queue_pb2_grpc

# a submission that got no answer is sent again (with its request key, so it is not a second
# job) after each of these pauses, in seconds, before ServerUnavailable is raised
SUBMIT_RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0)


class Submissions:
    """Each thread's open Submit stream to one Client's coordinators."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._streams = threading.local()  # each thread's open Submit stream
        # every thread's, to close with the client; weak: a thread's stream ends with the thread
        self._open: weakref.WeakSet[SubmitStream] = weakref.WeakSet()
        self._open_lock = threading.Lock()

    def close(self) -> None:
        with self._open_lock:
            streams, self._open = list(self._open), weakref.WeakSet()
        for stream in streams:
            stream.close()

    def submit(self, request: queue_pb2.SubmitRequest, timeout: float) -> queue_pb2.SubmitResult:
        """The coordinator's answer to `request`, sent again while none comes (see above)."""
        connection = self._connection
        delays = iter((*SUBMIT_RETRY_DELAYS, None))
        delay = next(delays)
        others = len(connection.addresses) - 1  # to try before the next pause
        while True:
            stream = self._stream(timeout)
            try:
                result = stream.submit(request)
            except grpc.RpcError as error:
                self._drop(stream)
                if not transient(error):
                    raise connection.translate(error) from None
                if others and unreachable(error):
                    others -= 1
                    connection.unreachable_at(stream.index)
                    continue
                if delay is None:
                    code = error.code()
                    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                        raise ServerUnavailable(
                            f"the gpuq coordinator at {connection.address} did not answer the "
                            f"submission in {timeout:g} s ({len(SUBMIT_RETRY_DELAYS) + 1} "
                            "tries)"
                        ) from None
                    raise connection.translate(error) from None
                if unreachable(error):
                    connection.unreachable_at(stream.index)  # the next round starts at the next
            else:
                if result is not None:
                    connection.current = stream.index
                    return result
                self._drop(stream)
                if delay is None:
                    raise ServerUnavailable(
                        f"the gpuq coordinator at {connection.address} ended the submission "
                        f"stream without an answer ({len(SUBMIT_RETRY_DELAYS) + 1} tries)"
                    )
            time.sleep(delay)
            delay = next(delays)
            others = len(connection.addresses) - 1

    def _stream(self, timeout: float) -> SubmitStream:
        stream: SubmitStream | None = getattr(self._streams, "current", None)
        if stream is not None and stream.stale():
            self._drop(stream)
            stream = None
        if stream is None:
            index = self._connection.current
            stub, metadata = self._connection.stub_at(index), self._connection.metadata(index)
            stream = SubmitStream(stub, metadata, timeout)
            stream.index = index
            self._streams.current = stream
            with self._open_lock:
                self._open.add(stream)
        return stream

    def _drop(self, stream: SubmitStream) -> None:
        """End the stream (a broken one too: that stops the thread feeding it)."""
        stream.close()
        self._streams.current = None
        with self._open_lock:
            self._open.discard(stream)


class SubmitStream:
    """One open Submit stream, used by one thread: a request in, its result out.

    The call has a deadline of `timeout` and is replaced once half of that has passed, so a
    submission on it has between timeout/2 and timeout to finish, as a call of its own would."""

    index = 0  # which of the client's addresses it goes to

    def __init__(
        self, stub: queue_pb2_grpc.QueueStub, metadata: tuple[Any, ...], timeout: float | None
    ) -> None:
        self._requests: queue.SimpleQueue[queue_pb2.SubmitRequest | None] = queue.SimpleQueue()
        self._results = stub.Submit(
            iter(self._requests.get, None), metadata=metadata, timeout=timeout
        )
        self._replace_at = time.monotonic() + timeout / 2 if timeout is not None else None
        # the end of the requests ends the call (and gRPC's thread that feeds it): on close(),
        # or when the stream is dropped with the thread that used it
        self._end = weakref.finalize(self, self._requests.put, None)

    def stale(self) -> bool:
        """Past half its deadline, or already over (the coordinator restarted since): a request
        sent on it now would fail without having been seen, so a new stream takes it."""
        if self._results.done():
            return True
        return self._replace_at is not None and time.monotonic() >= self._replace_at

    def submit(self, request: queue_pb2.SubmitRequest) -> queue_pb2.SubmitResult | None:
        """Its result; None when the stream ended instead (grpc.RpcError when it failed)."""
        self._requests.put(request)
        result: queue_pb2.SubmitResult | None = next(self._results, None)
        return result

    def close(self) -> None:
        self._end()
