# The compiled kernels (native/kernels/src/lib.rs, built by the install). Arrays go through
# the buffer protocol: numpy arrays (uint8 masks and bytes, uint64 offsets and outputs).
from typing import Any

def encode(layout: tuple[Any, ...], n: int, offsets: Any) -> bytes: ...
def decimals(low: Any, valid: Any, scale: int, offsets: Any) -> bytes | None: ...
def xxh64(data: Any, seed: int = 0) -> int: ...
def hash_items(offsets: Any, data: Any, seed: int, out: Any) -> None: ...
def pair_sums(
    key_offsets: Any, keys: Any, value_offsets: Any, values: Any, value_seed: int, key_hashes: Any
) -> tuple[int, int]: ...
def diff_pairs(
    old_key_offsets: Any,
    old_keys: Any,
    old_value_offsets: Any,
    old_values: Any,
    new_key_offsets: Any,
    new_keys: Any,
    new_value_offsets: Any,
    new_values: Any,
) -> tuple[bytes, bytes, bytes, bytes, int, bytes, bytes]: ...
