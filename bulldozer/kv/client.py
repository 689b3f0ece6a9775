"""``KvClient``: the KV DAL's Python client.

* Talks to a server over gRPC (retries with backoff for UNAVAILABLE are declared in the
  channel's service config; every call has a deadline), or to a ``KvDal`` in the same
  process through :meth:`KvClient.in_process` — same interface, no network, for unit
  tests.
* Maps status codes back to the very exceptions the server raised.
* Never one RPC per record: :meth:`KvClient.writer` batches by count and bytes and keeps
  a bounded number of batches in flight.
"""

from __future__ import annotations

import getpass
import json
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import grpc

from bulldozer.errors import (
    BackendUnavailableError,
    BulldozerError,
    KvError,
    error_class_by_name,
)
from bulldozer.kv import convert
from bulldozer.kv.convert import ERROR_KEY, PRINCIPAL_KEY
from bulldozer.kv.types import AliasChange, AliasRecord, NamespaceRecord
from bulldozer.kv.v1 import kv_pb2, kv_pb2_grpc

__all__ = ["BatchWriter", "KvClient", "WriteStats"]

_CODE_TO_ERROR: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.INVALID_ARGUMENT: "InvalidArgumentError",
    grpc.StatusCode.NOT_FOUND: "NamespaceNotFoundError",
    grpc.StatusCode.ALREADY_EXISTS: "NamespaceExistsError",
    grpc.StatusCode.FAILED_PRECONDITION: "NamespaceStateError",
    grpc.StatusCode.ABORTED: "AliasConflictError",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "ResourceExhaustedError",
    grpc.StatusCode.UNAVAILABLE: "BackendUnavailableError",
    grpc.StatusCode.DEADLINE_EXCEEDED: "BackendUnavailableError",
    grpc.StatusCode.CANCELLED: "BackendUnavailableError",
    grpc.StatusCode.UNAUTHENTICATED: "UnauthenticatedError",
    grpc.StatusCode.PERMISSION_DENIED: "PermissionDeniedError",
}

_RETRY_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [
                    {"service": "bulldozer.kv.v1.KvData"},
                    {"service": "bulldozer.kv.v1.KvNamespaces"},
                    {"service": "bulldozer.kv.v1.KvAliases"},
                ],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


