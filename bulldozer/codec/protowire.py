"""Protobuf wire-format pieces shared by the row encoder (``bulldozer.load.encoder.encode``) and
the KV client's hand-built requests (``bulldozer.kv.columnar``): plain Python and numpy,
no compiled kernels (the client imports this; the encoder's row layouts are in
``bulldozer.load.encoder.layouts``)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["packed_varints", "varint"]


def varint(value: int) -> bytes:
    """``value`` (non-negative) as a protobuf base-128 varint."""
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
