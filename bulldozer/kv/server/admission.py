"""Admission of writes: a DAL takes at most ``Limits.max_writes_in_flight`` PutBatch and
PutStream calls at once (``serve --max-writes-in-flight``); one more is refused as busy
(``DalBusyError``), and the client's batch writer sends it again after a pause.

A DAL held every batch it was sent in memory until its turn: 32 concurrent 32 MiB batches
took the Python data plane to 3.1 GiB (the Go plane to 822 MiB), and more would have taken
the DAL, and the reads it serves, down. gRPC reads a unary call's whole message before its
handler runs, so a refusal that would spare that memory comes before: the
``AdmissionInterceptor``, first in the server's chain, answers a write that arrives while
the writes are all taken with a handler that never reads its message (a client-streaming
one: gRPC dispatches on the handler's kind, and a unary call is a stream of one message).
The servicer takes the slot (``WriteAdmission.slot``) as it handles the write, and gives it
back however the call ends, so a call the interceptor let through in a race is refused
there, once read. A slot is taken only once a worker handles the call (a call cancelled
while queued never reaches a handler that could give one back), so calls queued for the
server's workers are read by gRPC: the bound is looser than the Go plane's, which does the
same in native/kvd/admission.go as a call's headers arrive (README: the KV DAL).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from bulldozer.errors import DalBusyError
from bulldozer.kv.v1 import shared

__all__ = ["WRITE_METHODS", "AdmissionInterceptor", "WriteAdmission"]

#: The calls admission counts.
WRITE_METHODS = frozenset({"/bulldozer.kv.v1.KvData/PutBatch", "/bulldozer.kv.v1.KvData/PutStream"})


class WriteAdmission:
    """The writes one DAL handles at once, at most ``limit``."""

    def __init__(self, limit: int = shared.LIMITS_MAX_WRITES_IN_FLIGHT) -> None:
        self.limit = limit
        self._taken = 0
        self._lock = threading.Lock()

    def busy(self) -> DalBusyError:
        return DalBusyError(shared.ERRORS_BUSY_MESSAGE % self.limit)

    def full(self) -> bool:
        """Every slot is taken now (a write arriving now is refused)."""
        return self._taken >= self.limit

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Hold a slot for the write handled inside; raise ``DalBusyError`` when none is free."""
        with self._lock:
            if self._taken >= self.limit:
                raise self.busy()
            self._taken += 1
        try:
            yield
        finally:
            with self._lock:
                self._taken -= 1


class AdmissionInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Refuses a write as it arrives while ``admission`` is full, before gRPC reads its
    batch; first in the chain (the status it sends is the error interceptor's, by hand)."""

    def __init__(self, admission: WriteAdmission, metrics: Any = None) -> None:
        self.admission = admission
        self.metrics = metrics

    def intercept_service(self, continuation: Callable[[Any], Any], details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(details)
        if handler is None or details.method not in WRITE_METHODS or not self.admission.full():
            return handler
        from bulldozer.kv.server.interceptors import error_status

        method, metrics, refused = details.method.rsplit("/", 1)[-1], self.metrics, self.admission.busy()

        def refuse(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            # ``requests`` is never iterated: the batch is not read
            if metrics is not None:
                metrics.request(method, refused.grpc_code, 0.0)
            context.abort_with_status(error_status(refused))

        return grpc.stream_unary_rpc_method_handler(refuse, handler.request_deserializer, handler.response_serializer)
