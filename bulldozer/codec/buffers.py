"""Arrow binary arrays as plain numpy buffers for the compiled kernels (encoder, digest),
and the thread their warm-up runs on."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["EMPTY_BYTES", "binary_array", "binary_view", "in_background"]

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


def binary_array(items: list[bytes], type: pa.DataType | None = None) -> pa.Array:
    """A binary (or string) Arrow array of ``items``, built from buffers. Not ``pa.array``:
    converting a Python list makes pyarrow import pandas to check for pandas objects, which
    cost a run ≈ 0.5 s of CPU (and the DAL as much) when the kernels' warm-up did it."""
    import pyarrow as pa

    type = type or pa.large_binary()
    wide = pa.types.is_large_binary(type) or pa.types.is_large_string(type)
    offsets = np.zeros(len(items) + 1, dtype=np.int64 if wide else np.int32)
    np.cumsum([len(item) for item in items], out=offsets[1:])
    data = pa.py_buffer(b"".join(items))
    return pa.Array.from_buffers(type, len(items), [None, pa.py_buffer(offsets), data])


def in_background(fn: Callable[[], None], name: str) -> None:
    """Run ``fn`` on a daemon thread, ignoring its errors (for best-effort warm-ups)."""

    def run() -> None:
        with contextlib.suppress(Exception):
            fn()

    threading.Thread(target=run, name=name, daemon=True).start()
