"""The hand-built PutBatchRequest bytes are exactly protobuf's own serialization, and the
writer's batches respect both of their limits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bulldozer.codec.protowire import packed_varints, varint
from bulldozer.kv.columnar import batch_bounds, put_batch_request
from bulldozer.kv.v1 import kv_pb2

_items = st.lists(st.binary(max_size=300), max_size=40)


def _reference(namespace: str, keys: list[bytes], values: list[bytes]) -> bytes:
    columnar = kv_pb2.ColumnarRecords(
        keys=b"".join(keys),
        key_lengths=[len(k) for k in keys],
        values=b"".join(values),
        value_lengths=[len(v) for v in values],
    )
    return kv_pb2.PutBatchRequest(namespace=namespace, columnar=columnar).SerializeToString()


@given(st.text(max_size=80), _items, _items)
def test_same_bytes_as_protobuf(namespace: str, keys: list[bytes], values: list[bytes]) -> None:
    got = put_batch_request(
        namespace, b"".join(keys), [len(k) for k in keys], b"".join(values), [len(v) for v in values]
    )
    assert got == _reference(namespace, keys, values)
    parsed = kv_pb2.PutBatchRequest.FromString(got)
    assert list(parsed.columnar.key_lengths) == [len(k) for k in keys]


@pytest.mark.parametrize("size", [127, 128, 16_383, 16_384, 2_097_152, 3_000_000])
def test_long_items_and_buffers(size: int) -> None:
    """Multi-byte length varints, and blobs given as numpy-backed buffers (as the writer does)."""
    keys = [b"k1", b"key-2"]
    values = [b"a" * size, b"b"]
    blob = np.frombuffer(b"".join(values), dtype=np.uint8)
    got = put_batch_request("ns", memoryview(b"".join(keys)), np.array([2, 5]), memoryview(blob), [size, 1])
    assert got == _reference("ns", keys, values)


@given(st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=200))
def test_packed_varints(values: list[int]) -> None:
    message = kv_pb2.ColumnarRecords(key_lengths=values)
    expected = message.SerializeToString()
    packed = packed_varints(values)
    assert (b"\x12" + varint(len(packed)) + packed if values else b"") == expected


@given(st.lists(st.integers(min_value=0, max_value=300), max_size=200))
def test_packed_varints_of_short_lengths(values: list[int]) -> None:
    """Lengths around one byte's limit (127 / 128), as most batches' are: the one-byte path
    and the general one give protobuf's bytes."""
    expected = kv_pb2.ColumnarRecords(key_lengths=values).SerializeToString()
    for given_as in (values, np.array(values, dtype=np.int64), np.array(values, dtype=np.uint32)):
        packed = packed_varints(given_as)
        assert (b"\x12" + varint(len(packed)) + packed if values else b"") == expected


def test_packed_varints_refuses_values_over_uint32() -> None:
    with pytest.raises(ValueError, match="uint32"):
        packed_varints([2**32])


@given(st.lists(st.integers(1, 5_000), max_size=200), st.integers(1, 50), st.integers(1, 20_000))
def test_batch_bounds_cover_every_record_within_both_limits(sizes: list[int], records: int, limit: int) -> None:
    bounds = list(batch_bounds(np.array(sizes, dtype=np.int64), records, limit))
    # contiguous, in order, every record once
    assert [a for a, _ in bounds] == [0, *(b for _, b in bounds[:-1])][: len(bounds)]
    assert (bounds[-1][1] if bounds else 0) == len(sizes)
    for a, b in bounds:
        assert 1 <= b - a <= records
        # over the byte limit only as a single record larger than it
        assert sum(sizes[a:b]) <= limit or b - a == 1
        # and as full as the limits allow: the next record would not have fit
        if b < len(sizes) and b - a < records:
            assert sum(sizes[a : b + 1]) > limit


def test_batch_bounds_cut_where_the_bytes_run_out() -> None:
    assert list(batch_bounds(np.array([300] * 10), 4, 1_000)) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert list(batch_bounds(np.array([10] * 10), 4, 1_000)) == [(0, 4), (4, 8), (8, 10)]
    assert list(batch_bounds(np.array([5_000, 10, 10]), 4, 1_000)) == [(0, 1), (1, 3)]
