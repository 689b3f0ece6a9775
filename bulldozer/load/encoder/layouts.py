"""How the encoder writes protobuf wire bytes for whole columns: compiled kernels (numba,
no GIL) driven by a small tree of row layouts.

The encoder (``encode.py``) describes each field of each row as a ``Rows`` node instead of
building its bytes: ``VarintRows`` (``tag + varint(v)``), ``FixedRows`` (``tag + raw bytes``,
fixed32 / fixed64), ``BytesRows`` (a binary or string column as it is, or each value
``tag + varint(len) + payload``), ``ConcatRows`` (the fields of a message, optionally
length-delimited as a nested message field) and ``GroupedRows`` (the elements of a
repeated field or map, per row). ``bulldozer.load.encoder.kernels`` compiles a job's tree into
kernels that write a batch row by row in one pass (the fast path). ``materialize`` writes
it without compiling anything: it asks the tree for every row's size, allocates the
output once and has each node write its bytes straight into place, one pass per node over
a slice of rows at a time (while a job's layout compiles, and for tests of both).
``decimal_strings`` writes decimal128 values as the strings Arrow's cast writes
(``-0.05``).

Arrow arrays go in and come out as plain buffers (offsets + bytes), without a copy. The
kernels are compiled once and cached on disk (``cache=True``): the first run on a machine
pays a few seconds, later runs load the cached machine code. ``nogil`` lets the client's
sender threads run while a batch is being encoded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from numba import njit

from bulldozer.codec.buffers import EMPTY_BYTES, binary_array, binary_view

__all__ = [
    "BytesRows",
    "ConcatRows",
    "FixedRows",
    "GroupedRows",
    "Rows",
    "VarintRows",
    "binary_rows",
    "decimal_strings",
    "fixed_rows",
    "materialize",
    "read_only",
    "varint_rows",
    "warm_up",
    "warm_up_in_background",
]

#: How much output ``materialize`` writes at a time: all fields pass over one slice of rows
#: while it is in the CPU's (L2) cache, instead of each streaming through the whole batch.
WRITE_SLICE_BYTES = 256 * 1024
MIN_SLICE_ROWS = 64
EMPTY_MASK = np.zeros(0, dtype=np.bool_)

_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U7 = np.uint64(7)
_U127 = np.uint64(0x7F)
_U128 = np.uint64(0x80)
_U6 = np.uint64(6)
_U10 = np.uint64(10)
_B7, _B14, _B21, _B28, _B35, _B42, _B49, _B56, _B63 = (np.uint64(1 << (7 * k)) for k in range(1, 10))

# Every index in these kernels is unsigned (np.uint64): numba checks signed indices for
# negative (wrap-around) values on every access, which made the byte loops 6x slower.
# Unsigned and signed integers never meet in one expression (numba would go to float).


@njit(cache=True, nogil=True)
def _varint_size(v: Any) -> Any:
    # branch-free, so the size loops below compile to SIMD code (a loop here was 4x slower)
    return (
        _U1
        + np.uint64(v >= _B7)
        + np.uint64(v >= _B14)
        + np.uint64(v >= _B21)
        + np.uint64(v >= _B28)
        + np.uint64(v >= _B35)
        + np.uint64(v >= _B42)
        + np.uint64(v >= _B49)
        + np.uint64(v >= _B56)
        + np.uint64(v >= _B63)
    )


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
def _varint_sizes(values: Any, keep: Any, t: Any) -> Any:
    sizes = np.empty(len(values), dtype=np.uint64)
    for i in range(len(values)):
        sizes[i] = np.uint64(keep[i]) * (t + _varint_size(values[i]))
    return sizes


@njit(cache=True, nogil=True)
def _write_varints(out: Any, pos: Any, values: Any, keep: Any, prefix: Any, start: Any, end: Any) -> None:
    t = np.uint64(len(prefix))
    for i in range(start, end):
        if keep[i]:
            p = _put(out, pos[i], prefix, _U0, t)
            pos[i] = _put_varint(out, p, values[i])


@njit(cache=True, nogil=True)
def _write_fixed(out: Any, pos: Any, raw: Any, keep: Any, prefix: Any, start: Any, end: Any) -> None:
    width = np.uint64(raw.shape[1])
    flat = raw.reshape(-1)
    t = np.uint64(len(prefix))
    for i in range(start, end):
        if keep[i]:
            p = _put(out, pos[i], prefix, _U0, t)
            at = np.uint64(i) * width
            pos[i] = _put(out, p, flat, at, at + width)


@njit(cache=True, nogil=True)
def _delimited_sizes(payload: Any, keep: Any, t: Any) -> Any:
    """``t + varint(size) + size`` per kept row (0 for the others)."""
    sizes = np.empty(len(payload), dtype=np.uint64)
    for i in range(len(payload)):
        sizes[i] = np.uint64(keep[i]) * (t + _varint_size(payload[i]) + payload[i])
    return sizes


@njit(cache=True, nogil=True)
def _write_headers(out: Any, pos: Any, payload: Any, keep: Any, prefix: Any, start: Any, end: Any) -> None:
    """``prefix + varint(size)`` of each kept row, the payload to follow."""
    t = np.uint64(len(prefix))
    for i in range(start, end):
        if keep[i]:
            p = _put(out, pos[i], prefix, _U0, t)
            pos[i] = _put_varint(out, p, payload[i])


@njit(cache=True, nogil=True)
def _write_bytes(out: Any, pos: Any, offsets: Any, data: Any, keep: Any, prefix: Any, start: Any, end: Any) -> None:
    """Each kept row's bytes (``data[offsets[i]:offsets[i + 1]]``), length-delimited after
    ``prefix`` when there is one."""
    t = np.uint64(len(prefix))
    for i in range(start, end):
        if keep[i]:
            first, last = offsets[i], offsets[i + 1]
            p = pos[i]
            if t > _U0:
                p = _put(out, p, prefix, _U0, t)
                p = _put_varint(out, p, last - first)
            pos[i] = _put(out, p, data, first, last)


@njit(cache=True, nogil=True)
def _element_positions(pos: Any, bounds: Any, sizes: Any, keep: Any, epos: Any, start: Any, end: Any) -> None:
    """Where each element of a kept row goes (its row's elements follow one another from
    the row's position on), and every kept row's position moved past its elements."""
    for i in range(start, end):
        if keep[i]:
            p = pos[i]
            for j in range(bounds[i], bounds[i + 1]):
                epos[j] = p
                p += sizes[j]
            pos[i] = p


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
    return binary_rows(n, offsets, data)


def binary_rows(n: int, offsets: np.ndarray[Any, Any], data: np.ndarray[Any, Any]) -> pa.Array:
    return pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _keep(n: int, keep: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
    return np.ones(n, dtype=np.bool_) if keep is None else np.ascontiguousarray(keep, dtype=np.bool_)


def _prefix(prefix: bytes) -> np.ndarray[Any, Any]:
    return np.frombuffer(prefix, dtype=np.uint8) if prefix else EMPTY_BYTES


class Rows:
    """The bytes of one field (or message) for every row, laid out lazily. ``sizes()`` says
    how many bytes each row takes; ``prepare(mask)`` settles which rows are written (those
    kept by the node's own ``keep`` and by its parents'); ``write(out, pos, start, end)``
    puts the bytes of rows ``start:end`` at their positions in the one output buffer and
    moves each position past them. ``materialize`` writes a batch a slice of rows at a
    time, so the part of the output being written stays in the CPU's cache while every
    field passes over it."""

    n: int
    keep: np.ndarray[Any, Any] | None
    _sizes: np.ndarray[Any, Any] | None = None
    _write_mask: np.ndarray[Any, Any] = EMPTY_MASK

    def sizes(self) -> np.ndarray[Any, Any]:
        """Bytes per row (uint64), computed once."""
        if self._sizes is None:
            self._sizes = self._compute_sizes()
        return self._sizes

    def _compute_sizes(self) -> np.ndarray[Any, Any]:
        raise NotImplementedError

    def prepare(self, mask: np.ndarray[Any, Any] | None) -> None:
        """Settle the rows to write: this node's ``keep`` and the caller's ``mask`` (None: all)."""
        if self.keep is None:
            self._write_mask = _keep(self.n, mask)
        else:
            self._write_mask = self.keep if mask is None else self.keep & mask

    def write(self, out: np.ndarray[Any, Any], pos: np.ndarray[Any, Any], start: int, end: int) -> None:
        raise NotImplementedError


class VarintRows(Rows):
    """``prefix + varint(v)`` per row (signed values as their two's complement, as protobuf
    writes int32/int64)."""

    def __init__(self, values: np.ndarray[Any, Any], keep: np.ndarray[Any, Any] | None, prefix: bytes = b"") -> None:
        v = values.astype(np.int64, copy=False).view(np.uint64) if values.dtype.kind == "i" else values
        self.values = np.ascontiguousarray(v, dtype=np.uint64)
        self.n, self.keep, self.prefix = len(self.values), keep, _prefix(prefix)

    def _compute_sizes(self) -> np.ndarray[Any, Any]:
        return _varint_sizes(self.values, _keep(self.n, self.keep), np.uint64(len(self.prefix)))  # type: ignore[no-any-return]

    def write(self, out: np.ndarray[Any, Any], pos: np.ndarray[Any, Any], start: int, end: int) -> None:
        _write_varints(out, pos, self.values, self._write_mask, self.prefix, start, end)


class FixedRows(Rows):
    """``prefix + raw[i]`` per row (a row of a uint8 matrix: fixed32 / fixed64 payloads)."""

    def __init__(self, raw: np.ndarray[Any, Any], keep: np.ndarray[Any, Any] | None, prefix: bytes = b"") -> None:
        self.raw = np.ascontiguousarray(raw, dtype=np.uint8)
        self.n, self.keep, self.prefix = len(self.raw), keep, _prefix(prefix)

    def _compute_sizes(self) -> np.ndarray[Any, Any]:
        width = np.uint64(len(self.prefix) + self.raw.shape[1])
        return _keep(self.n, self.keep).astype(np.uint64) * width

    def write(self, out: np.ndarray[Any, Any], pos: np.ndarray[Any, Any], start: int, end: int) -> None:
        _write_fixed(out, pos, self.raw, self._write_mask, self.prefix, start, end)


class BytesRows(Rows):
    """The rows of a binary or string array as they are, or with ``prefix`` (a field's tag)
    each one length-delimited: ``prefix + varint(len) + payload``. Read in place."""

    def __init__(self, payload: pa.Array, keep: np.ndarray[Any, Any] | None, prefix: bytes = b"") -> None:
        self.offsets, self.data = binary_view(payload)
        self.n, self.keep, self.prefix = len(payload), keep, _prefix(prefix)

    def _compute_sizes(self) -> np.ndarray[Any, Any]:
        lengths = np.diff(self.offsets)
        if len(self.prefix):
            return _delimited_sizes(lengths, _keep(self.n, self.keep), np.uint64(len(self.prefix)))  # type: ignore[no-any-return]
        return lengths if self.keep is None else np.where(self.keep, lengths, _U0)

    def write(self, out: np.ndarray[Any, Any], pos: np.ndarray[Any, Any], start: int, end: int) -> None:
        _write_bytes(out, pos, self.offsets, self.data, self._write_mask, self.prefix, start, end)


class ConcatRows(Rows):
    """Row ``i`` of every part, in order. With ``prefix`` (a field's tag), each kept row is
    written length-delimited, ``prefix + varint(len) + payload``: a nested message's bytes
    go once, straight into its place in the output."""

    def __init__(
        self, parts: list[Rows], n: int, keep: np.ndarray[Any, Any] | None = None, prefix: bytes | None = None
    ) -> None:
        self.parts, self.n, self.keep = parts, n, keep
        self.prefix = None if prefix is None else _prefix(prefix)
        self._payload: np.ndarray[Any, Any] | None = None

    def _compute_sizes(self) -> np.ndarray[Any, Any]:
        payload = np.zeros(self.n, dtype=np.uint64)
        for part in self.parts:
            payload += part.sizes()
        if self.prefix is not None:
            self._payload = payload
            return _delimited_sizes(payload, _keep(self.n, self.keep), np.uint64(len(self.prefix)))  # type: ignore[no-any-return]
        return payload if self.keep is None else np.where(self.keep, payload, _U0)

    def prepare(self, mask: np.ndarray[Any, Any] | None) -> None:
        super().prepare(mask)
        self.sizes()  # the payload sizes the headers write
        for part in self.parts:
            part.prepare(self._write_mask)

    def write(self, out: np.ndarray[Any, Any], pos: np.ndarray[Any, Any], start: int, end: int) -> None:
        if self.prefix is not None:
            _write_headers(out, pos, self._payload, self._write_mask, self.prefix, start, end)
        for part in self.parts:
            part.write(out, pos, start, end)


class GroupedRows(Rows):
    """Row ``i``: the next ``counts[i]`` rows of ``elements`` concatenated (the elements of a
    repeated field or a map, in the list's order)."""

    def __init__(self, elements: Rows, counts: np.ndarray[Any, Any], keep: np.ndarray[Any, Any] | None = None) -> None:
        self.elements, self.n, self.keep = elements, len(counts), keep
        self.counts = np.asarray(counts, dtype=np.int64)
        self.bounds = np.zeros(len(counts) + 1, dtype=np.uint64)
        np.cumsum(counts, out=self.bounds[1:])
        self._epos = np.zeros(0, dtype=np.uint64)

    def _compute_sizes(self) -> np.ndarray[Any, Any]:
        ends = np.zeros(self.elements.n + 1, dtype=np.uint64)
        np.cumsum(self.elements.sizes(), out=ends[1:])
        sizes = ends[self.bounds[1:]] - ends[self.bounds[:-1]]
        return sizes if self.keep is None else np.where(self.keep, sizes, _U0)

    def prepare(self, mask: np.ndarray[Any, Any] | None) -> None:
        super().prepare(mask)
        self._epos = np.zeros(self.elements.n, dtype=np.uint64)
        self.elements.prepare(np.repeat(self._write_mask, self.counts))

    def write(self, out: np.ndarray[Any, Any], pos: np.ndarray[Any, Any], start: int, end: int) -> None:
        bounds = self.bounds
        _element_positions(pos, bounds, self.elements.sizes(), self._write_mask, self._epos, start, end)
        self.elements.write(out, self._epos, int(bounds[start]), int(bounds[end]))


def materialize(rows: Rows) -> pa.Array:
    """Every row of ``rows`` as one ``large_binary`` array: one allocation, each byte
    written once, about ``WRITE_SLICE_BYTES`` of rows at a time."""
    n = rows.n
    offsets = np.zeros(n + 1, dtype=np.uint64)
    np.cumsum(rows.sizes(), out=offsets[1:])
    total = int(offsets[-1])
    out = np.empty(total, dtype=np.uint8)
    pos = offsets[:-1].copy()
    rows.prepare(None)
    step = max(MIN_SLICE_ROWS, n * WRITE_SLICE_BYTES // max(total, 1))
    for start in range(0, n, step):
        rows.write(out, pos, start, min(n, start + step))
    if not np.array_equal(pos, offsets[1:]):  # a layout bug, never bad input
        raise AssertionError("encoder: the bytes written differ from the sizes laid out")
    return binary_rows(rows.n, offsets, out)


def varint_rows(values: np.ndarray[Any, Any], keep: np.ndarray[Any, Any] | None, prefix: bytes = b"") -> pa.Array:
    """``prefix + varint(v)`` for each value; empty where not kept."""
    return materialize(VarintRows(values, keep, prefix))


def fixed_rows(raw: np.ndarray[Any, Any], keep: np.ndarray[Any, Any] | None, prefix: bytes = b"") -> pa.Array:
    """``prefix + raw[i]`` (a row of a uint8 matrix) per row; empty where not kept."""
    return materialize(FixedRows(raw, keep, prefix))


def warm_up() -> None:
    """Load every kernel (and the digest's) from numba's on-disk cache, or compile them on
    a machine's first run, with inputs typed like a real batch's: read-only Arrow buffers
    and fresh output arrays. Loading is mostly LLVM work outside the GIL, so a run does it
    in a background thread while it reads the catalog (≈ 1 s it would otherwise spend on
    its first batch)."""
    from bulldozer.codec.digest import warm_up as warm_digest

    keep = np.array([True, False])
    strings = binary_array([b"ab", b"c"], pa.string())
    blobs = binary_array([b"ab", b"c"])
    for values in (np.array([1, 300], dtype=np.int64), np.array([1, 300], dtype=np.uint64)):
        for ints in (values, read_only(values)):  # Arrow's columns come read-only
            varint_rows(ints, keep, b"\x08")
            varint_rows(ints, None)
    for raw in (np.zeros((2, 8), dtype=np.uint8), read_only(np.zeros((2, 4), dtype=np.uint8))):
        fixed_rows(raw, keep, b"\x09")
        fixed_rows(raw, None)
    nested = ConcatRows([BytesRows(strings, keep, b"\x0a"), BytesRows(blobs, None)], 2, keep, b"\x12")
    elements = ConcatRows([VarintRows(np.array([1, 2, 3]), None, b"\x08")], 3, prefix=b"\x1a")
    grouped = GroupedRows(elements, np.array([2, 1]), keep)
    materialize(ConcatRows([nested, grouped, BytesRows(materialize(nested), None, b"\x22")], 2))
    words = np.array([5, 0, -5, -1], dtype=np.int64)  # 0.05 and -0.05 as decimal128 words
    decimal_strings(pa.Array.from_buffers(pa.decimal128(10, 2), 2, [None, pa.py_buffer(words)]))
    warm_digest()


def read_only(array: np.ndarray[Any, Any], dtype: Any = None) -> np.ndarray[Any, Any]:
    """A C-contiguous, read-only view (a copy only when the dtype or layout differs), typed
    by numba as Arrow's buffers are."""
    view = np.ascontiguousarray(array, dtype=dtype).view()
    view.flags.writeable = False
    return view


def warm_up_in_background() -> None:
    """``warm_up`` on a daemon thread (best effort: the first real call loads or compiles
    whatever is missing)."""
    from bulldozer.codec.buffers import in_background

    in_background(warm_up, "kernel-warm-up")
