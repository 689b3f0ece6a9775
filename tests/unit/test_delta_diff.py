"""The delta's diff in compiled code (bulldozer._kernels.diff_pairs through load.delta._Diff)
against the plain Python definition: deleted, changed and fresh keys, each in key order."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from bulldozer.errors import DuplicateKeyError
from bulldozer.load.delta import _Diff


def _arrays(pairs: list[tuple[bytes, bytes]]) -> tuple[Any, Any]:
    return pa.array([k for k, _ in pairs], pa.large_binary()), pa.array([v for _, v in pairs], pa.large_binary())


def _reference(old: dict[bytes, bytes], new: dict[bytes, bytes]) -> tuple[list[bytes], list[bytes], list[bytes], int]:
    deleted = sorted(k for k in old if k not in new)
    changed = sorted(k for k in new if k in old and old[k] != new[k])
    fresh = sorted(k for k in new if k not in old)
    return deleted, changed, fresh, sum(1 for k in new if k in old and old[k] == new[k])


@pytest.mark.parametrize("seed", range(6))
def test_the_compiled_diff_is_the_python_definition(seed: int) -> None:
    rng = random.Random(seed)
    universe = [rng.randbytes(rng.randrange(0, 12)) for _ in range(3_000)]  # empty keys, prefixes, repeats
    keys = list(dict.fromkeys(universe))
    rng.shuffle(keys)
    old = {k: rng.choice([b"", b"a", b"b", rng.randbytes(4)]) for k in keys[: rng.randrange(0, 2_000)]}
    new = {
        k: (v if rng.random() < 0.5 else rng.choice([b"", b"a", b"c"])) for k, v in old.items() if rng.random() < 0.8
    }
    new |= {k: rng.randbytes(3) for k in keys[2_000 : 2_000 + rng.randrange(0, 500)]}
    old_pairs, new_pairs = list(old.items()), list(new.items())
    rng.shuffle(old_pairs)
    rng.shuffle(new_pairs)
    # a slice of a longer array (its offsets do not start at 0), as combined chunks can be
    padded_k, padded_v = _arrays([(b"x", b"y"), *new_pairs])
    diff = _Diff.of(None, *_arrays(old_pairs), padded_k[1:], padded_v[1:])  # type: ignore[arg-type]
    deleted, changed, fresh, unchanged = _reference(old, new)
    assert diff.deleted.to_pylist() == deleted
    assert diff.changed.to_pylist() == changed
    assert diff.fresh.to_pylist() == fresh
    assert diff.unchanged == unchanged
    assert diff.doomed.to_pylist() == sorted(deleted + changed)  # deleted first, in key order
    assert [new_pairs[i][0] for i in diff.puts] == changed + fresh


def test_keys_alike_in_their_first_eight_bytes_are_ordered_by_all_of_them() -> None:
    """The kernel sorts by a key's first eight bytes as a number and compares the rest only
    on a tie: keys that share eight bytes, and keys that differ by trailing zero bytes (equal
    once zero-padded to eight), still come out in byte order."""
    rng = random.Random(5)
    stems = [b"", b"a", b"\x00", b"abcdefgh", b"abcdefg\x00", b"\xff" * 8]
    keys = list(
        dict.fromkeys(
            stem + tail for stem in stems for tail in (b"", b"\x00", b"\x00\x00", b"\x01", b"zz", b"\x00" * 9)
        )
    )
    old = {k: rng.choice([b"a", b"b"]) for k in keys if rng.random() < 0.7}
    new = {k: rng.choice([b"a", b"b"]) for k in keys if rng.random() < 0.7}
    old_pairs, new_pairs = list(old.items()), list(new.items())
    rng.shuffle(old_pairs)
    rng.shuffle(new_pairs)
    diff = _Diff.of(None, *_arrays(old_pairs), *_arrays(new_pairs))  # type: ignore[arg-type]
    deleted, changed, fresh, unchanged = _reference(old, new)
    assert (diff.deleted.to_pylist(), diff.changed.to_pylist(), diff.fresh.to_pylist()) == (deleted, changed, fresh)
    assert diff.unchanged == unchanged and diff.doomed.to_pylist() == sorted(deleted + changed)


def test_a_repeated_key_on_either_side_makes_no_diff(monkeypatch: pytest.MonkeyPatch) -> None:
    import bulldozer.load.delta as delta

    seen: list[list[bytes]] = []

    def duplicates(_job: Any, keys: list[bytes]) -> DuplicateKeyError:
        seen.append(keys)
        return DuplicateKeyError("duplicate keys")

    monkeypatch.setattr(delta, "_duplicates", duplicates)
    twice = [(b"k1", b"v"), (b"k2", b"v"), (b"k1", b"w")]
    once = [(b"k1", b"v"), (b"k3", b"v")]
    for old, new in ((once, twice), (twice, once)):
        with pytest.raises(DuplicateKeyError):
            _Diff.of(None, *_arrays(old), *_arrays(new))  # type: ignore[arg-type]
    assert seen == [[b"k1"], [b"k1"]]
    empty = _Diff.of(None, *_arrays([]), *_arrays([]))  # type: ignore[arg-type]
    assert (len(empty.deleted), len(empty.changed), len(empty.fresh), empty.unchanged) == (0, 0, 0, 0)


@pytest.mark.parametrize(
    ("puts", "batch_size", "in_flight", "expected"),
    [
        (70_000, 100_000, 4, 17_500),  # a warm delta's puts: four batches, one per slot
        (70_001, 100_000, 4, 17_501),  # rounded up: still four batches, never five
        (3, 100_000, 4, 1),  # fewer puts than slots: one record each
        (0, 100_000, 4, 1),  # nothing to put: a valid writer all the same
        (1_000_000, 100_000, 4, 100_000),  # many: never past the spec's batch_size
        (70_000, 100_000, 1, 70_000),  # one slot: one batch
    ],
)
def test_a_deltas_puts_fill_every_batch_in_flight(puts: int, batch_size: int, in_flight: int, expected: int) -> None:
    from bulldozer.load.delta import put_batch_records
    from bulldozer.spec.models import WriteTuning

    write = WriteTuning(batch_size=batch_size, in_flight_batches=in_flight)
    per_batch = put_batch_records(puts, write)
    assert per_batch == expected
    assert per_batch <= batch_size
    assert -(-puts // per_batch) <= max(in_flight, -(-puts // batch_size))  # no more batches than needed


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_null_counts_of_records_are_their_absent_fields(seed: int) -> None:
    """``absent_fields`` (a delta's null counts of the base records it takes by key): per
    field number, the records without it, whatever its wire type and value (a zero is
    present), numbers beyond a byte, in a slice of a longer array."""
    from bulldozer import _kernels
    from bulldozer.codec.buffers import binary_view

    rng = random.Random(seed)
    fields = {1: 0, 2: 2, 3: 1, 5: 5, 300: 2, 19_999: 0}  # number: wire type
    payloads = {0: lambda: _varint(rng.choice([0, 1, 300, 2**63])), 1: lambda: rng.randbytes(8)}
    payloads |= {
        5: lambda: rng.randbytes(4),
        2: lambda: (lambda b: _varint(len(b)) + b)(rng.randbytes(rng.randrange(0, 200))),
    }
    records, absent = [], dict.fromkeys(fields, 0)
    for _ in range(500):
        record = b""
        for number, wire in fields.items():
            if rng.random() < 0.3:
                absent[number] += 1
                continue
            record += _varint(number << 3 | wire) + payloads[wire]()
        records.append(record)
    array = pa.array([b"junk", *records], pa.large_binary())[1:]
    numbers = [*fields, 4]  # 4: in no record
    assert _kernels.absent_fields(*binary_view(array), numbers) == [*absent.values(), len(records)]
    truncated = pa.array([records[0], _varint(2 << 3 | 2) + _varint(10) + b"abc"], pa.large_binary())
    with pytest.raises(ValueError, match="record 1 is not a protobuf message"):
        _kernels.absent_fields(*binary_view(truncated), [2])
