"""An order-independent digest of (key, value) pairs, computed vectorized.

Each pair hashes to 64 bits (a polynomial hash of the key and of the value, mixed with
their lengths and a splitmix64 finaliser); the digest is the sum of the pair hashes modulo
2**64. Sums do not depend on order, so the runner (which sends batches in any order) and
the DAL (which scans what it stored, in key order) compute the same number, and a lost or
altered pair changes it. Not a cryptographic hash: it detects loss, not tampering.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = ["Digest", "digest_arrays", "digest_pairs"]

_P = np.uint64(0x100000001B3)  # FNV-64 prime as the polynomial base
_C1 = np.uint64(0x9E3779B97F4A7C15)
_C2 = np.uint64(0xBF58476D1CE4E5B9)
_C3 = np.uint64(0x94D049BB133111EB)
_MASK = (1 << 64) - 1
_powers = np.ones(1, dtype=np.uint64)


def _power_table(n: int) -> np.ndarray[Any, Any]:
    global _powers  # a grow-only cache
    if len(_powers) < n:
        size = max(n, 2 * len(_powers))
        table = np.empty(size, dtype=np.uint64)
        table[0] = 1
        with np.errstate(over="ignore"):
            for i in range(1, size):  # runs rarely: the table only grows
                table[i] = table[i - 1] * _P
        _powers = table
    return _powers


def _mix(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _C2
        x = (x ^ (x >> np.uint64(27))) * _C3
        mixed: np.ndarray[Any, Any] = x ^ (x >> np.uint64(31))
        return mixed


def _segment_hashes(data: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """64-bit hash of each segment ``data[offsets[i]:offsets[i+1]]``."""
    lengths = np.diff(offsets)
    n = len(lengths)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    total = int(offsets[-1] - offsets[0])
    if total == 0:
        return _mix(lengths.astype(np.uint64) * _C1)
    local = data[int(offsets[0]) : int(offsets[-1])].astype(np.uint64)
    starts = (offsets[:-1] - offsets[0]).astype(np.int64)
    pos = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
    powers = _power_table(int(lengths.max()) + 1)
    with np.errstate(over="ignore"):
        terms = (local + np.uint64(1)) * powers[pos]
        prefix = np.zeros(total + 1, dtype=np.uint64)
        np.cumsum(terms, dtype=np.uint64, out=prefix[1:])
        sums = prefix[starts + lengths] - prefix[starts]
        return _mix(sums ^ (lengths.astype(np.uint64) * _C1))


def _pair_hashes(
    key_data: np.ndarray[Any, Any],
    key_offsets: np.ndarray[Any, Any],
    value_data: np.ndarray[Any, Any],
    value_offsets: np.ndarray[Any, Any],
) -> np.ndarray[Any, Any]:
    hk = _segment_hashes(key_data, key_offsets)
    hv = _segment_hashes(value_data, value_offsets)
    with np.errstate(over="ignore"):
        return _mix(hk * _C1 + ((hv << np.uint64(17)) | (hv >> np.uint64(47))) + _C3)


class Digest:
    """A running (count, bytes, digest) over pairs; add batches in any order."""

    __slots__ = ("bytes", "count", "value")

    def __init__(self, count: int = 0, value: int = 0, nbytes: int = 0) -> None:
        self.count = count
        self.value = value
        self.bytes = nbytes

    def add_arrays(self, keys: Any, values: Any) -> None:
        """Add pairs from two Arrow binary / large_binary arrays of equal length."""
        self.add(digest_arrays(keys, values))

    def add_pairs(self, pairs: Sequence[tuple[bytes, bytes]]) -> None:
        self.add(digest_pairs(pairs))

    def add(self, other: Digest) -> None:
        self.count += other.count
        self.bytes += other.bytes
        self.value = (self.value + other.value) & _MASK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Digest) and (self.count, self.value) == (other.count, other.value)

    def __hash__(self) -> int:
        return hash((self.count, self.value))

    def __repr__(self) -> str:
        return f"Digest(count={self.count}, value={self.value:#018x}, bytes={self.bytes})"


def _concat(items: Sequence[bytes]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in items], out=offsets[1:])
    return np.frombuffer(b"".join(items), dtype=np.uint8), offsets


def digest_pairs(pairs: Iterable[tuple[bytes, bytes]], chunk: int = 200_000) -> Digest:
    """Digest of python ``(key, value)`` pairs."""
    out = Digest()
    buf: list[tuple[bytes, bytes]] = []
    for pair in pairs:
        buf.append(pair)
        if len(buf) >= chunk:
            out.add(_digest_chunk(buf))
            buf = []
    if buf:
        out.add(_digest_chunk(buf))
    return out


def _digest_chunk(pairs: Sequence[tuple[bytes, bytes]]) -> Digest:
    keys = [k for k, _ in pairs]
    values = [v for _, v in pairs]
    kd, ko = _concat(keys)
    vd, vo = _concat(values)
    h = _pair_hashes(kd, ko, vd, vo)
    return Digest(len(pairs), int(h.sum(dtype=np.uint64)), int(ko[-1] + vo[-1]))


def _binary_parts(arr: Any) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.type != pa.large_binary():
        arr = arr.cast(pa.large_binary())
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data_buf = arr.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return data, offsets


def digest_arrays(keys: Any, values: Any) -> Digest:
    """Digest of pairs held in two Arrow binary arrays (the encoder's output)."""
    kd, ko = _binary_parts(keys)
    vd, vo = _binary_parts(values)
    h = _pair_hashes(kd, ko, vd, vo)
    return Digest(len(h), int(h.sum(dtype=np.uint64)), int(ko[-1] - ko[0] + vo[-1] - vo[0]) if len(h) else 0)
