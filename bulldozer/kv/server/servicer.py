"""The gRPC servicers: translate API messages to :class:`~bulldozer.kv.server.rules.KvDal` calls.

They raise Bulldozer errors; the error interceptor turns those into status codes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc

from bulldozer.kv import convert
from bulldozer.kv.convert import PRINCIPAL_KEY
from bulldozer.kv.server.rules import KvDal
from bulldozer.kv.types import utcnow
from bulldozer.kv.v1 import kv_pb2, kv_pb2_grpc, shared

__all__ = ["AliasesServicer", "DataServicer", "NamespacesServicer", "principal_of"]


def principal_of(context: Any) -> str:
    """Who is calling: the authenticated principal if an auth layer set one, else the
    principal the client asserts, else its peer address."""
    authenticated = getattr(context, "bulldozer_principal", None)
    if authenticated:
        return str(authenticated)
    for key, value in context.invocation_metadata() or ():
        if key == PRINCIPAL_KEY and value:
            return f"{value[:200]} (unauthenticated)"
    return str(context.peer() or "unknown")


def _target(target: kv_pb2.Target) -> dict[str, Any]:
    which = target.WhichOneof("target")
    out: dict[str, Any] = (
        {"namespace": target.namespace} if which == "namespace" else {"alias": target.alias if which else ""}
    )
    if target.schema_generation:
        out["schema_generation"] = target.schema_generation
    return out


class DataServicer(kv_pb2_grpc.KvDataServicer):
    def __init__(self, dal: KvDal, metrics: Any = None) -> None:
        self.dal = dal
        self.metrics = metrics

    def _put(self, request: kv_pb2.PutBatchRequest) -> tuple[int, int]:
        count = nbytes = 0
        if request.records or not request.HasField("columnar"):
            count, nbytes = self.dal.put(request.namespace, [(r.key, r.value) for r in request.records])
        if request.HasField("columnar"):
            c = request.columnar
            more, size = self.dal.put_columnar(request.namespace, c.keys, c.key_lengths, c.values, c.value_lengths)
            count, nbytes = count + more, nbytes + size
        if self.metrics is not None:
            self.metrics.written(request.namespace, count, nbytes)
        return count, nbytes

    def PutBatch(self, request: kv_pb2.PutBatchRequest, context: grpc.ServicerContext) -> kv_pb2.PutBatchResponse:
        count, nbytes = self._put(request)
        return kv_pb2.PutBatchResponse(records=count, bytes=nbytes)

    def PutStream(
        self, request_iterator: Iterator[kv_pb2.PutBatchRequest], context: grpc.ServicerContext
    ) -> kv_pb2.PutStreamResponse:
        batches = records = nbytes = 0
        for request in request_iterator:
            count, size = self._put(request)
            batches, records, nbytes = batches + 1, records + count, nbytes + size
        return kv_pb2.PutStreamResponse(batches=batches, records=records, bytes=nbytes)

    def Ingest(self, request: kv_pb2.IngestRequest, context: grpc.ServicerContext) -> kv_pb2.IngestResponse:
        runs, records = self.dal.ingest(request.namespace)
        return kv_pb2.IngestResponse(runs=runs, records=records)

    def Get(self, request: kv_pb2.GetRequest, context: grpc.ServicerContext) -> kv_pb2.GetResponse:
        name, (value,) = self.dal.batch_get([request.key], **_target(request.target))
        return kv_pb2.GetResponse(found=value is not None, value=value or b"", namespace=name)

    def BatchGet(self, request: kv_pb2.BatchGetRequest, context: grpc.ServicerContext) -> kv_pb2.BatchGetResponse:
        name, values = self.dal.batch_get(list(request.keys), **_target(request.target))
        items = [kv_pb2.BatchGetResponse.Item(found=v is not None, value=v or b"") for v in values]
        return kv_pb2.BatchGetResponse(namespace=name, items=items)

    def Delete(self, request: kv_pb2.DeleteRequest, context: grpc.ServicerContext) -> kv_pb2.DeleteResponse:
        return kv_pb2.DeleteResponse(deleted=self.dal.delete(request.namespace, list(request.keys)))

    def Sample(self, request: kv_pb2.SampleRequest, context: grpc.ServicerContext) -> kv_pb2.SampleResponse:
        name, records, scanned = self.dal.sample(request.count, request.seed, **_target(request.target))
        return kv_pb2.SampleResponse(
            namespace=name, records=[kv_pb2.KeyValue(key=k, value=v) for k, v in records], scanned=scanned
        )

    def Scan(self, request: kv_pb2.ScanRequest, context: grpc.ServicerContext) -> Iterator[kv_pb2.ScanResponse]:
        target = _target(request.target)
        after: bytes | None = None
        if request.page_token:
            raw_name, sep, last = request.page_token.partition(b"\x00")
            if not sep:
                from bulldozer.errors import InvalidArgumentError

                raise InvalidArgumentError("malformed page token")
            pinned = raw_name.decode("ascii", "replace")
            if "alias" in target:
                alias = target["alias"].partition("@")[0]
                target = {"alias": f"{alias}@{pinned}"}  # stay on the version the scan started on
            else:
                target = {"namespace": pinned}
            after = last
        remaining = request.limit or None
        page = min(request.page_size or shared.LIMITS_DEFAULT_SCAN_PAGE, self.dal.limits.max_scan_page)
        while True:
            want = page if remaining is None else min(page, remaining)
            name, records = self.dal.scan(after=after, limit=want, **target)
            target = (
                {"namespace": name}
                if "namespace" in target
                else {"alias": f"{target['alias'].partition('@')[0]}@{name}"}
            )
            if remaining is not None:
                remaining -= len(records)
            done = len(records) < want or remaining == 0
            token = b"" if done or not records else name.encode() + b"\x00" + records[-1][0]
            if request.columnar:
                yield kv_pb2.ScanResponse(namespace=name, columnar=convert.columnar(records), next_page_token=token)
            else:
                yield kv_pb2.ScanResponse(
                    namespace=name,
                    records=[kv_pb2.KeyValue(key=k, value=v) for k, v in records],
                    next_page_token=token,
                )
            if done:
                return
            after = records[-1][0]


class NamespacesServicer(kv_pb2_grpc.KvNamespacesServicer):
    def __init__(self, dal: KvDal) -> None:
        self.dal = dal

    def CreateNamespace(
        self, request: kv_pb2.CreateNamespaceRequest, context: grpc.ServicerContext
    ) -> kv_pb2.NamespaceInfo:
        record = self.dal.create_namespace(
            request.name,
            request.alias,
            job_name=request.job_name,
            snapshot_id=request.snapshot_id,
            value_descriptor_set=request.value_descriptor_set,
            key_message=request.key_message,
            value_message=request.value_message,
            labels=dict(request.labels),
            schema_generation=request.schema_generation or 1,
            base=request.base,
        )
        return convert.namespace_info(record)

    def SealNamespace(
        self, request: kv_pb2.SealNamespaceRequest, context: grpc.ServicerContext
    ) -> kv_pb2.NamespaceInfo:
        expected_records = request.expected_records if request.HasField("expected_records") else None
        expected_digest = request.expected_digest if request.HasField("expected_digest") else None
        return convert.namespace_info(self.dal.seal(request.name, expected_records, expected_digest))

    def MarkFailed(self, request: kv_pb2.MarkFailedRequest, context: grpc.ServicerContext) -> kv_pb2.NamespaceInfo:
        return convert.namespace_info(self.dal.mark_failed(request.name, request.reason))

    def DropNamespace(
        self, request: kv_pb2.DropNamespaceRequest, context: grpc.ServicerContext
    ) -> kv_pb2.NamespaceInfo:
        return convert.namespace_info(self.dal.drop(request.name))

    def DescribeStore(self, request: kv_pb2.DescribeStoreRequest, context: grpc.ServicerContext) -> kv_pb2.StoreInfo:
        info = convert.store_info(self.dal.store_info())
        info.now.CopyFrom(convert.timestamp(utcnow()))  # the clock a client reads ages on (KvClient.now)
        return info

    def DescribeNamespace(
        self, request: kv_pb2.DescribeNamespaceRequest, context: grpc.ServicerContext
    ) -> kv_pb2.NamespaceInfo:
        if request.HasField("target"):
            if request.name:
                from bulldozer.errors import InvalidArgumentError

                raise InvalidArgumentError("describe a namespace by its name or by a read target, not both")
            return convert.namespace_info(self.dal.describe(self.dal.resolve(**_target(request.target))))
        return convert.namespace_info(self.dal.describe(request.name))

    def ListNamespaces(
        self, request: kv_pb2.ListNamespacesRequest, context: grpc.ServicerContext
    ) -> kv_pb2.ListNamespacesResponse:
        records, next_token = self.dal.list_namespaces_page(
            request.alias or None, request.page_size, request.page_token, convert.states_of(request.states)
        )
        budget = self.dal.limits.max_message_bytes // 2
        response = kv_pb2.ListNamespacesResponse(next_page_token=next_token)
        size = 0
        for i, record in enumerate(records):
            info = convert.namespace_info(record)
            size += info.ByteSize() + 8
            if i and size > budget:  # the rest on the next page (a page holds one at least)
                response.next_page_token = KvDal.page_token(records[i - 1])
                break
            response.namespaces.append(info)
        return response

    def SetLabels(self, request: kv_pb2.SetLabelsRequest, context: grpc.ServicerContext) -> kv_pb2.NamespaceInfo:
        return convert.namespace_info(self.dal.set_labels(request.name, dict(request.labels)))


class AliasesServicer(kv_pb2_grpc.KvAliasesServicer):
    def __init__(self, dal: KvDal) -> None:
        self.dal = dal

    def GetAlias(self, request: kv_pb2.GetAliasRequest, context: grpc.ServicerContext) -> kv_pb2.AliasInfo:
        return convert.alias_info(self.dal.get_alias(request.alias))

    def CompareAndSetAlias(
        self, request: kv_pb2.CompareAndSetAliasRequest, context: grpc.ServicerContext
    ) -> kv_pb2.AliasInfo:
        record = self.dal.compare_and_set_alias(
            request.alias,
            request.expected_namespace,
            request.namespace,
            principal_of(context),
            request.reason,
            request.respect_pin,
        )
        return convert.alias_info(record)

    def SetAliasPin(self, request: kv_pb2.SetAliasPinRequest, context: grpc.ServicerContext) -> kv_pb2.AliasInfo:
        record = self.dal.set_pin(request.alias, request.pinned, principal_of(context), request.reason)
        return convert.alias_info(record)

    def AliasHistory(
        self, request: kv_pb2.AliasHistoryRequest, context: grpc.ServicerContext
    ) -> kv_pb2.AliasHistoryResponse:
        changes = self.dal.alias_history(request.alias, request.limit or 100)
        return kv_pb2.AliasHistoryResponse(changes=[convert.alias_change(c) for c in changes])

    def ListAliases(
        self, request: kv_pb2.ListAliasesRequest, context: grpc.ServicerContext
    ) -> kv_pb2.ListAliasesResponse:
        return kv_pb2.ListAliasesResponse(aliases=[convert.alias_info(a) for a in self.dal.list_aliases()])
