"""Equality deletes' row matching and what is refused (``warehouse.equality_deletes``);
their planning and application against Iceberg's own reader are in
``tests/integration/test_load_engines.py``."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.manifest import FileFormat
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, StructType

from bulldozer.warehouse.equality_deletes import DeletedKeys, Unappliable, _equality_fields


def _deleted(names: list[str], deleted: dict[str, pa.Array], batch: dict[str, pa.Array]) -> list[bool]:
    keys = DeletedKeys(names, pa.table(deleted))
    return keys.deleted(pa.RecordBatch.from_pydict(batch)).to_pylist()


def test_a_row_is_deleted_when_all_its_equality_values_equal_a_deleted_rows_a_null_equal_to_a_null() -> None:
    deleted = {"region": pa.array(["us", "eu", "eu"]), "name": pa.array([None, "a", "b"])}
    batch = {
        "region": pa.array(["us", "us", "eu", "eu", "eu", "us", None]),
        "name": pa.array([None, "a", "a", "b", None, "b", None]),
        "other": pa.array(range(7)),
    }
    assert _deleted(["region", "name"], deleted, batch) == [True, False, True, True, False, False, False]


def test_one_column_and_values_the_deletes_lack() -> None:
    deleted = {"id": pa.array([3, 5, 5, 7], pa.int64())}
    batch = {"id": pa.array([1, 3, None, 5, 8, 7], pa.int64())}
    assert _deleted(["id"], deleted, batch) == [False, True, False, True, False, True]


def test_integers_dates_and_timestamps_with_nulls_mixed_with_strings() -> None:
    """Integer-like columns are searched in the deleted values sorted, others hashed; a null
    in either kind equals a null; a batch's narrower integers match the deletes' wider."""
    import datetime as dt

    day, noon = dt.date(2026, 1, 2), dt.datetime(2026, 1, 2, 12)
    deleted = {
        "n": pa.array([1, None, 3], pa.int64()),
        "d": pa.array([day, day, None], pa.date32()),
        "t": pa.array([noon, None, noon], pa.timestamp("us")),
        "s": pa.array(["a", "b", None]),
    }
    batch = {
        "n": pa.array([1, None, 3, 3, 1, None], pa.int32()),
        "d": pa.array([day, day, None, None, day, day], pa.date32()),
        "t": pa.array([noon, None, noon, noon, noon, noon], pa.timestamp("us")),
        "s": pa.array(["a", "b", None, "a", "b", "b"]),
    }
    assert _deleted(["n", "d", "t", "s"], deleted, batch) == [True, True, True, False, False, False]
    assert _deleted(["n"], {"n": pa.array([None], pa.int64())}, {"n": pa.array([None, 0], pa.int64())}) == [
        True,
        False,
    ]


def test_many_columns_fold_without_overflow() -> None:
    """Four columns of a thousand distinct values each: the folded numbers are renumbered at
    each step, or they would pass 2**63."""
    n = 1_000
    deleted = {f"c{i}": pa.array([(j * (i + 1)) % n for j in range(n)], pa.int64()) for i in range(4)}
    batch = {k: pa.concat_arrays([v, pa.array([n + 1] * 3, pa.int64())]) for k, v in deleted.items()}
    found = _deleted([f"c{i}" for i in range(4)], deleted, batch)
    assert found == [True] * n + [False] * 3


def test_a_batch_in_another_arrow_type_of_the_same_values_matches() -> None:
    """A file Spark wrote reads as ``string``, one pyiceberg wrote as ``large_string``; a UUID
    may read as Arrow's extension type or its storage; a column dictionary-encoded."""
    deleted = {"s": pa.array(["a", "b"], pa.large_string())}
    assert _deleted(["s"], deleted, {"s": pa.array(["b", "c"], pa.string())}) == [True, False]
    one, two = uuid.uuid4().bytes, uuid.uuid4().bytes
    stored = pa.array([one], pa.binary(16))
    as_uuid = pa.ExtensionArray.from_storage(pa.uuid(), pa.array([two, one], pa.binary(16)))
    assert _deleted(["u"], {"u": stored}, {"u": as_uuid}) == [False, True]
    encoded = pa.array(["x", "y", "x"]).dictionary_encode()
    assert _deleted(["s"], {"s": pa.array(["x"])}, {"s": encoded}) == [True, False, True]


