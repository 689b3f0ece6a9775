"""The order-independent digest shared by the runner and the DAL."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bulldozer.codec.digest import Digest, digest_arrays, digest_pairs, duplicate_hashes

PAIRS = st.lists(st.tuples(st.binary(min_size=1, max_size=40), st.binary(max_size=200)), max_size=60)


@given(PAIRS)
def test_order_does_not_matter_and_arrays_agree(pairs: list[tuple[bytes, bytes]]) -> None:
    shuffled = pairs[:]
    random.Random(1).shuffle(shuffled)
    a = digest_pairs(pairs)
    assert a == digest_pairs(shuffled)
    arrays = digest_arrays(
        pa.array([k for k, _ in pairs], pa.binary()), pa.array([v for _, v in pairs], pa.large_binary())
    )
    assert arrays == a and arrays.bytes == a.bytes == sum(len(k) + len(v) for k, v in pairs)


@given(PAIRS, st.integers(0, 59))
def test_batches_add_up(pairs: list[tuple[bytes, bytes]], cut: int) -> None:
    total = Digest()
    total.add_pairs(pairs[:cut])
    total.add_pairs(pairs[cut:])
    assert total == digest_pairs(pairs)


def test_a_lost_changed_or_moved_byte_changes_the_digest() -> None:
    pairs = [(b"k%d" % i, b"value %d" % i) for i in range(1000)]
    base = digest_pairs(pairs)
    assert digest_pairs(pairs[:-1]) != base
    assert digest_pairs([*pairs[:-1], (pairs[-1][0], b"value 998")]) != base
    assert digest_pairs([(b"ab", b"c"), *pairs[1:]]) != digest_pairs([(b"a", b"bc"), *pairs[1:]])  # boundaries count
    assert digest_pairs([(b"v", b"k")]) != digest_pairs([(b"k", b"v")])  # key and value are not interchangeable


def test_sliced_arrays() -> None:
    keys = pa.array([b"a", b"bb", b"ccc", b"dddd"], pa.large_binary())
    values = pa.array([b"1", b"22", b"333", b"4444"], pa.large_binary())
    assert digest_arrays(keys.slice(1, 2), values.slice(1, 2)) == digest_pairs([(b"bb", b"22"), (b"ccc", b"333")])


@given(PAIRS)
def test_digest_and_key_hashes_in_one_pass(pairs: list[tuple[bytes, bytes]]) -> None:
    from bulldozer.codec.digest import digest_and_key_hashes, key_hashes

    keys = pa.array([k for k, _ in pairs], pa.large_binary())
    values = pa.array([v for _, v in pairs], pa.large_binary())
    digest, hashes = digest_and_key_hashes(keys, values)
    assert digest == digest_pairs(pairs)
    assert hashes.tolist() == key_hashes(keys).tolist()


@given(st.binary(max_size=300), st.sampled_from([0, 1, 0x5BD1E995, 2**64 - 1]))
def test_the_compiled_hash_is_xxh64(data: bytes, seed: int) -> None:
    import xxhash

    from bulldozer.codec.digest import xxh64

    assert xxh64(data, seed) == xxhash.xxh64_intdigest(data, seed)


@given(PAIRS)
def test_the_dal_columnar_form_agrees(pairs: list[tuple[bytes, bytes]]) -> None:
    from bulldozer.codec.digest import digest_columns

    keys, values = [k for k, _ in pairs], [v for _, v in pairs]
    columns = digest_columns(b"".join(keys), [len(k) for k in keys], b"".join(values), [len(v) for v in values])
    assert columns == digest_pairs(pairs) and columns.bytes == digest_pairs(pairs).bytes


def _repeated_by_sorting(pieces: list[np.ndarray[Any, Any]]) -> set[int]:
    """The plain definition: sort every hash, keep those equal to their predecessor, the
    first ten of them."""
    every = np.sort(np.concatenate(pieces)) if pieces else np.empty(0, dtype=np.uint64)
    repeated = every[1:][every[1:] == every[:-1]]
    return {int(h) for h in repeated[:10]}


@pytest.mark.parametrize("seed", range(6))
def test_the_compiled_duplicate_check_is_the_sorting_definition(seed: int) -> None:
    """Pieces of random hashes with repeats planted within a piece, across pieces, three
    times over, at the ends of the range and more than ten of them; and none at all."""
    rng = np.random.default_rng(seed)
    pieces = [rng.integers(0, 2**64 - 1, int(rng.integers(0, 5_000)), dtype=np.uint64, endpoint=True) for _ in range(7)]
    assert duplicate_hashes(pieces) == _repeated_by_sorting(pieces)
    flat = [p for p in pieces if len(p)]
    for _ in range(int(rng.integers(1, 15))):
        a, b = flat[int(rng.integers(0, len(flat)))], flat[int(rng.integers(0, len(flat)))]
        a[int(rng.integers(0, len(a)))] = b[int(rng.integers(0, len(b)))]
    flat[0][:3] = 2**64 - 1
    flat[-1][-2:] = 0
    assert duplicate_hashes(pieces) == _repeated_by_sorting(pieces)
    assert duplicate_hashes([pieces[0][:1]]) == set() and duplicate_hashes([]) == set()
