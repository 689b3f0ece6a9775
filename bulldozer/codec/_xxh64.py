"""XXH64 and the pair digest as numba kernels (see ``digest.py`` for what they compute).

Every index and integer here is unsigned 64-bit: numba checks signed indices for
wrap-around on each access, and mixing signed with unsigned turns arithmetic into floats.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

__all__ = ["hash_items", "pair_sums", "xxh64_range"]

_P1 = np.uint64(11400714785074694791)
_P2 = np.uint64(14029467366897019727)
_P3 = np.uint64(1609587929392839161)
_P4 = np.uint64(9650029242287828579)
_P5 = np.uint64(2870177450012600261)
_C1 = np.uint64(0x9E3779B97F4A7C15)
_C2 = np.uint64(0xBF58476D1CE4E5B9)
_C3 = np.uint64(0x94D049BB133111EB)
_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U4 = np.uint64(4)
_U8 = np.uint64(8)
_U32 = np.uint64(32)
_U64 = np.uint64(64)


@njit(cache=True, nogil=True, inline="always")
def _rotl(x: Any, r: Any) -> Any:
    return (x << np.uint64(r)) | (x >> (_U64 - np.uint64(r)))


@njit(cache=True, nogil=True, inline="always")
def _read64(d: Any, p: Any) -> Any:
    return (
        np.uint64(d[p])
        | (np.uint64(d[p + _U1]) << np.uint64(8))
        | (np.uint64(d[p + np.uint64(2)]) << np.uint64(16))
        | (np.uint64(d[p + np.uint64(3)]) << np.uint64(24))
        | (np.uint64(d[p + np.uint64(4)]) << np.uint64(32))
        | (np.uint64(d[p + np.uint64(5)]) << np.uint64(40))
        | (np.uint64(d[p + np.uint64(6)]) << np.uint64(48))
        | (np.uint64(d[p + np.uint64(7)]) << np.uint64(56))
    )


@njit(cache=True, nogil=True, inline="always")
def _read32(d: Any, p: Any) -> Any:
    return (
        np.uint64(d[p])
        | (np.uint64(d[p + _U1]) << np.uint64(8))
        | (np.uint64(d[p + np.uint64(2)]) << np.uint64(16))
        | (np.uint64(d[p + np.uint64(3)]) << np.uint64(24))
    )


@njit(cache=True, nogil=True, inline="always")
def _round(acc: Any, lane: Any) -> Any:
    acc += lane * _P2
    return _rotl(acc, 31) * _P1


@njit(cache=True, nogil=True, inline="always")
def _merge(acc: Any, val: Any) -> Any:
    acc ^= _round(_U0, val)
    return acc * _P1 + _P4


@njit(cache=True, nogil=True)
def xxh64_range(d: Any, p: Any, end: Any, seed: Any) -> Any:
    """XXH64 of ``d[p:end]``."""
    length = end - p
    if length >= _U32:
        v1 = seed + _P1 + _P2
        v2 = seed + _P2
        v3 = seed
        v4 = seed - _P1
        while p + _U32 <= end:
            v1 = _round(v1, _read64(d, p))
            v2 = _round(v2, _read64(d, p + _U8))
            v3 = _round(v3, _read64(d, p + np.uint64(16)))
            v4 = _round(v4, _read64(d, p + np.uint64(24)))
            p += _U32
        h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
        h = _merge(h, v1)
        h = _merge(h, v2)
        h = _merge(h, v3)
        h = _merge(h, v4)
    else:
        h = seed + _P5
    h += length
    while p + _U8 <= end:
        h ^= _round(_U0, _read64(d, p))
        h = _rotl(h, 27) * _P1 + _P4
        p += _U8
    if p + _U4 <= end:
        h ^= _read32(d, p) * _P1
        h = _rotl(h, 23) * _P2 + _P3
        p += _U4
    while p < end:
        h ^= np.uint64(d[p]) * _P5
        h = _rotl(h, 11) * _P1
        p += _U1
    h ^= h >> np.uint64(33)
    h *= _P2
    h ^= h >> np.uint64(29)
    h *= _P3
    h ^= h >> np.uint64(32)
    return h


@njit(cache=True, nogil=True)
def hash_items(offsets: Any, data: Any, seed: Any) -> Any:
    n = len(offsets) - 1
    out = np.empty(n, dtype=np.uint64)
    for i in range(n):
        out[i] = xxh64_range(data, offsets[i], offsets[i + 1], seed)
    return out


@njit(cache=True, nogil=True)
def pair_sums(key_offsets: Any, keys: Any, value_offsets: Any, values: Any, value_seed: Any) -> Any:
    """(sum of pair hashes, total bytes, each key's hash)."""
    n = len(key_offsets) - 1
    key_hashes = np.empty(n, dtype=np.uint64)
    total = _U0
    nbytes = _U0
    for i in range(n):
        hk = xxh64_range(keys, key_offsets[i], key_offsets[i + 1], _U0)
        hv = xxh64_range(values, value_offsets[i], value_offsets[i + 1], value_seed)
        key_hashes[i] = hk
        x = hk * _C1 + _rotl(hv, 17) + _C3
        x = (x ^ (x >> np.uint64(30))) * _C2
        x = (x ^ (x >> np.uint64(27))) * _C3
        total += x ^ (x >> np.uint64(31))
        nbytes += (key_offsets[i + 1] - key_offsets[i]) + (value_offsets[i + 1] - value_offsets[i])
    return total, nbytes, key_hashes
