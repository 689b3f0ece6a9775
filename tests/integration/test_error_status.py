"""Errors travel as standard ``google.rpc.Status`` details: an ``ErrorInfo`` whose reason
names the exception class the server raised, the same from the Python data plane and
through the Go one (bulldozer-kvd), so any gRPC client can read them and the Python
client raises the very same class."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from bulldozer.errors import NamespaceNotFoundError, NamespaceStateError
from bulldozer.kv import KvClient, create_engine, create_server
from bulldozer.kv.convert import ERROR_DOMAIN
from bulldozer.kv.v1 import kv_pb2, kv_pb2_grpc
from bulldozer.names import new_version_name

pytestmark = pytest.mark.integration


def _error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None, "no google.rpc.Status in the trailer"
    (detail,) = status.details
    info = error_details_pb2.ErrorInfo()
    assert detail.Unpack(info)
    assert status.message == err.details()
    return info


@pytest.mark.parametrize("plane", ["python", "native"])
def test_a_refused_call_carries_its_exception_class_as_error_info(plane: str, tmp_path: Path) -> None:
    engine = create_engine({"type": "embedded", "path": str(tmp_path / "kv"), "map_size": 1024**3})
    server, port = create_server("127.0.0.1:0", engine, data_plane=plane)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        data = kv_pb2_grpc.KvDataStub(channel)
        with pytest.raises(grpc.RpcError) as missing:
            data.Get(kv_pb2.GetRequest(target=kv_pb2.Target(namespace="nope__v20260101000000_abcdef"), key=b"k"))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        info = _error_info(missing.value)
        assert (info.domain, info.reason) == (ERROR_DOMAIN, "NamespaceNotFoundError")
        assert all(key != "bulldozer-error" for key, _ in missing.value.trailing_metadata())  # no custom trailer

        client = KvClient(f"127.0.0.1:{port}")
        name = new_version_name("errs")
        client.create_namespace(name, "errs")
        client.mark_failed(name, "for the test")
        with pytest.raises(grpc.RpcError) as not_loading:  # the write path of the plane itself
            data.PutBatch(kv_pb2.PutBatchRequest(namespace=name, records=[kv_pb2.KeyValue(key=b"k", value=b"v")]))
        info = _error_info(not_loading.value)
        assert (not_loading.value.code(), info.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "NamespaceStateError")
        with pytest.raises(NamespaceStateError):
            client.put(name, [(b"k", b"v")])
        with pytest.raises(NamespaceNotFoundError):
            client.describe("nope__v20260101000000_abcdef")
        client.close()
        channel.close()
    finally:
        server.stop(1)
