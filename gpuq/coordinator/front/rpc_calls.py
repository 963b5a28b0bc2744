"""What every RPC shares: who calls, resolved once, and how an error ends the call.

The interceptor runs before a call's request is read: a call that does not say who makes it is
refused UNAUTHENTICATED (or PERMISSION_DENIED) by a handler that never reads the body, so an
unauthenticated caller cannot make the coordinator receive or parse megabytes. Otherwise the
Caller it resolved is bound to the call's handler, which reads it with `current_caller()`:
identity is established once per call.

Errors become a status code, a message and a kind in one place (`error_status`): the kind
(gpuq.errors.ERROR_KINDS) travels as the trailing metadata `gpuq-error`, so a client tells
"the job store is down, retry" from "no coordinator there" by a field, not by the message.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from gpuq.coordinator.access.authority import Authority
from gpuq.errors import (
    ERROR_KIND_KEY,
    Conflict,
    DoubleBooking,
    GpuqError,
    IllegalTransition,
    InvalidInput,
    NotFound,
    PermissionDenied,
    StorageUnavailable,
    Unsatisfiable,
    error_kind,
)
from gpuq.identity import METADATA_KEY, Caller, Unauthenticated
from gpuq.store.failures import is_storage_error, storage_unavailable

log = logging.getLogger(__name__)
R = TypeVar("R")

_STATUS: dict[type[GpuqError], grpc.StatusCode] = {
    InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    Unsatisfiable: grpc.StatusCode.FAILED_PRECONDITION,
    NotFound: grpc.StatusCode.NOT_FOUND,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    IllegalTransition: grpc.StatusCode.FAILED_PRECONDITION,
    Conflict: grpc.StatusCode.ALREADY_EXISTS,
    DoubleBooking: grpc.StatusCode.INTERNAL,
    StorageUnavailable: grpc.StatusCode.UNAVAILABLE,
}
_CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("gpuq_caller")


def current_caller() -> Caller:
    """Who makes the RPC being handled (the interceptor resolved it)."""
    return _CALLER.get()


@dataclass(frozen=True, slots=True)
class RpcStatus:
    code: grpc.StatusCode
    message: str
    kind: str  # gpuq.errors.ERROR_KINDS' name for it; "" for an internal error


def status_for(error: GpuqError) -> grpc.StatusCode:
    for kind in type(error).__mro__:
        if kind in _STATUS:
            return _STATUS[kind]
    return grpc.StatusCode.UNKNOWN


def error_status(error: Exception) -> RpcStatus:
    """The status an error ends an RPC (or one submission of a stream) with."""
    if is_storage_error(error):  # the database, not the call
        log.error("the job store failed: %s", error)
        error = storage_unavailable(error)
    if isinstance(error, GpuqError):
        return RpcStatus(status_for(error), str(error), error_kind(error))
    log.exception("internal error in an RPC", exc_info=error)
    return RpcStatus(grpc.StatusCode.INTERNAL, f"internal error: {error}", "")


async def end_call(context: grpc.aio.ServicerContext, error: Exception) -> None:
    """End the call with the error's status (raises, as abort does)."""
    if isinstance(error, grpc.aio.AbortError):  # ended already (an undecodable request)
        raise error
    status = error_status(error)
    kind = ((ERROR_KIND_KEY, status.kind),) if status.kind else ()
    await context.abort(status.code, status.message, kind)


