"""Admission of writes: a DAL takes at most ``Limits.max_writes_in_flight`` PutBatch and
PutStream calls at once (``serve --max-writes-in-flight``); one more is refused as busy
(``DalBusyError``) before its batch is read, and the client's batch writer sends it again
after a pause.

A DAL held every batch it was sent in memory until its turn: 32 concurrent 32 MiB batches
took the Python data plane to 3.1 GiB (the Go plane to 822 MiB), and more writers took it
further. gRPC reads a unary call's whole message before its handler runs, and a call
waiting for one of the server's workers is read as well, so the count starts as the call
arrives, in the first interceptor of the server's chain, and the call is answered with a
*client-streaming* handler: gRPC dispatches on the handler's kind (a unary call is a
stream of one message), runs such a handler whatever became of the call meanwhile, and
reads a message only when the handler asks for one. A refused call's handler never asks;
an admitted call's reads its one message (PutBatch) or hands the stream on (PutStream) and
gives the slot back however it ends. The Go plane does the same in native/kvd/admission.go.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from bulldozer.errors import DalBusyError
from bulldozer.kv.v1 import shared

__all__ = ["WRITE_METHODS", "AdmissionInterceptor", "WriteAdmission"]

#: The calls admission counts (shared with the Go plane).
WRITE_METHODS = frozenset(shared.LIMITS_WRITE_METHODS)


class WriteAdmission:
    """The writes one DAL has taken and not finished, at most ``limit``."""

    def __init__(self, limit: int = shared.LIMITS_MAX_WRITES_IN_FLIGHT) -> None:
        self.limit = limit
        self.taken = 0
        self._lock = threading.Lock()

    def busy(self) -> DalBusyError:
        return DalBusyError(shared.ERRORS_BUSY_MESSAGE % self.limit)

    def take(self) -> bool:
        """Take a slot; False when all are taken."""
        with self._lock:
            if self.taken >= self.limit:
                return False
            self.taken += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self.taken -= 1


class AdmissionInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Counts each write from its arrival to its end; refuses one past the limit unread.
    First in the chain: the statuses it sends itself are the error interceptor's."""

    def __init__(self, admission: WriteAdmission, metrics: Any = None) -> None:
        self.admission = admission
        self.metrics = metrics

    def intercept_service(self, continuation: Callable[[Any], Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None or details.method not in WRITE_METHODS:
            return handler
        if not self.admission.take():
            return _stream_handler(handler, self._refuse(details.method.rsplit("/", 1)[-1]))
        return _stream_handler(handler, _admitted(handler, details.method, self.admission.give_back))

    def _refuse(self, method: str) -> Callable[[Iterator[Any], grpc.ServicerContext], Any]:
        from bulldozer.kv.server.interceptors import error_status

        metrics, refused = self.metrics, self.admission.busy()

        def refuse(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            # ``requests`` is never iterated: the batch is not read
            if metrics is not None:
                metrics.request(method, refused.grpc_code, 0.0)
            context.abort_with_status(error_status(refused))

        return refuse


def _stream_handler(handler: Any, behavior: Callable[[Iterator[Any], grpc.ServicerContext], Any]) -> Any:
    return grpc.stream_unary_rpc_method_handler(behavior, handler.request_deserializer, handler.response_serializer)


def _admitted(handler: Any, method: str, give_back: Callable[[], None]) -> Callable[..., Any]:
    """``handler``'s behaviour on a request stream, giving its slot back however it ends."""
    if handler.stream_unary is not None:
        stream_unary = handler.stream_unary

        def stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            try:
                return stream_unary(requests, context)
            finally:
                give_back()

        return stream
    unary_unary = handler.unary_unary

    def unary(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        try:
            request = next(requests, None)
            if request is None:  # what gRPC answers a unary call that sent none
                context.abort(grpc.StatusCode.UNIMPLEMENTED, f'"{method}" requires exactly one request message.')
            return unary_unary(request, context)
        finally:
            give_back()

    return unary
