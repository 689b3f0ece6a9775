"""The wire bytes of a columnar ``PutBatchRequest``, built straight from the batch's buffers.

Building the request through protobuf's Python API cost ≈ 18 ms for a 17 000-record batch
(the length arrays become Python lists and then repeated fields, the blobs are copied into
the message, the sub-message is copied into the request, and the whole is serialized
again). Writing the few field headers by hand around the caller's buffers, with the length
arrays varint-packed by numpy, costs ≈ 0.6 ms and copies each blob once. The bytes are
exactly what ``PutBatchRequest.SerializeToString()`` returns for the same batch (a test
checks it), so the DAL parses them with the generated code as before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["packed_varints", "put_batch_request"]

# PutBatchRequest: namespace = 1 (string), columnar = 3 (ColumnarRecords)
# ColumnarRecords: keys = 1, key_lengths = 2 (packed uint32), values = 3, value_lengths = 4
_NAMESPACE, _COLUMNAR = b"\x0a", b"\x1a"
_KEYS, _KEY_LENGTHS, _VALUES, _VALUE_LENGTHS = b"\x0a", b"\x12", b"\x1a", b"\x22"


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def packed_varints(values: Any) -> bytes:
    """``values`` (non-negative, below 2**32) as protobuf writes a packed ``repeated uint32``."""
    v = np.asarray(values, dtype=np.uint64)
    if len(v) and int(v.max()) >= 1 << 32:
        raise ValueError("a length does not fit a uint32")
    sizes = np.ones(len(v), dtype=np.int64)
    for bits in (7, 14, 21, 28):
        sizes += v >= (1 << bits)
    starts = np.zeros(len(v), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    out = np.empty(int(sizes.sum()), dtype=np.uint8)
    for j in range(5):
        rows = np.nonzero(sizes > j)[0] if j else np.arange(len(v))
        if not len(rows):
            break
        byte = (v[rows] >> np.uint64(7 * j)) & np.uint64(0x7F)
        byte |= np.where(sizes[rows] > j + 1, np.uint64(0x80), np.uint64(0))
        out[starts[rows] + j] = byte.astype(np.uint8)
    return out.tobytes()


def _field(tag: bytes, payload: bytes | memoryview) -> list[bytes | memoryview]:
    """A length-delimited field, or nothing when empty (as proto3 writes it)."""
    return [tag, _varint(len(payload)), payload] if len(payload) else []


def put_batch_request(namespace: str, keys: Any, key_lengths: Any, values: Any, value_lengths: Any) -> bytes:
    """A serialized ``PutBatchRequest`` carrying one ``ColumnarRecords``: ``keys`` and
    ``values`` are the concatenated items (bytes or any contiguous buffer), the two length
    arrays say where each item ends."""
    keys, values = memoryview(keys).cast("B"), memoryview(values).cast("B")  # len() = bytes
    columnar = [
        *_field(_KEYS, keys),
        *_field(_KEY_LENGTHS, packed_varints(key_lengths)),
        *_field(_VALUES, values),
        *_field(_VALUE_LENGTHS, packed_varints(value_lengths)),
    ]
    inner = sum(len(p) for p in columnar)
    return b"".join([*_field(_NAMESPACE, namespace.encode()), _COLUMNAR, _varint(inner), *columnar])
