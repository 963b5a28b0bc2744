"""What a gRPC status from the coordinator means on the client's side: the gpuq exception the
coordinator raised, "no coordinator there" (ServerUnavailable, saying how to start one, or what
TLS said), or "the coordinator answered that its store is unavailable" (StorageUnavailable).

The coordinator says which of its errors ended a call by a field: the trailing metadata
`gpuq-error` (SubmitResult.error_kind for one submission of a stream), one of
gpuq.errors.ERROR_KINDS (gpuq.coordinator.front.rpc_calls sets it). The last two above share
the status UNAVAILABLE: a call that carries the kind `storage_unavailable` is the
coordinator's answer, one without it is the transport's (no coordinator answered).
"""

from __future__ import annotations

import grpc

from gpuq.errors import (
    ERROR_KIND_KEY,
    ERROR_KINDS,
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
from gpuq.v1 import queue_pb2


def outcomes_of(reply: queue_pb2.ActionReply, missing_ok: bool) -> list[queue_pb2.ActionOutcome]:
    """An action's outcomes; NotFound where a job named does not exist (unless missing_ok),
    as a call about one job (client.get) raises it: the coordinator acted on the others."""
    outcomes = list(reply.outcomes)
    missing = [o.message for o in outcomes if o.error_kind == "not_found"]
    if missing and not missing_ok:
        raise NotFound("; ".join(missing))
    return outcomes


STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}  # a SubmitResult's code
_TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_ERRORS: dict[grpc.StatusCode, type[GpuqError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDenied,
    grpc.StatusCode.ALREADY_EXISTS: Conflict,
}


def error_kind(error: grpc.RpcError) -> str:
    """The kind of gpuq error the coordinator said ended the call ("" when none did: the
    transport's own failure, or a coordinator that did not say)."""
    trailing = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == ERROR_KIND_KEY and isinstance(value, str):
            return value
    return ""


def transient(error: grpc.RpcError) -> bool:
    """No answer came (the request may or may not have been seen): sending it again with its
    key is safe. A coordinator's error is an answer (it said it, and saved nothing)."""
    return error.code() in _TRANSIENT and not error_kind(error)


def unreachable(error: grpc.RpcError) -> bool:
    """No coordinator answered at that address (down, or a standby not leading yet)."""
    return error.code() == grpc.StatusCode.UNAVAILABLE and not error_kind(error)


def translate(error: grpc.RpcError, address: str, tls_on: bool = False) -> GpuqError:
    """The exception for a failed call to the coordinator(s) at `address` (for messages)."""
    code, details, kind = error.code(), error.details() or "", error_kind(error)
    if code == grpc.StatusCode.UNAVAILABLE and not kind:
        from gpuq.tls import explain_unavailable

        tls_problem = explain_unavailable(details, tls_on=tls_on)
        if tls_problem is not None:
            return ServerUnavailable(f"cannot talk to the coordinator at {address}: {tls_problem}")
        from gpuq.config.settings import how_to_start

        return ServerUnavailable(f"no gpuq coordinator at {address}; {how_to_start(address)}")
    return error_for(code, details, kind)


def error_for(code: grpc.StatusCode, details: str, kind: str = "") -> GpuqError:
    """The exception the coordinator raised: by the kind it said, else from the status code
    it was mapped to."""
    raised = ERROR_KINDS.get(kind)
    if raised is StorageUnavailable:
        return StorageUnavailable(details + "; retry later")
    if raised is not None:
        return _from_message(raised, details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return _from_message(InvalidInput, details)
    if code == grpc.StatusCode.FAILED_PRECONDITION:  # a coordinator that did not say the kind
        refused = IllegalTransition if "cannot go from" in details else Unsatisfiable
        return _from_message(refused, details)
    return _from_message(_ERRORS.get(code, GpuqError), details or code.name)


def _from_message(kind: type[GpuqError], message: str) -> GpuqError:
    """The coordinator's exception type with its message (the fields stay server-side)."""
    error = kind.__new__(kind)
    Exception.__init__(error, message)
    return error
