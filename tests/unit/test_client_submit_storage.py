"""A coordinator's "storage unavailable" answer to a submission is final: the client returns it
to the user at once, on the first try, instead of sending it again for a minute (a retry keeps
its request key, but this answer is not a lost one)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from gpuq.client_errors import error_for, transient
from gpuq.client_submit import Submissions
from gpuq.errors import ERROR_KIND_KEY, StorageUnavailable
from gpuq.v1 import queue_pb2


class Aborted(grpc.RpcError):
    """A call the coordinator ended with a status and its error kind."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "storage unavailable: disk full (database or disk is full)"

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((ERROR_KIND_KEY, "storage_unavailable"),)


class Results:
    def __init__(self, answer: queue_pb2.SubmitResult | Exception) -> None:
        self.answer = answer

    def done(self) -> bool:
        return False

    def __iter__(self) -> Iterator[queue_pb2.SubmitResult]:
        return self

    def __next__(self) -> queue_pb2.SubmitResult:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class Stub:
    def __init__(self, answer: queue_pb2.SubmitResult | Exception) -> None:
        self.answer = answer
        self.calls = 0

    def Submit(self, requests: Any, metadata: Any, timeout: float | None) -> Results:
        self.calls += 1
        return Results(self.answer)


class Connection:
    addresses = ["127.0.0.1:1"]
    address = "127.0.0.1:1"
    current = 0

    def __init__(self, stub: Stub) -> None:
        self.stub = stub

    def stub_at(self, index: int) -> Stub:
        return self.stub

    def metadata(self, index: int) -> tuple[Any, ...]:
        return ()

    def unreachable_at(self, index: int) -> None:
        raise AssertionError("not unreachable: the coordinator answered")

    def translate(self, error: grpc.RpcError) -> Exception:
        return error_for(error.code(), error.details() or "", "storage_unavailable")


@pytest.mark.parametrize(
    "answer",
    [
        queue_pb2.SubmitResult(
            code=grpc.StatusCode.UNAVAILABLE.value[0],
            message="storage unavailable: disk full (database or disk is full)",
            error_kind="storage_unavailable",
        ),
        Aborted(),
    ],
    ids=["result", "aborted-stream"],
)
def test_storage_unavailable_is_answered_at_once(answer: Any) -> None:
    stub = Stub(answer)
    submissions = Submissions(Connection(stub))  # type: ignore[arg-type]
    began = time.monotonic()
    try:
        result = submissions.submit(queue_pb2.SubmitRequest(request_key="k"), 20.0)
    except StorageUnavailable as exc:
        assert "disk full" in str(exc) and "retry later" in str(exc)
    else:
        assert result.error_kind == "storage_unavailable"
        error = error_for(grpc.StatusCode.UNAVAILABLE, result.message, result.error_kind)
        assert isinstance(error, StorageUnavailable)
        assert str(error).startswith("storage unavailable: disk full")
    assert stub.calls == 1  # one try: not sent again
    assert time.monotonic() - began < 0.2
    submissions.close()


def test_an_answered_storage_error_is_not_transient() -> None:
    assert not transient(Aborted())
