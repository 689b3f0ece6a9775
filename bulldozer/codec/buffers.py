"""Arrow binary arrays as plain numpy buffers for the compiled kernels (encoder, digest)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["EMPTY_BYTES", "binary_view"]

EMPTY_BYTES = np.zeros(0, dtype=np.uint8)


def binary_view(arr: pa.Array) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The offsets (covering this array's rows only, as uint64) and the data buffer of a
    binary or string array, as numpy arrays. Null rows read as whatever bytes back them.
    (pyarrow is imported here, not at module level: ``bulldozer.kv`` imports the digest,
    and commands that never touch Arrow should not pay for loading it.)"""
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        wide = True
    elif pa.types.is_binary(t) or pa.types.is_string(t):
        wide = False
    else:
        raise TypeError(f"not a binary array: {t}")
    buffers = arr.buffers()
    if len(arr):
        raw = np.frombuffer(buffers[1], dtype=np.int64 if wide else np.int32)[arr.offset : arr.offset + len(arr) + 1]
        offsets = raw.view(np.uint64) if wide else raw.astype(np.uint64)
    else:
        offsets = np.zeros(1, dtype=np.uint64)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else EMPTY_BYTES
    return offsets, data