def unary(
    method: Callable[[Any, Any, Caller], Awaitable[R]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]:
    """A unary RPC: the method gets the request and the caller, and any error ends the call
    with its status."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await method(self, request, current_caller())
        except Exception as error:
            await end_call(context, error)
            raise

    return wrapper


class StreamCount:
    """Open Submit, Watch and Attach streams per user: they last, and one user must not take
    every call the server allows (maximum_concurrent_rpcs) from the others."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: Counter[str] = Counter()

    @contextlib.contextmanager
    def opened(self, user: str) -> Iterator[str]:
        """'' while the stream may stay open; else why not (nothing is counted then)."""
        if self.open[user] >= self.limit:
            yield f"{user} has {self.limit} submit and watch streams open already (the most)"
            return
        self.open[user] += 1
        try:
            yield ""
        finally:
            self.open[user] -= 1
            if not self.open[user]:
                del self.open[user]


# ---- the interceptor -----------------------------------------------------------------------


BOUND_KEPT = 4096  # handlers bound to a caller kept (per method and caller), at most


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, authority: Authority) -> None:
        self.authority = authority
        # a method's handler bound to a caller, kept: the server's handlers never change, and
        # binding one anew (closures, grpc's handler) was a tenth of a kept listing page's
        # CPU in the coordinator (issue 27)
        self._bound: dict[tuple[str, Caller], grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        authorization = None
        for key, value in details.invocation_metadata or ():
            if key == METADATA_KEY:
                authorization = value if isinstance(value, str) else None
        try:
            caller = self.authority.caller(details.method, authorization)
        except Unauthenticated as exc:
            return _refusal(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        except PermissionDenied as exc:
            return _refusal(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        bound = self._bound.get((details.method, caller))
        if bound is not None:
            return bound
        handler = await continuation(details)
        if handler is None:
            return None
        if len(self._bound) >= BOUND_KEPT:
            self._bound.clear()
        bound = self._bound[(details.method, caller)] = _bound(handler, caller, details.method)
        return bound


class _Undecodable:
    """What a request that is not its method's message decodes to: the call is refused
    INVALID_ARGUMENT with one line in the log (grpc would log a traceback)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = " ".join(str(error).split())[:200]  # one line


def _decoding(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def decode(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as error:  # DecodeError, or whatever a deserializer raises
            return _Undecodable(error)

    return decode


def _encoding(serializer: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """The method's serializer, but a reply that is bytes already (a listing's page, kept as
    the wire carries it: gpuq.coordinator.front.job_pages) goes as it is."""
    if serializer is None:
        return None

    def encode(reply: Any) -> bytes:
        return reply if isinstance(reply, bytes) else serializer(reply)

    return encode


def _bound(handler: grpc.RpcMethodHandler, caller: Caller, method: str) -> grpc.RpcMethodHandler:
    """The same handler, with `caller` as the call's current_caller(), and a request that
    cannot be decoded refused in one line."""

    async def refuse(undecodable: _Undecodable, context: grpc.aio.ServicerContext) -> None:
        log.warning(
            "a request to %s from %s could not be decoded: %s",
            method,
            caller.user,
            undecodable.error,
        )
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the request could not be decoded")

    async def checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        async for request in requests:
            if isinstance(request, _Undecodable):
                await refuse(request, context)
            yield request

    def read(request: Any, context: grpc.aio.ServicerContext, streaming: bool) -> Any:
        return checked(request, context) if streaming else request

    def call(behavior: Any, streaming: bool = False) -> Any:
        async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
            _CALLER.set(caller)
            if isinstance(request, _Undecodable):
                await refuse(request, context)
            return await behavior(read(request, context, streaming), context)

        return run

    def stream(behavior: Any, streaming: bool = False) -> Any:
        async def run(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            _CALLER.set(caller)
            if isinstance(request, _Undecodable):
                await refuse(request, context)
            async for reply in behavior(read(request, context, streaming), context):
                yield reply

        return run

    kinds = (_decoding(handler.request_deserializer), _encoding(handler.response_serializer))
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(call(handler.unary_unary), *kinds)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(call(handler.stream_unary, True), *kinds)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(stream(handler.unary_stream), *kinds)
    return grpc.stream_stream_rpc_method_handler(stream(handler.stream_stream, True), *kinds)


def _refusal(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler that ends the call at once. It takes a request stream whatever the method's
    kind, and never reads it: a refused caller's body is not received, let alone parsed."""

    async def refuse(_requests: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    return grpc.stream_unary_rpc_method_handler(refuse)
