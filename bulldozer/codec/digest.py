"""An order-independent digest of (key, value) pairs, computed in compiled code.

Each pair hashes to 64 bits: XXH64 of the key (seed 0) and of the value (another seed),
mixed with a splitmix64 finaliser. The digest is the sum of the pair hashes modulo 2**64.
Sums do not depend on order, so the runner (which sends batches in any order), the DAL
as it stores each batch, and a DAL scanning what it stored (in key order) all compute the
same number, and a lost or altered pair changes it. Not a cryptographic hash: it detects
loss, not tampering.

The hashing runs in compiled code (``bulldozer._kernels``: XXH64 from the ``xxhash-rust``
crate) over Arrow-style buffers (offsets + bytes), with no Python object per item and
without the GIL; the tests check it against the ``xxhash`` library's own XXH64, and Go's
digest of the same pairs against it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from bulldozer import _kernels
from bulldozer.kv.v1 import shared

if TYPE_CHECKING:
    import numpy as np

# numpy is imported by the functions that hash, not here: the DAL imports this module for
# ``Digest`` at start-up, and on the native data plane it never hashes (0.07 s of its start)

__all__ = [
    "Digest",
    "digest_and_key_hashes",
    "digest_arrays",
    "digest_buffers",
    "digest_columns",
    "digest_lists",
    "digest_pairs",
    "duplicate_hashes",
    "key_hashes",
    "seeded_hashes",
    "xxh64",
]

_MASK = (1 << 64) - 1
_VALUE_SEED = shared.DIGEST_VALUE_SEED  # with the mixing constants: proto/bulldozer/kv/v1/shared.yaml


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

    def negated(self) -> Digest:
        """What removes these pairs from a running digest when added to it."""
        return Digest(-self.count, (-self.value) & _MASK, -self.bytes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Digest) and (self.count, self.value) == (other.count, other.value)

    def __hash__(self) -> int:
        return hash((self.count, self.value))

    def __repr__(self) -> str:
        return f"Digest(count={self.count}, value={self.value:#018x}, bytes={self.bytes})"


def _offsets(lengths: Any) -> np.ndarray[Any, Any]:
    import numpy as np

    offsets = np.zeros(len(lengths) + 1, dtype=np.uint64)
    np.cumsum(np.asarray(lengths, dtype=np.uint64), out=offsets[1:])
    return offsets


def _bytes_view(blob: Any) -> np.ndarray[Any, Any]:
    import numpy as np

    return np.frombuffer(blob, dtype=np.uint8) if len(blob) else np.zeros(0, dtype=np.uint8)


def _buffers(items: Sequence[bytes]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    import numpy as np

    return _offsets(np.fromiter(map(len, items), dtype=np.uint64, count=len(items))), _bytes_view(b"".join(items))


def digest_buffers(
    key_offsets: np.ndarray[Any, Any],
    keys: np.ndarray[Any, Any],
    value_offsets: np.ndarray[Any, Any],
    values: np.ndarray[Any, Any],
) -> tuple[Digest, np.ndarray[Any, Any]]:
    """Digest of pairs laid out as Arrow-style buffers (uint64 offsets into uint8 data),
    and each key's hash."""
    import numpy as np

    hashes = np.empty(len(key_offsets) - 1, dtype=np.uint64)
    total, nbytes = _kernels.pair_sums(key_offsets, keys, value_offsets, values, _VALUE_SEED, hashes)
    return Digest(len(hashes), total, nbytes), hashes


def digest_columns(keys: bytes, key_lengths: Any, values: bytes, value_lengths: Any) -> Digest:
    """Digest of a columnar batch as the DAL receives it (two blobs and their lengths)."""
    return digest_buffers(_offsets(key_lengths), _bytes_view(keys), _offsets(value_lengths), _bytes_view(values))[0]


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
    return digest_lists([k for k, _ in pairs], [v for _, v in pairs])


def digest_lists(keys: Sequence[bytes], values: Sequence[bytes]) -> Digest:
    """Digest of pairs given as two equal-length lists (``keys[i]`` goes with ``values[i]``)."""
    key_offsets, key_data = _buffers(keys)
    value_offsets, value_data = _buffers(values)
    return digest_buffers(key_offsets, key_data, value_offsets, value_data)[0]


def digest_arrays(keys: Any, values: Any) -> Digest:
    """Digest of pairs held in two Arrow binary arrays (the encoder's output)."""
    return digest_and_key_hashes(keys, values)[0]


def digest_and_key_hashes(keys: Any, values: Any) -> tuple[Digest, np.ndarray[Any, Any]]:
    """The digest of the pairs and the hash of each key (for duplicate detection), hashing
    every key once. Null entries hash as whatever bytes back them (the encoder makes none)."""
    from bulldozer.codec.buffers import binary_view

    if len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys but {len(values)} values")
    key_offsets, key_data = binary_view(keys)
    value_offsets, value_data = binary_view(values)
    return digest_buffers(key_offsets, key_data, value_offsets, value_data)


def key_hashes(keys: Any) -> np.ndarray[Any, Any]:
    """A 64-bit hash of each key in an Arrow binary array (for duplicate detection)."""
    import numpy as np

    from bulldozer.codec.buffers import binary_view

    offsets, data = binary_view(keys)
    hashes = np.empty(len(offsets) - 1, dtype=np.uint64)
    _kernels.hash_items(offsets, data, 0, hashes)
    return hashes


def seeded_hashes(items: Sequence[bytes], seed: int) -> np.ndarray[Any, Any]:
    """XXH64(item, seed) of each byte string (a sample chosen by key: ``StorageEngine.sample``)."""
    import numpy as np

    offsets, data = _buffers(items)
    hashes = np.empty(len(items), dtype=np.uint64)
    _kernels.hash_items(offsets, data, seed & _MASK, hashes)
    return hashes


def duplicate_hashes(hashes: Sequence[np.ndarray[Any, Any]]) -> set[int]:
    """Up to ten key hashes that occur more than once in ``hashes`` (uint64 pieces, sorted or
    not), compiled (``_kernels.repeated_hashes``)."""
    import numpy as np

    pieces = [np.ascontiguousarray(piece, dtype=np.uint64) for piece in hashes]
    return set(_kernels.repeated_hashes(pieces, 10))


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of one byte string, through the same code (for tests and tools)."""
    return _kernels.xxh64(data, seed)
