"""Compiled kernels that write protobuf wire bytes for whole columns (numba, no GIL).

The encoder (``encode.py``) builds each field's bytes for every row as one Arrow
``large_binary`` array, then joins the fields of each row. These are its primitives, each
one pass over the rows in native code:

* ``varint_rows``: ``tag + varint(v)`` per row (or nothing where not kept);
* ``fixed_rows``: ``tag + raw bytes`` per row (fixed32 / fixed64 payloads);
* ``len_rows``: ``tag + varint(len(payload)) + payload`` per row;
* ``concat_rows``: the row-wise concatenation of several binary arrays;
* ``decimal_strings``: decimal128 values as the strings Arrow's cast writes (``-0.05``).

They take and return plain buffers (offsets + bytes), so Arrow arrays go in and come out
without a copy. Compiled once and cached on disk (``cache=True``): the first run on a
machine pays about a second, later runs load the cached machine code. ``nogil`` lets the
client's sender threads run while a batch is being encoded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from numba import njit

from bulldozer.buffers import EMPTY_BYTES, binary_array, binary_view

__all__ = [
    "concat_rows",
    "decimal_strings",
    "fixed_rows",
    "len_rows",
    "varint_rows",
    "warm_up",
    "warm_up_in_background",
]

_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U7 = np.uint64(7)
_U127 = np.uint64(0x7F)
_U128 = np.uint64(0x80)
_U6 = np.uint64(6)
_U10 = np.uint64(10)

# Every index in these kernels is unsigned (np.uint64): numba checks signed indices for
# negative (wrap-around) values on every access, which made the byte loops 6x slower.
# Unsigned and signed integers never meet in one expression (numba would go to float).


@njit(cache=True, nogil=True)
def _varint_size(v: Any) -> Any:
    k = _U1
    while v >= _U128:
        v >>= _U7
        k += _U1
    return k


@njit(cache=True, nogil=True)
def _put_varint(out: Any, p: Any, v: Any) -> Any:
    while v >= _U128:
        out[p] = np.uint8((v & _U127) | _U128)
        v >>= _U7
        p += _U1
    out[p] = np.uint8(v)
    return p + _U1


@njit(cache=True, nogil=True)
def _put(out: Any, p: Any, data: Any, start: Any, end: Any) -> Any:
    """Copy ``data[start:end]`` to ``out[p:]``; the position after it."""
    while start < end:
        out[p] = data[start]
        p += _U1
        start += _U1
    return p


@njit(cache=True, nogil=True)
def _varints(values: Any, keep: Any, prefix: Any) -> Any:
    n = len(values)
    t = np.uint64(len(prefix))
    offsets = np.empty(n + 1, dtype=np.uint64)
    offsets[0] = _U0
    total = _U0
    for i in range(n):
        if keep[i]:
            total += t + _varint_size(values[i])
        offsets[i + 1] = total
    out = np.empty(total, dtype=np.uint8)
    for i in range(n):
        p = offsets[i]
        if offsets[i + 1] > p:
            p = _put(out, p, prefix, _U0, t)
            _put_varint(out, p, values[i])
    return offsets, out


@njit(cache=True, nogil=True)
def _fixed(raw: Any, keep: Any, prefix: Any) -> Any:
    n = len(keep)
    width = np.uint64(raw.shape[1])
    flat = raw.reshape(-1)
    t = np.uint64(len(prefix))
    offsets = np.empty(n + 1, dtype=np.uint64)
    offsets[0] = _U0
    total = _U0
    for i in range(n):
        if keep[i]:
            total += t + width
        offsets[i + 1] = total
    out = np.empty(total, dtype=np.uint8)
    for i in range(n):
        p = offsets[i]
        if offsets[i + 1] > p:
            p = _put(out, p, prefix, _U0, t)
            start = np.uint64(i) * width
            _put(out, p, flat, start, start + width)
    return offsets, out


@njit(cache=True, nogil=True)
def _row_sizes(offsets: Any, keep: Any, sizes: Any) -> None:
    for i in range(len(sizes)):
        if keep[i]:
            sizes[i] += offsets[i + 1] - offsets[i]


@njit(cache=True, nogil=True)
def _headers(sizes: Any, keep: Any, prefix: Any) -> Any:
    """Row layout for ``prefix + varint(size) + payload`` of each kept row (the others
    empty): the output offsets, the output with every header written, and where each
    row's payload starts."""
    n = len(sizes)
    t = np.uint64(len(prefix))
    offsets = np.empty(n + 1, dtype=np.uint64)
    offsets[0] = _U0
    total = _U0
    for i in range(n):
        if keep[i]:
            total += t + _varint_size(sizes[i]) + sizes[i]
        offsets[i + 1] = total
    out = np.empty(total, dtype=np.uint8)
    pos = np.empty(n, dtype=np.uint64)
    for i in range(n):
        p = offsets[i]
        if keep[i]:
            p = _put(out, p, prefix, _U0, t)
            p = _put_varint(out, p, sizes[i])
        pos[i] = p
    return offsets, out, pos


