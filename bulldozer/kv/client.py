"""``KvClient``: the KV DAL's Python client — the API only.

* It talks to one small transport interface (``bulldozer.kv._transports``): gRPC (retries
  with backoff for UNAVAILABLE in the channel's service config, a deadline on every call),
  or a ``KvDal`` in the same process through :meth:`KvClient.in_process` — same interface,
  no network — or both for a DAL this process hosts behind its data plane
  (:meth:`KvClient.hosted`), or any transport a test brings (:meth:`KvClient.over`).
* Failed calls raise the very exceptions the server raised.
* Never one RPC per record: :meth:`KvClient.writer` (``bulldozer.kv._writer``) batches by
  count and bytes and keeps a bounded number of batches in flight.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc

from bulldozer.errors import DalBusyError
from bulldozer.kv import convert
from bulldozer.kv._transports import GrpcTransport, HostedTransport, InProcessTransport, Transport, translate
from bulldozer.kv._writer import BatchWriter, ReplayableStream, WriteStats, sent_again_while_busy
from bulldozer.kv.convert import PRINCIPAL_KEY
from bulldozer.kv.types import AliasChange, AliasRecord, NamespaceRecord, State, StoreInfo, utcnow
from bulldozer.kv.v1 import kv_pb2

if TYPE_CHECKING:
    from bulldozer.kv.tls import TlsMaterial

__all__ = ["BatchWriter", "KvClient", "WriteStats"]

#: how long ``KvClient.now`` takes the DAL's clock to be as far from this machine's as it
#: measured, before it asks again
CLOCK_OFFSET_SECONDS = 600.0
#: clocks further apart than this are said in a warning (``KvClient.now``): machines that keep
#: time (NTP) are milliseconds apart
CLOCK_SKEW_WARNING_SECONDS = 30.0


def _default_principal() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except Exception:  # no user database in some containers
        return "unknown"


def _batch_get_result(response: kv_pb2.BatchGetResponse) -> tuple[str, list[bytes | None]]:
    """(the version read, each key's value or None)."""
    return response.namespace, [item.value if item.found else None for item in response.items]


class _StoreAnswer(NamedTuple):
    """A ``DescribeStore`` answer (None: a DAL too old for the call), the moment it was
    given on this machine's clock (half way through the call) and when it came
    (``time.monotonic``)."""

    info: kv_pb2.StoreInfo | None
    given: datetime
    at: float


class KvClient:
    """A client of one KV DAL."""

    #: how far the DAL's clock is ahead of this machine's (``now``), and when it was measured
    #: (``time.monotonic``)
    _dal_offset: tuple[timedelta, float] | None = None
    #: the DAL's last ``DescribeStore`` answer (``_store_info``)
    _store_said: _StoreAnswer | None = None

    def __init__(
        self,
        target: str,
        *,
        timeout: float = 30.0,
        principal: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
        tls: TlsMaterial | None = None,
    ) -> None:
        """``tls``: client TLS as its PEM files' bytes (CA, certificate, key), the channel's
        credentials made of them (instead of ``credentials``); the client can then tell a DAL
        that refuses its certificate at once."""
        if tls is not None and credentials is None:
            from bulldozer.kv.tls import material_credentials

            credentials = material_credentials(tls)
        metadata = [(PRINCIPAL_KEY, principal or _default_principal())]
        if token:
            metadata.append(("authorization", f"Bearer {token}"))
        self.target = target
        #: the bearer token and TLS this client sends with (for a Spark job's executors); ``tls``
        #: the PEM files' bytes, when the client was made of them
        self.token, self.credentials, self.tls = token, credentials, tls
        #: which store this client acts on, as commands name it to the operator
        self.store = f"{target} (TLS)" if credentials is not None else target
        self.timeout = timeout
        self._t: Transport = GrpcTransport(target, metadata, credentials, max_message_bytes, tls)

    @classmethod
    def in_process(cls, dal: Any, principal: str = "in-process") -> KvClient:
        """A client calling ``dal`` directly (same interface, no network)."""
        client = cls.__new__(cls)
        client.target = client.store = "in-process"
        client.token, client.credentials, client.tls = None, None, None
        client.timeout = 30.0
        client._t = InProcessTransport(dal, principal)
        return client

    @classmethod
    def hosted(
        cls, target: str, dal: Callable[[], Any], *, timeout: float = 30.0, token: str | None = None
    ) -> KvClient:
        """A client of a DAL this process hosts behind its data plane at ``target``
        (``bulldozer.kv.connect.HostedDal``): data calls go to ``target``, namespace and
        alias calls to the ``KvDal`` that ``dal`` returns once the DAL has started
        (``HostedTransport``)."""
        client = cls(target, timeout=timeout, token=token)
        wire = client._t
        assert isinstance(wire, GrpcTransport)
        principal = next(value for key, value in wire.metadata if key == PRINCIPAL_KEY)
        client._t = HostedTransport(wire, dal, principal)
        return client

    @classmethod
    def over(cls, transport: Transport, store: str, timeout: float = 30.0) -> KvClient:
        """A client over ``transport`` (e.g. a test's, failing on demand)."""
        client = cls.__new__(cls)
        client.target = client.store = store
        client.timeout = timeout
        client._t = transport
        return client

    @property
    def transport(self) -> Transport:
        """How this client reaches its DAL."""
        return self._t

    def __enter__(self) -> KvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._t.close()

    def defer_until(self, gate: Callable[[], None]) -> None:
        """Run ``gate`` once before the first call, e.g. wait for a server that is still
        starting, so the caller can work meanwhile. A gate that raises is run again next call."""
        self._t.set_gate(gate)

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until the server answers, or raise BackendUnavailableError."""
        self._t.wait_ready(timeout)

    # -- namespaces -------------------------------------------------------------

    def _store_info(self) -> _StoreAnswer:
        """``DescribeStore``'s answer (its ``info`` None from a DAL too old to have the
        call): the client's last one while it is at most ``CLOCK_OFFSET_SECONDS`` old. Asked
        one call at a time: a caller that finds one in flight (a run's heartbeat asking for
        the clock as its load asks for the limits) waits for its answer."""
        from bulldozer.errors import UnimplementedError

        lock = self.__dict__.get("_store_lock") or self.__dict__.setdefault("_store_lock", threading.Lock())
        with lock:
            said = self._store_said
            if said is not None and time.monotonic() - said.at <= CLOCK_OFFSET_SECONDS:
                return said
            before = utcnow()
            try:
                info: kv_pb2.StoreInfo | None = self._t.call(
                    self._t.namespaces, "DescribeStore", kv_pb2.DescribeStoreRequest(), self.timeout
                )
            except UnimplementedError:
                info = None
            after = utcnow()
            said = self._store_said = _StoreAnswer(info, before + (after - before) / 2, time.monotonic())
            return said

    def describe_store(self) -> StoreInfo | None:
        """The engine behind the DAL and how it copies a base; None from a DAL too old to say
        (or naming a kind of copy this client does not know). The client's last answer when
        it is at most ``CLOCK_OFFSET_SECONDS`` old: a run asks for its clock (``now``, its
        heartbeat's first beat) as its load asks for its limits, and a warm delta's control
        calls are one after the other (≈ 2 ms each of its ≈ 38 ms of them)."""
        info = self._store_info().info
        return None if info is None else convert.store_info_from(info)

    def now(self) -> datetime:
        """The DAL's clock now: this machine's, moved by how far the DAL's is ahead of it, as
        ``DescribeStore`` said (its answer taken as given half way through the call; asked
        again after ``CLOCK_OFFSET_SECONDS``, as either clock may be set right meanwhile).
        The ages of what the store records — a run's heartbeat, a state change — are read on
        it, so a runner and a ``gc`` on machines whose clocks disagree agree on them (one
        minutes behind took a live run for a dead one). This machine's own clock when the DAL
        does not say (an older release); a DAL that does not answer raises, as any call."""
        known = self._dal_offset
        if known is None or time.monotonic() - known[1] > CLOCK_OFFSET_SECONDS:
            answer = self._store_info()  # one describe_store took serves too
            info = answer.info
            said = info.now.ToDatetime(tzinfo=UTC) if info is not None and info.HasField("now") else None
            offset = timedelta(0) if said is None else said - answer.given
            known = self._dal_offset = (offset, answer.at)
            if abs(offset.total_seconds()) > CLOCK_SKEW_WARNING_SECONDS:
                logging.getLogger("bulldozer.kv.client").warning(
                    "this machine's clock is %.0f s %s the clock of the KV DAL at %s: heartbeats and ages are told "
                    "on the DAL's clock, but have this machine keep time (NTP)",
                    abs(offset.total_seconds()),
                    "behind" if offset > timedelta(0) else "ahead of",
                    self.store,
                )
        return utcnow() + known[0]

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
        schema_generation: int = 1,
        base: str = "",
    ) -> NamespaceRecord:
        """A new LOADING version; with ``base``, holding that version's records from the start
        (the DAL copies them, so the call may take as long as a copy: no short timeout)."""
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
                schema_generation=schema_generation,
                base=base,
            ),
            3600.0 if base else None,
        )

    def seal(
        self,
        name: str,
        expected_records: int,
        expected_digest: int,
        timeout: float = 3600.0,
    ) -> NamespaceRecord:
        """Freeze, measure and verify the version against what its loader sent: it becomes
        SEALED (and may go live) only when the stored count and digest equal these.

        What the writes staged is ingested first (``ingest``), on the data plane's fast
        path. The seal ingests whatever is left itself, so an ingest that is refused (an
        unknown or FAILED version...) leaves the answer to the seal, whose error is the
        canonical one."""
        from bulldozer.errors import BulldozerError

        with contextlib.suppress(BulldozerError):
            self.ingest(name, timeout)
        request = kv_pb2.SealNamespaceRequest(
            name=name, expected_records=expected_records, expected_digest=expected_digest
        )
        return self._ns("SealNamespace", request, timeout)

    def ingest(self, name: str, timeout: float = 3600.0) -> tuple[int, int]:
        """Make what a LOADING version's writes staged part of its data (merged in key order
        by an engine that stages, such as embedded); returns (runs, records) merged."""
        response = self._t.call(self._t.data, "Ingest", kv_pb2.IngestRequest(namespace=name), timeout)
        return int(response.runs), int(response.records)

    def mark_failed(self, name: str, reason: str, timeout: float | None = None) -> NamespaceRecord:
        return self._ns("MarkFailed", kv_pb2.MarkFailedRequest(name=name, reason=reason), timeout)

    def drop(self, name: str) -> NamespaceRecord:
        return self._ns("DropNamespace", kv_pb2.DropNamespaceRequest(name=name), 600.0)

    def describe(self, name: str) -> NamespaceRecord:
        return self._ns("DescribeNamespace", kv_pb2.DescribeNamespaceRequest(name=name))

    def describe_target(self, alias: str) -> NamespaceRecord:
        """The version a read of ``alias`` addresses: ``ALIAS`` (its live version) or
        ``ALIAS@VERSION``, VERSION the full name or a unique suffix (``e10890``)."""
        target = kv_pb2.Target(alias=alias)
        return self._ns("DescribeNamespace", kv_pb2.DescribeNamespaceRequest(target=target))

    def set_labels(self, name: str, labels: dict[str, str], timeout: float | None = None) -> NamespaceRecord:
        return self._ns("SetLabels", kv_pb2.SetLabelsRequest(name=name, labels=labels), timeout)

    def list_namespaces(
        self, alias: str | None = None, page_size: int = 0, states: Iterable[State] = ()
    ) -> list[NamespaceRecord]:
        """Every namespace (of ``alias``; in one of ``states``, if any are named), oldest
        first, read page by page. The states are checked here too: a DAL older than the
        request's ``states`` field lists every namespace."""
        out: list[NamespaceRecord] = []
        token = ""
        chosen = frozenset(states)
        wanted = convert.state_numbers(chosen)
        while True:
            response = self._t.call(
                self._t.namespaces,
                "ListNamespaces",
                kv_pb2.ListNamespacesRequest(alias=alias or "", page_size=page_size, page_token=token, states=wanted),
                self.timeout,
            )
            out += [convert.record_from_info(i) for i in response.namespaces]
            token = response.next_page_token
            if not token:
                return [r for r in out if r.state in chosen] if chosen else out

    # -- data -------------------------------------------------------------------

    def put(self, namespace: str, pairs: Sequence[tuple[bytes, bytes]]) -> tuple[int, int]:
        """One batch (idempotent); sent again while the DAL is busy (``BatchWriter``'s rule)."""
        request = kv_pb2.PutBatchRequest(
            namespace=namespace, records=[kv_pb2.KeyValue(key=k, value=v) for k, v in pairs]
        )
        try:
            response = self._t.call(self._t.data, "PutBatch", request, self.timeout)
        except DalBusyError:
            response = sent_again_while_busy(lambda: self._t.call(self._t.data, "PutBatch", request, self.timeout))
        return response.records, response.bytes

    def put_stream(
        self,
        namespace: str,
        batches: Iterable[Sequence[tuple[bytes, bytes]]],
        timeout: float = 3600.0,
    ) -> WriteStats:
        """Many batches on one client stream; sent again from its start while the DAL refuses
        it as busy (as ``BatchWriter`` sends a batch again), its first batches kept for that
        (``ReplayableStream``)."""

        def request(batch: Sequence[tuple[bytes, bytes]]) -> kv_pb2.PutBatchRequest:
            records = [kv_pb2.KeyValue(key=k, value=v) for k, v in batch]
            return kv_pb2.PutBatchRequest(namespace=namespace, records=records)

        stream = ReplayableStream(batches, request)

        def send() -> Any:
            return self._t.client_stream(self._t.data, "PutStream", stream.requests(), timeout)

        try:
            response = send()
        except DalBusyError:
            if not stream.replayable:
                raise
            response = sent_again_while_busy(send, again=lambda: stream.replayable)
        return WriteStats(response.batches, response.records, response.bytes)

    def writer(
        self,
        namespace: str,
        batch_records: int = 20_000,
        batch_bytes: int = 4 * 1024 * 1024,
        in_flight: int = 4,
    ) -> BatchWriter:
        return BatchWriter(self, namespace, batch_records, batch_bytes, in_flight)

    def _target(self, namespace: str | None, alias: str | None, schema_generation: int = 0) -> kv_pb2.Target:
        if namespace:
            return kv_pb2.Target(namespace=namespace, schema_generation=schema_generation)
        return kv_pb2.Target(alias=alias or "", schema_generation=schema_generation)

    def get(
        self, key: bytes, *, alias: str | None = None, namespace: str | None = None, schema_generation: int = 0
    ) -> bytes | None:
        """The value of ``key``; with ``schema_generation``, refused (SchemaMismatchError) by
        a version of another generation."""
        response = self._t.call(
            self._t.data,
            "Get",
            kv_pb2.GetRequest(target=self._target(namespace, alias, schema_generation), key=key),
            self.timeout,
        )
        return response.value if response.found else None

    def batch_get(
        self,
        keys: Sequence[bytes],
        *,
        alias: str | None = None,
        namespace: str | None = None,
        schema_generation: int = 0,
    ) -> tuple[str, list[bytes | None]]:
        """Values for ``keys`` — all from one version, whose name is returned too."""
        request = kv_pb2.BatchGetRequest(target=self._target(namespace, alias, schema_generation), keys=list(keys))
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
        requests = (kv_pb2.BatchGetRequest(target=target, keys=list(keys)) for keys in key_lists)
        with contextlib.closing(self._pipelined("BatchGet", requests, in_flight, self.timeout)) as responses:
            for response in responses:  # a caller stopping early cancels what is on the wire
                yield _batch_get_result(response)

    def delete(self, namespace: str, keys: Sequence[bytes], chunk: int = 10_000, in_flight: int = 2) -> int:
        """Delete ``keys`` from a LOADING version (in requests of ``chunk`` keys, ``in_flight``
        of them at once); returns how many were there."""
        requests = (
            kv_pb2.DeleteRequest(namespace=namespace, keys=list(keys[start : start + chunk]))
            for start in range(0, len(keys), chunk)
        )
        return sum(int(response.deleted) for response in self._pipelined("Delete", requests, in_flight, 600.0))

    def _pipelined(
        self, method: str, requests: Iterable[Any], in_flight: int, timeout: float
    ) -> Generator[Any, None, None]:
        """The responses of data-plane call ``method`` for each request, in order, with up to
        ``in_flight`` requests on the wire at once; the first failure is raised as the
        exception tree's error, and the requests still unanswered are cancelled."""
        pending: deque[Any] = deque()

        def response(future: Any) -> Any:
            try:
                return future.result()
            except grpc.RpcError as err:
                raise translate(err) from None

        try:
            for request in requests:
                pending.append(self._t.future(self._t.data, method, request, timeout))
                if len(pending) >= max(1, in_flight):
                    yield response(pending.popleft())
            while pending:
                yield response(pending.popleft())
        finally:
            for future in pending:
                future.cancel()

    def sample(
        self, count: int, seed: int = 0, *, alias: str | None = None, namespace: str | None = None
    ) -> tuple[str, list[tuple[bytes, bytes]], int]:
        """The ``count`` records of one version whose keys hash smallest under ``seed`` (the same
        keys in any version that holds them), the version's name, and how many records it holds."""
        request = kv_pb2.SampleRequest(target=self._target(namespace, alias), count=count, seed=seed)
        response = self._t.call(self._t.data, "Sample", request, 3600.0)
        return response.namespace, [(r.key, r.value) for r in response.records], response.scanned

    def scan_pages(
        self,
        *,
        alias: str | None = None,
        namespace: str | None = None,
        limit: int = 0,
        page_size: int = 1000,
        page_token: bytes = b"",
        columnar: bool = False,
    ) -> Iterator[kv_pb2.ScanResponse]:
        """The scan's pages; ``columnar`` asks for each page's records in its ``columnar``
        field (a server that predates it sends ``records``: read whichever a page holds)."""
        request = kv_pb2.ScanRequest(
            target=self._target(namespace, alias),
            limit=limit,
            page_size=page_size,
            page_token=page_token,
            columnar=columnar,
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
