"""What a gRPC status from the coordinator means on the client's side: the gpuq exception the
coordinator raised (gpuq.coordinator.servicers maps each to a status code), "no coordinator
there" (ServerUnavailable, saying how to start one, or what TLS said), or "the coordinator
answered that its store is unavailable" (StorageUnavailable).

The last two share the status UNAVAILABLE and differ by a prefix of the details that the
coordinator puts there: storage_message() is the one place that reads it.
"""

from __future__ import annotations

import grpc

from gpuq.errors import (
    Conflict,
    GpuqError,
    IllegalTransition,
    InvalidInput,
    NotFound,
    PermissionDenied,
    ServerUnavailable,
    StorageUnavailable,
    Unsatisfiable,
)

STORAGE_PREFIX = "storage unavailable: "  # gpuq.coordinator.servicers says it so
HOW_TO_START = "start it with `gpuq serve` (or `systemctl start gpuq-coordinator` on a server)"
STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}  # a SubmitResult's code
_TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_ERRORS: dict[grpc.StatusCode, type[GpuqError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDenied,
    grpc.StatusCode.ALREADY_EXISTS: Conflict,
}


def storage_message(code: grpc.StatusCode, details: str) -> str | None:
    """The coordinator's message when this status says that its store is unavailable (an
    answer: it saved nothing), else None."""
    if code == grpc.StatusCode.UNAVAILABLE and details.startswith(STORAGE_PREFIX):
        return details[len(STORAGE_PREFIX) :]
    return None


def transient(error: grpc.RpcError) -> bool:
    """No answer came (the request may or may not have been seen): sending it again with its
    key is safe. A storage error is an answer (the coordinator said it, and saved nothing)."""
    code, details = error.code(), error.details() or ""
    return code in _TRANSIENT and storage_message(code, details) is None


def unreachable(error: grpc.RpcError) -> bool:
    """No coordinator answered at that address (down, or a standby not leading yet)."""
    code, details = error.code(), error.details() or ""
    return code == grpc.StatusCode.UNAVAILABLE and storage_message(code, details) is None


def translate(error: grpc.RpcError, address: str, tls_on: bool = False) -> GpuqError:
    """The exception for a failed call to the coordinator(s) at `address` (for messages)."""
    code, details = error.code(), error.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE and storage_message(code, details) is None:
        from gpuq.tls import explain_unavailable

        tls_problem = explain_unavailable(details, tls_on=tls_on)
        if tls_problem is not None:
            return ServerUnavailable(f"cannot talk to the coordinator at {address}: {tls_problem}")
        return ServerUnavailable(f"no gpuq coordinator at {address}; {HOW_TO_START}")
    return error_for(code, details)


def error_for(code: grpc.StatusCode, details: str) -> GpuqError:
    """The exception the coordinator raised, from the status code it was mapped to."""
    stored = storage_message(code, details)
    if stored is not None:
        return StorageUnavailable(stored + "; retry later")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return _from_message(InvalidInput, details)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        kind = IllegalTransition if "cannot go from" in details else Unsatisfiable
        return _from_message(kind, details)
    return _from_message(_ERRORS.get(code, GpuqError), details or code.name)


def _from_message(kind: type[GpuqError], message: str) -> GpuqError:
    """The coordinator's exception type with its message (the fields stay server-side)."""
    error = kind.__new__(kind)
    Exception.__init__(error, message)
    return error
