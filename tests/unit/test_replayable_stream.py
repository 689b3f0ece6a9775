"""``ReplayableStream``: a client-streaming write sent again after a busy refusal sends every
batch the caller's iterable gave, in its order, reading the iterable once."""

from __future__ import annotations

from collections.abc import Iterator

from bulldozer.kv._writer import ReplayableStream
from bulldozer.kv.v1 import kv_pb2


def _request(key: bytes) -> kv_pb2.PutBatchRequest:
    return kv_pb2.PutBatchRequest(namespace="ns", records=[kv_pb2.KeyValue(key=key, value=b"v" * 100)])


def _keys(requests: list[kv_pb2.PutBatchRequest]) -> list[bytes]:
    return [r.records[0].key for r in requests]


def test_a_second_sending_starts_from_the_first_batch_and_reads_the_iterable_once() -> None:
    read: list[bytes] = []

    def items() -> Iterator[bytes]:
        for key in (b"a", b"b", b"c", b"d"):
            read.append(key)
            yield key

    stream = ReplayableStream(items(), _request)
    first = stream.requests()
    assert _keys([next(first), next(first)]) == [b"a", b"b"]  # gRPC took two, then the refusal came
    assert _keys(list(stream.requests())) == [b"a", b"b", b"c", b"d"]
    assert read == [b"a", b"b", b"c", b"d"] and stream.replayable


def test_a_batch_an_earlier_sendings_thread_took_late_is_sent_too() -> None:
    stream = ReplayableStream(iter([b"a", b"b", b"c"]), _request)
    stale, again = stream.requests(), stream.requests()
    assert _keys([next(stale)]) == [b"a"]
    assert _keys([next(again)]) == [b"a"]
    assert _keys([next(stale)]) == [b"b"]  # the refused call's thread took one more meanwhile
    assert _keys(list(again)) == [b"b", b"c"]


def test_past_its_bytes_a_stream_is_no_longer_sent_again() -> None:
    one = _request(b"a").ByteSize()
    stream = ReplayableStream(iter([b"a", b"b", b"c"]), _request, keep_bytes=2 * one)
    sent = list(stream.requests())
    assert _keys(sent) == [b"a", b"b", b"c"] and not stream.replayable
    big = ReplayableStream(iter([b"a"]), _request, keep_bytes=1)
    assert _keys(list(big.requests())) == [b"a"] and big.replayable  # the first batch is always kept
