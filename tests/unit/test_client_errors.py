"""The client reads which error the coordinator raised from a field (the trailing metadata
`gpuq-error`, or a SubmitResult's error_kind), not from its message's words: "the job store is
down, retry" and "no coordinator there" share the status UNAVAILABLE."""

from __future__ import annotations

import grpc
import pytest

from gpuq.client_errors import error_for, transient, translate, unreachable
from gpuq.errors import (
    ERROR_KIND_KEY,
    ERROR_KINDS,
    GpuqError,
    IllegalTransition,
    InvalidInput,
    ServerUnavailable,
    StorageUnavailable,
    StoreInUse,
    Unsatisfiable,
    error_kind,
)


class Failed(grpc.RpcError):
    """A failed call as grpc raises it: code, details, trailing metadata."""

    def __init__(self, code: grpc.StatusCode, details: str, kind: str = "") -> None:
        self._code, self._details = code, details
        self._trailing = ((ERROR_KIND_KEY, kind),) if kind else ()

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailing


def test_the_store_down_is_an_answer_and_no_coordinator_is_not() -> None:
    down = Failed(
        grpc.StatusCode.UNAVAILABLE,
        "the job store cannot be written now (x)",
        "storage_unavailable",
    )
    raised = translate(down, "unix:/s")
    assert type(raised) is StorageUnavailable
    assert str(raised) == "the job store cannot be written now (x); retry later"
    assert not transient(down) and not unreachable(down)  # the coordinator answered
    gone = Failed(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
    assert type(translate(gone, "unix:/s")) is ServerUnavailable
    assert transient(gone) and unreachable(gone)
    # a message that merely reads like the store's is still the transport's
    lookalike = Failed(grpc.StatusCode.UNAVAILABLE, "storage unavailable: not from gpuq")
    assert type(translate(lookalike, "unix:/s")) is ServerUnavailable


@pytest.mark.parametrize("kind", sorted(ERROR_KINDS))
def test_each_kind_comes_back_as_its_exception_type(kind: str) -> None:
    raised = error_for(grpc.StatusCode.UNKNOWN, "what went wrong", kind)
    assert type(raised) is ERROR_KINDS[kind]
    assert str(raised).startswith("what went wrong")


def test_the_kind_a_server_error_travels_as() -> None:
    assert error_kind(StoreInUse("held")) == "storage_unavailable"  # its base's kind
    assert error_kind(InvalidInput("f", 1, "bad")) == "invalid_input"
    assert error_kind(GpuqError("plain")) == ""


def test_a_coordinator_that_does_not_say_the_kind_is_read_by_status() -> None:
    assert type(error_for(grpc.StatusCode.INVALID_ARGUMENT, "invalid x 1: bad")) is InvalidInput
    refused = error_for(grpc.StatusCode.FAILED_PRECONDITION, "job 3: cannot go from a to b")
    assert type(refused) is IllegalTransition
    assert type(error_for(grpc.StatusCode.FAILED_PRECONDITION, "no room")) is Unsatisfiable


def test_no_coordinator_says_whose_queue_to_start() -> None:
    """The machine's queue (its socket in /var/lib/gpuq, or a TCP address) is an admin's to
    start; a socket in the user's own home is a private queue they may start themselves."""
    from gpuq.config.settings import how_to_start

    assert "an admin starts it" in how_to_start("unix:/var/lib/gpuq/gpuq.sock")
    assert "an admin starts it" in how_to_start("head:7817,spare:7817")
    assert "an admin starts it" in how_to_start("unix:/home/a/.local/share/gpuq/gpuq.sock,h:1")
    private = how_to_start("unix:/home/a/.local/share/gpuq/gpuq.sock")
    assert "gpuq serve" in private and "admin" not in private