@njit(cache=True, nogil=True)
def _append_rows(out: Any, pos: Any, offsets: Any, data: Any, keep: Any) -> None:
    for i in range(len(pos)):
        if keep[i]:
            pos[i] = _put(out, pos[i], data, offsets[i], offsets[i + 1])


@njit(cache=True, nogil=True)
def _decimals(low: Any, valid: Any, scale: Any) -> Any:
    """Decimal strings of values that fit an int64 (``low``: the low 64 bits of each
    decimal128), plain notation only; ``None`` if a valid value would need Arrow's
    scientific form (fewer than ``scale - 5`` digits, e.g. ``5E-7`` at scale 7)."""
    n = len(low)
    offsets = np.empty(n + 1, dtype=np.uint64)
    offsets[0] = _U0
    total = _U0
    for i in range(n):
        if valid[i]:
            v = low[i]
            mag = np.uint64(-v) if v < 0 else np.uint64(v)
            digits = _U1
            m = mag
            while m >= _U10:
                m //= _U10
                digits += _U1
            if digits + _U6 < scale + _U1:
                return None
            size = digits if digits > scale else scale + _U1  # at least one integer digit
            if scale > _U0:
                size += _U1
            if v < 0:
                size += _U1
            total += size
        offsets[i + 1] = total
    out = np.empty(total, dtype=np.uint8)
    for i in range(n):
        start = offsets[i]
        p = offsets[i + 1]
        if p == start:
            continue
        v = low[i]
        mag = np.uint64(-v) if v < 0 else np.uint64(v)
        written = _U0
        while True:  # digits from the right, the point after ``scale`` of them
            if scale > _U0 and written == scale:
                p -= _U1
                out[p] = np.uint8(46)  # "."
            p -= _U1
            out[p] = np.uint8(48) + np.uint8(mag % _U10)
            mag //= _U10
            written += _U1
            if mag == _U0 and written > scale:
                break
        if v < 0:
            out[start] = np.uint8(45)  # "-"
    return offsets, out


def decimal_strings(arr: pa.Array) -> pa.Array | None:
    """A decimal128 array's values as text (a ``large_binary`` array), byte for byte what
    ``arr.cast(pa.large_string())`` returns for its valid rows (null rows come out empty),
    in one native pass. ``None`` when the array is outside the fast path (precision over
    18, a negative scale, or a value Arrow would print in scientific notation), so the
    caller casts instead. Arrow's cast cost ≈ 0.18 µs a value."""
    t = arr.type
    if not pa.types.is_decimal128(t) or t.precision > 18 or t.scale < 0:
        return None
    n = len(arr)
    if n == 0:
        return None
    words = np.frombuffer(arr.buffers()[1], dtype=np.int64)[2 * arr.offset : 2 * (arr.offset + n)]
    low = np.ascontiguousarray(words[0::2])  # |value| < 10**18: the high word is only its sign
    valid = np.ones(n, dtype=np.bool_) if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
    result = _decimals(low, valid, np.uint64(t.scale))
    if result is None:
        return None
    offsets, data = result
    return _array(n, offsets, data)


