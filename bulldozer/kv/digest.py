"""An order-independent digest of (key, value) pairs, computed vectorized.

Each pair hashes to 64 bits (xxHash3 of the key and, with another seed, of the value,
mixed with a splitmix64 finaliser); the digest is the sum of the pair hashes modulo
2**64. Sums do not depend on order, so the runner (which sends batches in any order) and
the DAL (which scans what it stored, in key order) compute the same number, and a lost or
altered pair changes it. Not a cryptographic hash: it detects loss, not tampering.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import xxhash

__all__ = ["Digest", "digest_and_key_hashes", "digest_arrays", "digest_pairs", "key_hashes"]

_C1 = np.uint64(0x9E3779B97F4A7C15)
_C2 = np.uint64(0xBF58476D1CE4E5B9)
_C3 = np.uint64(0x94D049BB133111EB)
_MASK = (1 << 64) - 1


def _mix(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _C2
        x = (x ^ (x >> np.uint64(27))) * _C3
        mixed: np.ndarray[Any, Any] = x ^ (x >> np.uint64(31))
        return mixed


def _hashes(items: Sequence[bytes], seed: int = 0) -> np.ndarray[Any, Any]:
    """xxHash3 (64 bit) of each item."""
    h = xxhash.xxh3_64_intdigest
    return np.fromiter((h(b, seed) for b in items), dtype=np.uint64, count=len(items))


def _pair_hashes(
    keys: Sequence[bytes], values: Sequence[bytes], hk: np.ndarray[Any, Any] | None = None
) -> np.ndarray[Any, Any]:
    hk = _hashes(keys) if hk is None else hk
    hv = _hashes(values, 0x5BD1E995)
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
    h = _pair_hashes(keys, values)
    nbytes = sum(map(len, keys)) + sum(map(len, values))
    return Digest(len(pairs), int(h.sum(dtype=np.uint64)), nbytes)


def _as_list(arr: Any) -> tuple[list[bytes], int]:
    """The items of an Arrow binary array as bytes, and their total size."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    nbytes = int(pc.sum(pc.binary_length(arr)).as_py() or 0) if len(arr) else 0
    return arr.to_pylist(), nbytes


def digest_arrays(keys: Any, values: Any) -> Digest:
    """Digest of pairs held in two Arrow binary arrays (the encoder's output)."""
    return digest_and_key_hashes(keys, values)[0]


def digest_and_key_hashes(keys: Any, values: Any) -> tuple[Digest, np.ndarray[Any, Any]]:
    """The digest of the pairs and the hash of each key (for duplicate detection), hashing
    every key once."""
    key_list, key_bytes = _as_list(keys)
    value_list, value_bytes = _as_list(values)
    hk = _hashes(key_list)
    h = _pair_hashes(key_list, value_list, hk)
    return Digest(len(h), int(h.sum(dtype=np.uint64)), key_bytes + value_bytes), hk


def key_hashes(keys: Any) -> np.ndarray[Any, Any]:
    """A 64-bit hash of each key in an Arrow binary array (for duplicate detection)."""
    return _hashes(_as_list(keys)[0])