def translate(err: grpc.RpcError) -> BulldozerError:
    """The Bulldozer exception a failed call stands for."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    name = None
    trailing: Any = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == ERROR_KEY:
            name = str(value)
    cls = error_class_by_name(name) if name else None
    if cls is None:
        cls = error_class_by_name(_CODE_TO_ERROR.get(code, "KvError")) or KvError
    if (
        code
        in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.CANCELLED,
        )
        and name is None
    ):
        details = f"the KV DAL is not reachable ({code.name.lower()}): {details}"
    try:
        return cls(details or code.name)
    except TypeError:  # an error class with a richer constructor
        return KvError(details or code.name)


def _default_principal() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except Exception:  # no user database in some containers
        return "unknown"


@dataclass
class WriteStats:
    batches: int = 0
    records: int = 0
    bytes: int = 0


def _batch_get_result(response: kv_pb2.BatchGetResponse) -> tuple[str, list[bytes | None]]:
    """(the version read, each key's value or None)."""
    return response.namespace, [item.value if item.found else None for item in response.items]


class _GrpcTransport:
    def __init__(self, channel: grpc.Channel, metadata: list[tuple[str, str]]) -> None:
        self.channel = channel
        self.metadata = metadata
        self.data = kv_pb2_grpc.KvDataStub(channel)
        self.namespaces = kv_pb2_grpc.KvNamespacesStub(channel)
        self.aliases = kv_pb2_grpc.KvAliasesStub(channel)
        # PutBatch with the request already serialized (see bulldozer.kv.columnar); typed
        # Any: the stubs do not know the `_registered_method` flag generated code passes
        untyped: Any = channel
        self._put_batch_bytes: Any = untyped.unary_unary(
            "/bulldozer.kv.v1.KvData/PutBatch",
            request_serializer=None,
            response_deserializer=kv_pb2.PutBatchResponse.FromString,
            _registered_method=True,
        )
        self._gate: Callable[[], None] | None = None
        self._gate_lock = threading.RLock()

    def set_gate(self, gate: Callable[[], None]) -> None:
        """Run ``gate`` once, before the first call (e.g. wait for a server still starting)."""
        self._gate = gate

    def pass_gate(self) -> None:
        if self._gate is None:
            return
        with self._gate_lock:
            gate, self._gate = self._gate, None
            if gate is None:
                return
            try:
                gate()
            except BaseException:
                self._gate = gate  # the next call waits again
                raise

    def call(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        self.pass_gate()
        try:
            return getattr(stub, method)(request, timeout=timeout, metadata=self.metadata)
        except grpc.RpcError as err:
            raise translate(err) from None

    def future(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        self.pass_gate()
        return getattr(stub, method).future(request, timeout=timeout, metadata=self.metadata)

    def put_batch_future(self, payload: bytes, timeout: float) -> Any:
        """PutBatch of a request serialized by the caller."""
        self.pass_gate()
        return self._put_batch_bytes.future(payload, timeout=timeout, metadata=self.metadata)

    def stream(self, stub: Any, method: str, request: Any, timeout: float) -> Iterator[Any]:
        self.pass_gate()
        try:
            yield from getattr(stub, method)(request, timeout=timeout, metadata=self.metadata)
        except grpc.RpcError as err:
            raise translate(err) from None

    def close(self) -> None:
        self.channel.close()


class _LocalContext:
    """Enough of a ServicerContext for the in-process transport."""

    def __init__(self, principal: str) -> None:
        self._principal = principal

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return [(PRINCIPAL_KEY, self._principal)]

    def peer(self) -> str:
        return "in-process"


class _InProcessTransport:
    def __init__(self, dal: Any, principal: str) -> None:
        from bulldozer.kv.server.servicer import AliasesServicer, DataServicer, NamespacesServicer

        self.data = DataServicer(dal)
        self.namespaces = NamespacesServicer(dal)
        self.aliases = AliasesServicer(dal)
        self.context = _LocalContext(principal)

    def call(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        return getattr(stub, method)(request, self.context)

    def future(self, stub: Any, method: str, request: Any, timeout: float) -> Any:
        done: Future[Any] = Future()
        try:
            done.set_result(self.call(stub, method, request, timeout))
        except BulldozerError as exc:
            done.set_exception(exc)
        return done

    def put_batch_future(self, payload: bytes, timeout: float) -> Any:
        return self.future(self.data, "PutBatch", kv_pb2.PutBatchRequest.FromString(payload), timeout)

    def stream(self, stub: Any, method: str, request: Any, timeout: float) -> Iterator[Any]:
        return iter(getattr(stub, method)(request, self.context))

    def close(self) -> None:
        pass


class KvClient:
    """A client of one KV DAL."""

    def __init__(
        self,
        target: str,
        *,
        timeout: float = 30.0,
        principal: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        options = [
            ("grpc.enable_retries", 1),
            ("grpc.service_config", _RETRY_SERVICE_CONFIG),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        channel = (
            grpc.secure_channel(target, credentials, options=options)
            if credentials is not None
            else grpc.insecure_channel(target, options=options)
        )
        metadata = [(PRINCIPAL_KEY, principal or _default_principal())]
        if token:
            metadata.append(("authorization", f"Bearer {token}"))
        self.target = target
        #: which store this client acts on, as commands name it to the operator
        self.store = f"{target} (TLS)" if credentials is not None else target
        self.timeout = timeout
        self._t: Any = _GrpcTransport(channel, metadata)

    @classmethod
    def in_process(cls, dal: Any, principal: str = "in-process") -> KvClient:
        """A client calling ``dal`` directly (same interface, no network)."""
        client = cls.__new__(cls)
        client.target = client.store = "in-process"
        client.timeout = 30.0
        client._t = _InProcessTransport(dal, principal)
        return client

    def __enter__(self) -> KvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._t.close()

    def defer_until(self, gate: Callable[[], None]) -> None:
        """Run ``gate`` once before the first call, e.g. wait for a server that is still
        starting, so the caller can work meanwhile. A gate that raises is run again next call."""
        if isinstance(self._t, _GrpcTransport):
            self._t.set_gate(gate)

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until the server answers, or raise BackendUnavailableError."""
        if not isinstance(self._t, _GrpcTransport):
            return
        self._t.pass_gate()
        try:
            grpc.channel_ready_future(self._t.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise BackendUnavailableError(
                f"the KV DAL at {self.target} did not answer within {timeout:.0f} s"
            ) from None

    # -- namespaces -------------------------------------------------------------

    def _ns(self, method: str, request: Any, timeout: float | None = None) -> NamespaceRecord:
        return convert.record_from_info(self._t.call(self._t.namespaces, method, request, timeout or self.timeout))

    def create_namespace(
        self,
        name: str,
        alias: str,
        *,
        job_name: str = "",
        snapshot_id: int = 0,
        value_descriptor_set: bytes = b"",
        key_message: str = "",
        value_message: str = "",
        labels: dict[str, str] | None = None,
    ) -> NamespaceRecord:
        return self._ns(
            "CreateNamespace",
            kv_pb2.CreateNamespaceRequest(
                name=name,
                alias=alias,
                job_name=job_name,
                snapshot_id=snapshot_id,
                value_descriptor_set=value_descriptor_set,
                key_message=key_message,
                value_message=value_message,
                labels=labels or {},
            ),
        )

    def seal(
        self,
        name: str,
        expected_records: int,
        expected_digest: int,
        timeout: float = 3600.0,
    ) -> NamespaceRecord:
        """Freeze, measure and verify the version against what its loader sent: it becomes
        SEALED (and may go live) only when the stored count and digest equal these."""
        request = kv_pb2.SealNamespaceRequest(
            name=name, expected_records=expected_records, expected_digest=expected_digest
        )
        return self._ns("SealNamespace", request, timeout)

    def mark_failed(self, name: str, reason: str) -> NamespaceRecord:
        return self._ns("MarkFailed", kv_pb2.MarkFailedRequest(name=name, reason=reason))

    def drop(self, name: str) -> NamespaceRecord:
        return self._ns("DropNamespace", kv_pb2.DropNamespaceRequest(name=name), 600.0)

    def describe(self, name: str) -> NamespaceRecord:
        return self._ns("DescribeNamespace", kv_pb2.DescribeNamespaceRequest(name=name))

    def set_labels(self, name: str, labels: dict[str, str]) -> NamespaceRecord:
        return self._ns("SetLabels", kv_pb2.SetLabelsRequest(name=name, labels=labels))

    def list_namespaces(self, alias: str | None = None, page_size: int = 0) -> list[NamespaceRecord]:
        """Every namespace (of ``alias``), oldest first, read page by page."""
        out: list[NamespaceRecord] = []
        token = ""
        while True:
            response = self._t.call(
                self._t.namespaces,
                "ListNamespaces",
                kv_pb2.ListNamespacesRequest(alias=alias or "", page_size=page_size, page_token=token),
                self.timeout,
            )
            out += [convert.record_from_info(i) for i in response.namespaces]
            token = response.next_page_token
            if not token:
                return out

    # -- data -------------------------------------------------------------------

    def put(self, namespace: str, pairs: Sequence[tuple[bytes, bytes]]) -> tuple[int, int]:
        """One batch (idempotent)."""
        request = kv_pb2.PutBatchRequest(
            namespace=namespace, records=[kv_pb2.KeyValue(key=k, value=v) for k, v in pairs]
        )
        response = self._t.call(self._t.data, "PutBatch", request, self.timeout)
        return response.records, response.bytes

    def put_stream(
        self,
        namespace: str,
        batches: Iterable[Sequence[tuple[bytes, bytes]]],
        timeout: float = 3600.0,
    ) -> WriteStats:
        """Many batches on one client stream."""
        requests = (
            kv_pb2.PutBatchRequest(namespace=namespace, records=[kv_pb2.KeyValue(key=k, value=v) for k, v in batch])
            for batch in batches
        )
        if isinstance(self._t, _InProcessTransport):
            response = self._t.data.PutStream(requests, self._t.context)  # type: ignore[arg-type]
        else:
            try:
                response = self._t.data.PutStream(requests, timeout=timeout, metadata=self._t.metadata)
            except grpc.RpcError as err:
                raise translate(err) from None
        return WriteStats(response.batches, response.records, response.bytes)

    def writer(
        self,
        namespace: str,
        batch_records: int = 20_000,
        batch_bytes: int = 4 * 1024 * 1024,
        in_flight: int = 4,
    ) -> BatchWriter:
        return BatchWriter(self, namespace, batch_records, batch_bytes, in_flight)

    def _target(self, namespace: str | None, alias: str | None) -> kv_pb2.Target:
        if namespace:
            return kv_pb2.Target(namespace=namespace)
        return kv_pb2.Target(alias=alias or "")

    def get(self, key: bytes, *, alias: str | None = None, namespace: str | None = None) -> bytes | None:
        response = self._t.call(
            self._t.data,
            "Get",
            kv_pb2.GetRequest(target=self._target(namespace, alias), key=key),
            self.timeout,
        )
        return response.value if response.found else None

    def batch_get(
        self, keys: Sequence[bytes], *, alias: str | None = None, namespace: str | None = None
    ) -> tuple[str, list[bytes | None]]:
        """Values for ``keys`` — all from one version, whose name is returned too."""
        request = kv_pb2.BatchGetRequest(target=self._target(namespace, alias), keys=list(keys))
        return _batch_get_result(self._t.call(self._t.data, "BatchGet", request, self.timeout))

    def batch_get_many(
        self,
        key_lists: Iterable[Sequence[bytes]],
        *,
        alias: str | None = None,
        namespace: str | None = None,
        in_flight: int = 8,
    ) -> Iterator[tuple[str, list[bytes | None]]]:
        """``batch_get`` of each key list, with up to ``in_flight`` requests on the wire at
        once (results in order): for a consumer with many lookups to make, it hides the
        round trip. Each result comes from one version; with an alias, later results may
        come from a newer version if the alias flips meanwhile (each names its version)."""
        target = self._target(namespace, alias)
        pending: deque[Any] = deque()

        def result(future: Any) -> tuple[str, list[bytes | None]]:
            try:
                return _batch_get_result(future.result())
            except grpc.RpcError as err:
                raise translate(err) from None

        try:
            for keys in key_lists:
                request = kv_pb2.BatchGetRequest(target=target, keys=list(keys))
                pending.append(self._t.future(self._t.data, "BatchGet", request, self.timeout))
                if len(pending) >= max(1, in_flight):
                    yield result(pending.popleft())
            while pending:
                yield result(pending.popleft())
        finally:
            for future in pending:
                future.cancel()

    def scan_pages(
        self,
        *,
        alias: str | None = None,
        namespace: str | None = None,
        limit: int = 0,
        page_size: int = 1000,
        page_token: bytes = b"",
    ) -> Iterator[kv_pb2.ScanResponse]:
        request = kv_pb2.ScanRequest(
            target=self._target(namespace, alias),
            limit=limit,
            page_size=page_size,
            page_token=page_token,
        )
        yield from self._t.stream(self._t.data, "Scan", request, 3600.0)

    def scan(
        self,
        *,
        alias: str | None = None,
        namespace: str | None = None,
        limit: int = 0,
        page_size: int = 1000,
    ) -> Iterator[tuple[bytes, bytes]]:
        for page in self.scan_pages(alias=alias, namespace=namespace, limit=limit, page_size=page_size):
            for record in page.records:
                yield record.key, record.value

    # -- aliases ----------------------------------------------------------------

    def get_alias(self, alias: str) -> AliasRecord:
        info = self._t.call(self._t.aliases, "GetAlias", kv_pb2.GetAliasRequest(alias=alias), self.timeout)
        return _alias_record(info)

    def compare_and_set_alias(
        self, alias: str, expected: str | None, namespace: str, reason: str = "", respect_pin: bool = False
    ) -> AliasRecord:
        """Point ``alias`` at ``namespace`` if it still points at ``expected``. Runs pass
        ``respect_pin=True`` so an operator's pin holds them off."""
        request = kv_pb2.CompareAndSetAliasRequest(
            alias=alias, expected_namespace=expected or "", namespace=namespace, reason=reason, respect_pin=respect_pin
        )
        return _alias_record(self._t.call(self._t.aliases, "CompareAndSetAlias", request, self.timeout))

    def set_pin(self, alias: str, pinned: bool, reason: str = "") -> AliasRecord:
        request = kv_pb2.SetAliasPinRequest(alias=alias, pinned=pinned, reason=reason)
        return _alias_record(self._t.call(self._t.aliases, "SetAliasPin", request, self.timeout))

    def alias_history(self, alias: str, limit: int = 100) -> list[AliasChange]:
        response = self._t.call(
            self._t.aliases,
            "AliasHistory",
            kv_pb2.AliasHistoryRequest(alias=alias, limit=limit),
            self.timeout,
        )
        from datetime import UTC

        return [
            AliasChange(
                alias,
                c.time.ToDatetime(tzinfo=UTC),
                c.principal,
                c.reason,
                c.from_namespace,
                c.to_namespace,
                c.generation,
            )
            for c in response.changes
        ]

    def list_aliases(self) -> list[AliasRecord]:
        response = self._t.call(self._t.aliases, "ListAliases", kv_pb2.ListAliasesRequest(), self.timeout)
        return [_alias_record(a) for a in response.aliases]


def _alias_record(info: kv_pb2.AliasInfo) -> AliasRecord:
    from datetime import UTC

    return AliasRecord(info.alias, info.namespace, info.updated.ToDatetime(tzinfo=UTC), info.generation, info.pinned)


class BatchWriter:
    """Batches records by count and bytes, with a bounded number of batches in flight.

    Use as a context manager; leaving it flushes and waits for every acknowledgement
    (raising the first error). ``stats`` holds what the DAL acknowledged.
    """

    def __init__(self, client: KvClient, namespace: str, batch_records: int, batch_bytes: int, in_flight: int) -> None:
        self.client = client
        self.namespace = namespace
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.in_flight = max(1, in_flight)
        self.stats = WriteStats()
        self._pending: deque[Any] = deque()
        self._keys: list[bytes] = []
        self._values: list[bytes] = []
        self._size = 0

    def __enter__(self) -> BatchWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._drain(raise_errors=False)

    def add(self, key: bytes, value: bytes) -> None:
        self._keys.append(key)
        self._values.append(value)
        self._size += len(key) + len(value)
        if len(self._keys) >= self.batch_records or self._size >= self.batch_bytes:
            self.flush()

    def add_many(self, pairs: Iterable[tuple[bytes, bytes]]) -> None:
        for key, value in pairs:
            self.add(key, value)

    def add_arrays(self, keys: Any, values: Any) -> None:
        """Add the pairs held in two Arrow binary arrays (the encoder's output), sending
        their buffers column-wise without a Python object per record."""
        import numpy as np
        import pyarrow as pa

        from bulldozer.kv.columnar import batch_bounds, put_batch_request

        self.flush()
        keys = keys.cast(pa.large_binary()) if keys.type != pa.large_binary() else keys
        values = values.cast(pa.large_binary()) if values.type != pa.large_binary() else values
        n = len(keys)
        koff = np.frombuffer(keys.buffers()[1], dtype=np.int64)[keys.offset : keys.offset + n + 1]
        voff = np.frombuffer(values.buffers()[1], dtype=np.int64)[values.offset : values.offset + n + 1]
        kdata = keys.buffers()[2]
        vdata = values.buffers()[2]
        kbuf = memoryview(kdata) if kdata is not None else memoryview(b"")
        vbuf = memoryview(vdata) if vdata is not None else memoryview(b"")
        for start, end in batch_bounds(np.diff(koff) + np.diff(voff), self.batch_records, self.batch_bytes):
            payload = put_batch_request(
                self.namespace,
                kbuf[koff[start] : koff[end]],
                np.diff(koff[start : end + 1]),
                vbuf[voff[start] : voff[end]],
                np.diff(voff[start : end + 1]),
            )
            self._send(payload)

    def flush(self) -> None:
        if not self._keys:
            return
        from bulldozer.kv.columnar import put_batch_request  # numpy: imported on first use

        payload = put_batch_request(
            self.namespace,
            b"".join(self._keys),
            [len(k) for k in self._keys],
            b"".join(self._values),
            [len(v) for v in self._values],
        )
        self._keys, self._values, self._size = [], [], 0
        self._send(payload)

    def _send(self, payload: bytes) -> None:
        """Send one serialized PutBatchRequest, once fewer than ``in_flight`` are unanswered."""
        while len(self._pending) >= self.in_flight:
            self._wait_one()
        self._pending.append(self.client._t.put_batch_future(payload, self.client.timeout))

    def sent_so_far(self) -> Callable[[], None]:
        """Send what is buffered; return a function that blocks (in any thread) until every
        batch sent up to now is acknowledged, raising the first failure. Unlike ``sync``, the
        writer goes on sending meanwhile (a caller records progress without a pause)."""
        self.flush()
        futures = list(self._pending)

        def wait() -> None:
            for future in futures:
                _acknowledgement(future)

        return wait

    def _wait_one(self) -> None:
        response = _acknowledgement(self._pending.popleft())
        self.stats.batches += 1
        self.stats.records += response.records
        self.stats.bytes += response.bytes

    def _drain(self, raise_errors: bool = True) -> None:
        first: BaseException | None = None
        while self._pending:
            try:
                self._wait_one()
            except BaseException as exc:
                first = first or exc
        if first is not None and raise_errors:
            raise first

    def sync(self) -> WriteStats:
        """Send what is buffered and wait until every batch is acknowledged."""
        self.flush()
        self._drain()
        return self.stats

    def close(self) -> WriteStats:
        return self.sync()


def _acknowledgement(future: Any) -> Any:
    """A sent batch's response, or its failure as the exception tree's error."""
    try:
        return future.result()
    except grpc.RpcError as err:
        raise translate(err) from None