def test_a_string_found_by_its_hash_is_confirmed_equal(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a hash as weak as a string's length: a batch's value of a deleted value's hash is
    not deleted unless it is equal; deleted values sharing a hash are looked up by hashing."""
    import numpy as np

    from bulldozer.codec import digest

    monkeypatch.setattr(digest, "key_hashes", lambda a: np.array([len(v or b"") for v in a.to_pylist()], np.uint64))
    deleted = {"s": pa.array(["a", "bb"], pa.binary())}
    assert _deleted(["s"], deleted, {"s": pa.array(["a", "x", "bb", "yy", None], pa.binary())}) == [
        True,
        False,
        True,
        False,
        False,
    ]
    shared = {"s": pa.array(["a", "b"], pa.binary())}
    assert _deleted(["s"], shared, {"s": pa.array(["b", "x", "a"], pa.binary())}) == [True, False, True]


def test_values_without_images_are_looked_up_by_arrows_hashing() -> None:
    """Decimals and booleans have no int64 images: Arrow's ``index_in`` finds them, a null
    equal to a null, in a tuple with a column found in the compiled set."""
    import decimal

    price = pa.array([decimal.Decimal("1.50"), None, decimal.Decimal("2.00")], pa.decimal128(5, 2))
    deleted = {"p": price, "f": pa.array([True, False, None]), "n": pa.array([1, 2, 3], pa.int64())}
    batch = {
        "p": pa.array(
            [decimal.Decimal("1.50"), None, decimal.Decimal("2.00"), decimal.Decimal("1.5")], pa.decimal128(5, 2)
        ),
        "f": pa.array([True, False, None, False]),
        "n": pa.array([1, 2, 3, 1], pa.int64()),
    }
    assert _deleted(["p", "f", "n"], deleted, batch) == [True, True, True, False]


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_image_set_finds_each_value_at_its_position(seed: int) -> None:
    """``ImageSet`` against a search of the values sorted: the extremes of int64, negatives,
    sequential ids and random ones, present or not; an empty set; a value twice refused."""
    import numpy as np

    from bulldozer._kernels import ImageSet

    rng = np.random.default_rng(seed)
    extremes = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0], np.int64)
    values = np.unique(np.concatenate([extremes, np.arange(1000, 1000 + 5_000), rng.integers(-(2**62), 2**62, 5_000)]))
    values = values[rng.permutation(len(values))]
    images = ImageSet(values)
    assert len(images) == len(values)
    wanted = np.concatenate(
        [values[rng.integers(0, len(values), 3_000)], rng.integers(-(2**63), 2**63 - 1, 3_000), extremes]
    )
    out = np.empty(len(wanted), np.int64)
    images.find(wanted, out)
    where = {int(v): i for i, v in enumerate(values)}
    assert out.tolist() == [where.get(int(v), -1) for v in wanted]
    ImageSet(np.array([], np.int64)).find(wanted, out)
    assert (out == -1).all()
    with pytest.raises(ValueError, match=r"^image set: value 2 \(7\) is there twice$"):
        ImageSet(np.array([7, 8, 7], np.int64))
    with pytest.raises(ValueError, match="3 values to find, 2 positions"):
        images.find(np.zeros(3, np.int64), np.zeros(2, np.int64))


SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "weight", DoubleType()),
    NestedField(3, "address", StructType(NestedField(4, "city", StringType()))),
    NestedField(5, "name", StringType()),
)


def _file(ids: list[int] | None, file_format: FileFormat = FileFormat.PARQUET) -> SimpleNamespace:
    return SimpleNamespace(file_path="s3://lake/t/data/d.parquet", file_format=file_format, equality_ids=ids)


def test_the_equality_fields_are_the_schemas_top_level_fields_in_id_order() -> None:
    fields = _equality_fields(SCHEMA, _file([5, 1, 5]), {"PARQUET", "ORC"})
    assert [f.name for f in fields] == ["id", "name"]


@pytest.mark.parametrize(
    ("ids", "file_format", "said"),
    [
        ([9], FileFormat.PARQUET, r"^an equality delete file deleting by field id 9, a column the table's schema no "),
        ([1, 4], FileFormat.PARQUET, r"^an equality delete file deleting by field id 4, a field inside another \("),
        ([2], FileFormat.PARQUET, r"^an equality delete file deleting by the floating-point column 'weight' \("),
        ([], FileFormat.PARQUET, r"^an equality delete file that names no equality field \("),
        ([1], FileFormat.AVRO, r"^an equality delete file in Avro \(s3://lake/t/data/d\.parquet\)$"),
    ],
)
def test_what_cannot_be_applied_exactly_is_refused(ids: list[int], file_format: FileFormat, said: str) -> None:
    with pytest.raises(Unappliable, match=said):
        _equality_fields(SCHEMA, _file(ids, file_format), {"PARQUET", "ORC"})


def test_a_tasks_equality_delete_files_are_among_its_files_checked_and_verified() -> None:
    """``task_files`` is what the location check (``checked_tasks``) and the committed-file
    check (``verify_task_files``, the Spark engine's by-key read) go through."""
    from bulldozer.warehouse.equality_deletes import EqualityDeletesTask, EqualityGroup
    from bulldozer.warehouse.files import task_files

    data, positional, by_id, by_name = (SimpleNamespace(file_path=p) for p in ("d", "p", "e1", "e2"))
    plain = SimpleNamespace(file=data, delete_files=[positional], residual=None)
    groups = (EqualityGroup((SCHEMA.fields[0],), (by_id,)), EqualityGroup((SCHEMA.fields[3],), (by_name,)))
    task = EqualityDeletesTask(plain, groups)
    assert [f.file_path for f in task_files([task])] == ["d", "p", "e1", "e2"]
    assert [f.file_path for f in task_files([plain])] == ["d", "p"]


def test_the_cache_keeps_the_groups_read_last_and_pickles_empty() -> None:
    """Two groups a task (by id, and by region and name) alternate: each stays read once."""
    import pickle

    from bulldozer.warehouse.equality_deletes import EqualityDeletesCache

    cache = EqualityDeletesCache()
    keys = {n: DeletedKeys(["id"], pa.table({"id": pa.array([n], pa.int64())})) for n in range(6)}
    for n in range(4):
        cache.put(n, keys[n])
    assert cache.get(0) is keys[0]  # now the latest used
    cache.put(4, keys[4])
    assert cache.get(1) is None and all(cache.get(n) is keys[n] for n in (0, 2, 3, 4))
    assert pickle.loads(pickle.dumps(cache)).get(0) is None


def _bounded(
    field_id: int, kind: Any, low: Any, high: Any, nulls: int | None = 0, bounds: bool = True
) -> SimpleNamespace:
    """A data or delete file's metadata: a field's bounds and null count."""
    from pyiceberg.conversions import to_bytes

    return SimpleNamespace(
        lower_bounds={field_id: to_bytes(kind, low)} if bounds else {},
        upper_bounds={field_id: to_bytes(kind, high)} if bounds else {},
        null_value_counts=None if nulls is None else {field_id: nulls},
    )


@pytest.mark.parametrize(
    ("data", "deletes", "may"),
    [
        ((10, 20, 0), (21, 30, 0), False),  # ranges apart
        ((10, 20, 0), (20, 30, 0), True),  # touching
        ((10, 20, 0), (0, 9, 3), False),  # the deletes' nulls match no null of the data's
        ((10, 20, 2), (0, 9, 1), True),  # both may hold a null: a null equals a null
        ((10, 20, None), (0, 9, None), True),  # null counts not known
        ((10, 20, 0), (0, 9, 0, False), True),  # no bounds
    ],
)
def test_a_delete_file_applies_only_where_the_files_metadata_allow_a_match(
    data: tuple[Any, ...], deletes: tuple[Any, ...], may: bool
) -> None:
    """As Iceberg's Java reader decides (``DeleteFileIndex.canContainEqDeletesForFile``)."""
    from bulldozer.warehouse.equality_deletes import may_match

    field = SCHEMA.fields[0]  # id, a long
    assert may_match(_bounded(1, LongType(), *data), _bounded(1, LongType(), *deletes), (field,)) is may


def test_a_delete_by_several_fields_matches_no_file_one_of_whose_ranges_it_misses() -> None:
    from bulldozer.warehouse.equality_deletes import may_match

    id_, name = SCHEMA.fields[0], SCHEMA.fields[3]

    def files(name_low: str, name_high: str) -> SimpleNamespace:
        ids, names = _bounded(1, LongType(), 0, 100), _bounded(5, StringType(), name_low, name_high)
        return SimpleNamespace(
            lower_bounds={**ids.lower_bounds, **names.lower_bounds},
            upper_bounds={**ids.upper_bounds, **names.upper_bounds},
            null_value_counts={**ids.null_value_counts, **names.null_value_counts},
        )

    assert may_match(files("a", "m"), files("k", "z"), (id_, name))
    assert not may_match(files("a", "m"), files("n", "z"), (id_, name))
    assert may_match(files("a", "é"), files("z", "zz"), (id_, name))  # by code point: é after z
    # a bound that is not the field's type (damaged) decides nothing
    damaged = files("n", "z")
    damaged.lower_bounds[5] = b"\xff\xfe"
    assert may_match(files("a", "m"), damaged, (id_, name))
