"""Server interceptors: the exception tree → gRPC status codes, with the exception's class
as a standard ``google.rpc.Status`` detail (``ErrorInfo``, through grpcio-status) so the
client raises the very same class, plus request metrics and one log line per failed
request."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from bulldozer.errors import BulldozerError, KvError
from bulldozer.kv.convert import ERROR_DOMAIN

__all__ = ["MAX_MESSAGE_BYTES", "ErrorInterceptor", "bounded", "error_status"]

log = logging.getLogger("bulldozer.kv.server")


#: the most UTF-8 bytes of an error's message a status carries (``bounded``)
MAX_MESSAGE_BYTES = 2_000


def bounded(message: str) -> str:
    """``message`` cut to ``MAX_MESSAGE_BYTES`` of UTF-8, saying how much was left out. A
    status travels in the response's trailers, its message twice (``grpc-message``,
    percent-encoded, and ``grpc-status-details-bin``), and gRPC allows 16 KiB of them: a
    message that quoted a client's long input (a 3,000-entry list of states) went over it,
    and the client got RESOURCE_EXHAUSTED "received metadata size exceeds hard limit"
    (INTERNAL "RST_STREAM" through the native plane) instead of the error. Cut here, a
    message takes at most ≈ 9 KB of them."""
    data = message.encode("utf-8")
    if len(data) <= MAX_MESSAGE_BYTES:
        return message
    kept = data[:MAX_MESSAGE_BYTES].decode("utf-8", "ignore")
    return f"{kept}… ({len(data) - len(kept.encode('utf-8')):,} bytes more)"


def error_status(exc: BulldozerError) -> grpc.Status:
    """The status a Bulldozer error travels as: its class's code, its one-line message
    (``bounded``), and an ``ErrorInfo`` naming its class."""
    from grpc_status import rpc_status  # 8 ms of a DAL's start, for its first error

    code = getattr(grpc.StatusCode, exc.grpc_code, grpc.StatusCode.UNKNOWN)
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=type(exc).__name__, domain=ERROR_DOMAIN))
    message = bounded(str(exc))
    return rpc_status.to_status(status_pb2.Status(code=code.value[0], message=message, details=[detail]))


def _abort(context: grpc.ServicerContext, exc: BaseException) -> None:
    if isinstance(exc, BulldozerError):
        context.abort_with_status(error_status(exc))
    log.exception("unexpected error", exc_info=exc)
    context.abort(grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__}); see the DAL's log")


def _decoded(raw: Iterator[bytes], decode: Callable[[bytes], Any] | None, method: str) -> Iterator[Any]:
    """A client stream's messages (``raw``), each decoded by ``decode``; one that does not
    decode ends the call with ``KvError`` (INTERNAL, the code gRPC gives an undecodable unary
    request on both data planes). gRPC Python's server, left to decode a client stream's
    messages itself, answered such a call INTERNAL and then could not stop: after two of
    them (grpcio 1.85), ``server.stop``'s wait never ended, and a DAL asked to stop waited
    its whole grace period and 15 s more, then exited 1 saying its store did not finish."""
    if decode is None:
        yield from raw
        return
    for number, message in enumerate(raw, 1):
        try:
            request = decode(message)
        except Exception:  # protobuf's DecodeError, or what another deserializer raises
            raise KvError(f"{method}: message {number} of the stream does not decode as its request") from None
        yield request


class ErrorInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Maps exceptions to status codes and records per-method metrics."""

    def __init__(self, metrics: Any = None) -> None:
        self.metrics = metrics
        self._wrapped: dict[str, Any] = {}

    def _done(self, method: str, started: float, code: str) -> None:
        if self.metrics is not None:
            self.metrics.request(method, code, time.perf_counter() - started)

    def intercept_service(self, continuation: Callable[[Any], Any], details: grpc.HandlerCallDetails) -> Any:
        cached = self._wrapped.get(details.method)
        if cached is not None:
            return cached
        handler = continuation(details)
        if handler is None:
            return None
        wrapped = self._wrap(handler, details.method.rsplit("/", 1)[-1])
        if not self._wrapped or len(self._wrapped) < 256:
            self._wrapped[details.method] = wrapped
        return wrapped

    def _wrap(self, handler: Any, method: str) -> Any:

        def unary(
            behavior: Callable[[Any, grpc.ServicerContext], Any],
        ) -> Callable[[Any, grpc.ServicerContext], Any]:
            def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
                started = time.perf_counter()
                try:
                    response = behavior(request, context)
                except grpc.RpcError:
                    # the client went away mid-stream; nothing to answer
                    self._done(method, started, "CANCELLED")
                    log.info("%s: the client went away before the call finished", method)
                    raise
                except Exception as exc:
                    code = getattr(exc, "grpc_code", "INTERNAL") if isinstance(exc, BulldozerError) else "INTERNAL"
                    self._done(method, started, code)
                    if isinstance(exc, BulldozerError):
                        log.info("%s refused: %s: %s", method, type(exc).__name__, bounded(str(exc)))
                    _abort(context, exc)
                    raise  # unreachable: abort raises
                self._done(method, started, "OK")
                return response

            return wrapped

        def streaming(
            behavior: Callable[[Any, grpc.ServicerContext], Iterator[Any]],
        ) -> Callable[[Any, grpc.ServicerContext], Iterator[Any]]:
            def wrapped(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                started = time.perf_counter()
                try:
                    yield from behavior(request, context)
                except Exception as exc:
                    code = getattr(exc, "grpc_code", "INTERNAL") if isinstance(exc, BulldozerError) else "INTERNAL"
                    self._done(method, started, code)
                    _abort(context, exc)
                    raise
                self._done(method, started, "OK")

            return wrapped

        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                unary(handler.unary_unary),
                handler.request_deserializer,
                handler.response_serializer,
            )
        if handler.stream_unary:
            # a client stream's messages are decoded here, not by gRPC (``_decoded``)
            behavior, decode = handler.stream_unary, handler.request_deserializer

            def decoded(requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
                return behavior(_decoded(requests, decode, method), context)

            return grpc.stream_unary_rpc_method_handler(unary(decoded), None, handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                streaming(handler.unary_stream),
                handler.request_deserializer,
                handler.response_serializer,
            )
        return handler