def _array(n: int, offsets: np.ndarray[Any, Any], data: np.ndarray[Any, Any]) -> pa.Array:
    return pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _keep(n: int, keep: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
    return np.ones(n, dtype=np.bool_) if keep is None else np.ascontiguousarray(keep, dtype=np.bool_)


def _prefix(prefix: bytes) -> np.ndarray[Any, Any]:
    return np.frombuffer(prefix, dtype=np.uint8) if prefix else EMPTY_BYTES


def varint_rows(values: np.ndarray[Any, Any], keep: np.ndarray[Any, Any] | None, prefix: bytes = b"") -> pa.Array:
    """``prefix + varint(v)`` for each value (signed values as their two's complement,
    as protobuf writes int32/int64); empty where not kept."""
    v = values.astype(np.int64, copy=False).view(np.uint64) if values.dtype.kind == "i" else values
    v = np.ascontiguousarray(v, dtype=np.uint64)
    offsets, data = _varints(v, _keep(len(v), keep), _prefix(prefix))
    return _array(len(v), offsets, data)


def fixed_rows(raw: np.ndarray[Any, Any], keep: np.ndarray[Any, Any] | None, prefix: bytes = b"") -> pa.Array:
    """``prefix + raw[i]`` (a row of a uint8 matrix) per row; empty where not kept."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    offsets, data = _fixed(raw, _keep(len(raw), keep), _prefix(prefix))
    return _array(len(raw), offsets, data)


def len_rows(payload: pa.Array, keep: np.ndarray[Any, Any] | None, prefix: bytes) -> pa.Array:
    """``prefix + varint(len) + payload`` for kept rows, empty for the others."""
    return concat_rows([payload], len(payload), keep, prefix)


def concat_rows(
    parts: list[pa.Array], n: int, keep: np.ndarray[Any, Any] | None = None, prefix: bytes | None = None
) -> pa.Array:
    """Row ``i`` of every part, concatenated in order; rows not kept are empty. With
    ``prefix`` (a field's tag), each kept row is written length-delimited instead,
    ``prefix + varint(len) + payload``: ``len_rows(concat_rows(parts, n), keep, prefix)``
    without building and copying the payloads first (a nested message's bytes are written
    once, straight into its parent field's row)."""
    if (
        prefix is None
        and len(parts) == 1
        and keep is None
        and parts[0].type == pa.large_binary()
        and not parts[0].null_count
    ):
        return parts[0]
    views = [binary_view(p) for p in parts]
    keep_rows = _keep(n, keep)
    sizes = np.zeros(n, dtype=np.uint64)
    for offsets, _data in views:
        _row_sizes(offsets, keep_rows, sizes)
    if prefix is None:
        out_offsets = np.zeros(n + 1, dtype=np.uint64)
        np.cumsum(sizes, out=out_offsets[1:])
        out = np.empty(int(out_offsets[-1]), dtype=np.uint8)
        pos = out_offsets[:-1].copy()
    else:
        out_offsets, out, pos = _headers(sizes, keep_rows, _prefix(prefix))
    for offsets, data in views:
        _append_rows(out, pos, offsets, data, keep_rows)
    return _array(n, out_offsets, out)


def warm_up() -> None:
    """Load every kernel (and the digest's) from numba's on-disk cache, or compile them on
    a machine's first run, with inputs typed like a real batch's: read-only Arrow buffers
    and fresh output arrays. Loading is mostly LLVM work outside the GIL, so a run does it
    in a background thread while it reads the catalog (≈ 1 s it would otherwise spend on
    its first batch)."""
    from bulldozer.kv.digest import warm_up as warm_digest

    keep = np.array([True, False])
    strings = binary_array([b"ab", b"c"], pa.string())
    blobs = binary_array([b"ab", b"c"])
    varint_rows(np.array([1, 300], dtype=np.int64), keep, b"\x08")
    varint_rows(np.array([1, 300], dtype=np.uint64), None)
    fixed_rows(np.zeros((2, 8), dtype=np.uint8), keep, b"\x09")
    fixed_rows(np.zeros((2, 4), dtype=np.uint8), None)
    for payload in (strings, blobs, len_rows(blobs, None, b"\x12")):
        len_rows(payload, keep, b"\x12")
    concat_rows([len_rows(blobs, None, b"\x12"), strings, blobs], 2)
    concat_rows([len_rows(blobs, None, b"\x12")], 2, keep=keep)
    concat_rows([len_rows(blobs, None, b"\x12"), strings, blobs], 2, keep=keep, prefix=b"\x1a")
    words = np.array([5, 0, -5, -1], dtype=np.int64)  # 0.05 and -0.05 as decimal128 words
    decimal_strings(pa.Array.from_buffers(pa.decimal128(10, 2), 2, [None, pa.py_buffer(words)]))
    warm_digest()


def warm_up_in_background() -> None:
    """``warm_up`` on a daemon thread (best effort: the first real call loads or compiles
    whatever is missing)."""
    from bulldozer.buffers import in_background

    in_background(warm_up, "kernel-warm-up")
