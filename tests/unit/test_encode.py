"""The columnar encoder: byte-identical to protobuf's serializer, and exact round trips
(Arrow → encode → decode) for every supported type, nulls included."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import uuid
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from bulldozer.errors import SourceDataError
from bulldozer.load.encoder.encode import RowEncoder
from bulldozer.schema.decode import decode_row
from bulldozer.schema.job import build_job_schema
from tests.schemas import ALL_TYPES, spec_for


def _normalize(value: Any) -> Any:
    """Compare maps regardless of entry order; floats by bits (NaN == NaN)."""
    if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):
        return sorted((_normalize(v) for v in value), key=repr)
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_normalize(v) for v in value)
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC)
    if isinstance(value, uuid.UUID):
        return value.bytes
    return value


def _storage(t: pa.DataType) -> pa.DataType:
    """``t`` with every extension type (uuid) replaced by its storage type."""
    if isinstance(t, pa.BaseExtensionType):
        return t.storage_type
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _storage(f.type), f.nullable) for f in t])
    if pa.types.is_map(t):
        return pa.map_(
            _storage(t.key_type),
            pa.field(t.item_field.name, _storage(t.item_type), t.item_field.nullable),
        )
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(pa.field(t.value_field.name, _storage(t.value_type), t.value_field.nullable))
    return t


def _plain(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _arrow(schema: Schema, rows: list[dict[str, Any]]) -> pa.Table:
    """Arrow data of ``schema`` (uuids as their 16-byte storage, as Parquet readers may give)."""
    target = schema.as_arrow()
    fields = [pa.field(f.name, _storage(f.type), f.nullable) for f in target]
    columns = [pa.array([_plain(r.get(f.name)) for r in rows], f.type) for f in fields]
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def roundtrip(schema: Schema, keys: list[str], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    job = build_job_schema(spec_for(keys), schema)
    table = _arrow(schema, rows)
    encoded = RowEncoder(job.proto).encode(table)
    key_cls, value_cls = job.classes
    out = []
    for k, v in encoded.pairs():
        key_msg, value_msg = key_cls.FromString(k), value_cls.FromString(v)
        assert key_msg.SerializeToString() == k, "key bytes must be canonical"
        out.append(decode_row(job.proto.key, job.proto.value, key_msg, value_msg))
    expected = table.to_pylist()
    assert [_normalize(r) for r in out] == [_normalize(r) for r in expected]
    return out


# ------------------------------------------------------------------ examples


def _all_types_row(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "tenant": f"t{i % 3}",
        "b": i % 2 == 0,
        "i": -i,
        "l": 2**62 - i,
        "f": 1.5 * i,
        "d": -0.25 * i,
        "dec": Decimal("9999999999999999999999999999.9999999999") if i == 1 else Decimal(f"-{i}.0000000001"),
        "day": date(1900 + i, 1, 1),
        "tod": time(23, 59, 59, 999_999) if i else time(0),
        "ts": datetime(1950, 6, 1, 12, 0, 0, 1),
        "tstz": datetime(2300, 1, 1, tzinfo=UTC),
        "ts_ns": None,
        "s": "é" * i,
        "u": uuid.UUID(int=i),
        "fx": bytes([i, 0, 0, 255]),
        "bin": b"\x00" * i,
        "nested": {"inner": {"x": i, "y": None}, "tag": "x"} if i % 2 else None,
        "tags": [f"t{j}" for j in range(i)],
        "matrix": [[float(i), -1.0], []],
        "by_name": [("a", {"v": i}), ("b", {"v": -i})],
        "map_of_map": [("outer", []), ("full", [("k", i)])],
        "map_of_list": [(i, ["x", "y"]), (-1, [])],
        "by_uuid": [(uuid.UUID(int=99), "first"), (uuid.UUID(int=7), "second")],
        "list_of_map": [[("yes", True), ("no", False)], []],
        "ints": [0, -1, 2**31 - 1, -(2**31)],
        "forbidden_number": "remapped",
    }


def test_every_type_round_trips_exactly() -> None:
    rows = [_all_types_row(i) for i in range(4)]
    rows.append(
        {
            "id": 100,
            "tenant": "",
            "l": 0,
            "d": 0.0,
            "tstz": datetime(1970, 1, 1, tzinfo=UTC),
            "tags": [],
        }
    )
    roundtrip(ALL_TYPES, ["id", "tenant"], rows)


def test_byte_identical_to_protobuf_serializer_for_the_sample(sample_table: Any) -> None:
    from bulldozer.spec import load_spec
    from tests.conftest import REPO

    spec = load_spec(REPO / "templates" / "move_data_to_kv_dal.yaml", env={}).spec
    job = build_job_schema(spec, sample_table.schema())
    data = sample_table.scan(limit=500).to_arrow()
    encoded = RowEncoder(job.proto).encode(data)
    key_cls, value_cls = job.classes
    for k, v in encoded.pairs():
        assert key_cls.FromString(k).SerializeToString() == k
        parsed = value_cls.FromString(v)
        # maps are hash-ordered in upb; everything else must be byte-identical
        parsed.ClearField("attributes")
        parsed.ClearField("counters")
        ours = value_cls.FromString(v)
        ours.ClearField("attributes")
        ours.ClearField("counters")
        assert parsed.SerializeToString() == ours.SerializeToString()
        assert value_cls.FromString(v).SerializeToString(deterministic=True) == value_cls.FromString(
            value_cls.FromString(v).SerializeToString(deterministic=True)
        ).SerializeToString(deterministic=True)


def test_a_batch_written_on_several_threads_is_the_batch_written_by_one() -> None:
    """A batch large enough to be split among threads (each writes its own rows into its
    own part of the buffer) comes out byte for byte as one thread writes it, and as the
    same rows encoded a small slice at a time (one thread each): the rows at the parts'
    edges included, in the nested sample's layout (repeated messages, maps, decimals)."""
    from bulldozer.spec import load_spec
    from bulldozer.warehouse.sample import SAMPLE_SCHEMA, generate_sample
    from tests.conftest import REPO

    spec = load_spec(REPO / "templates" / "move_data_to_kv_dal.yaml", env={}).spec
    job = build_job_schema(spec, SAMPLE_SCHEMA)
    data = generate_sample(40_003)  # three parts of 13,334 rows and more
    one = RowEncoder(job.proto, threads=1).encode(data)
    for threads in (3, 0):
        many = RowEncoder(job.proto, threads=threads).encode(data)
        assert many.keys.equals(one.keys) and many.values.equals(one.values), threads
    sliced = [RowEncoder(job.proto).encode(data.slice(start, 1000)) for start in range(0, data.num_rows, 1000)]
    assert pa.concat_arrays([e.keys for e in sliced]).equals(one.keys)
    assert pa.concat_arrays([e.values for e in sliced]).equals(one.values)


def test_sample_table_round_trips(sample_table: Any) -> None:
    from bulldozer.spec import load_spec
    from tests.conftest import REPO

    spec = load_spec(REPO / "templates" / "move_data_to_kv_dal.yaml", env={}).spec
    job = build_job_schema(spec, sample_table.schema())
    data = sample_table.scan(limit=300).to_arrow()
    encoded = RowEncoder(job.proto).encode(data)
    key_cls, value_cls = job.classes
    decoded = [
        decode_row(job.proto.key, job.proto.value, key_cls.FromString(k), value_cls.FromString(v))
        for k, v in encoded.pairs()
    ]
    expected = data.to_pylist()
    assert [_normalize(r) for r in decoded] == [_normalize(r) for r in expected]


FLOATS = Schema(
    NestedField(1, "k", LongType(), required=True),
    NestedField(2, "x", DoubleType()),
    NestedField(3, "y", FloatType(), required=True),
)


def test_nan_infinities_and_negative_zero() -> None:
    rows = [{"k": i, "x": v, "y": v} for i, v in enumerate([math.nan, math.inf, -math.inf, -0.0, 0.0, 1e308])]
    rows[-1]["y"] = 3.0e38
    out = roundtrip(FLOATS, ["k"], rows)
    assert math.copysign(1.0, out[3]["x"]) == -1.0  # -0.0 keeps its sign


STRINGS = Schema(
    NestedField(1, "k", StringType(), required=True),
    NestedField(2, "v", StringType(), required=True),
)


def test_empty_and_very_large_strings() -> None:
    roundtrip(
        STRINGS,
        ["k"],
        [{"k": "a", "v": ""}, {"k": "b", "v": "x" * 5_000_000}, {"k": "ünï", "v": "\u0000"}],
    )


def test_empty_key_string_still_encodes_a_non_empty_key() -> None:
    job = build_job_schema(spec_for(["k"]), STRINGS)
    encoded = RowEncoder(job.proto).encode(_arrow(STRINGS, [{"k": "", "v": "x"}]))
    assert encoded.pairs()[0][0] == b"\x0a\x00"  # explicit presence: field 1, length 0


def test_decimal_at_the_edge_of_precision() -> None:
    schema = Schema(
        NestedField(1, "k", IntegerType(), required=True),
        NestedField(2, "v", DecimalType(38, 0)),
        NestedField(3, "w", DecimalType(9, 9)),
    )
    big = Decimal("9" * 38)
    rows = [
        {"k": 1, "v": big, "w": Decimal("0.999999999")},
        {"k": 2, "v": Decimal("-" + "9" * 38), "w": Decimal("-0.000000001")},
    ]
    roundtrip(schema, ["k"], rows)


def test_timestamps_before_1970_and_after_2262() -> None:
    schema = Schema(
        NestedField(1, "k", IntegerType(), required=True),
        NestedField(2, "t", TimestamptzType()),
        NestedField(3, "n", TimestampType()),
    )
    rows = [
        {
            "k": 1,
            "t": datetime(1, 1, 1, tzinfo=UTC),
            "n": datetime(1969, 12, 31, 23, 59, 59, 999_999),
        },
        {
            "k": 2,
            "t": datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
            "n": datetime(2262, 4, 12),
        },
        {"k": 3, "t": datetime(2263, 1, 1, tzinfo=UTC), "n": None},
    ]
    roundtrip(schema, ["k"], rows)


def test_map_of_map_with_an_empty_inner_map() -> None:
    rows = [
        {
            "id": 1,
            "tenant": "a",
            "l": 1,
            "d": 1.0,
            "tstz": datetime(2020, 1, 1, tzinfo=UTC),
            "tags": [],
            "map_of_map": [("empty", [])],
        }
    ]
    out = roundtrip(ALL_TYPES, ["id", "tenant"], rows)
    assert out[0]["map_of_map"] == [("empty", [])]


def test_null_versus_empty_list_and_map() -> None:
    base = {"tenant": "a", "l": 1, "d": 1.0, "tstz": datetime(2020, 1, 1, tzinfo=UTC), "tags": []}
    out = roundtrip(
        ALL_TYPES,
        ["id", "tenant"],
        [
            {**base, "id": 1, "ints": None, "by_name": None},
            {**base, "id": 2, "ints": [], "by_name": []},
        ],
    )
    assert out[0]["ints"] is None and out[1]["ints"] == []
    assert out[0]["by_name"] is None and out[1]["by_name"] == []


NULLABLE_ELEMENTS = Schema(
    NestedField(1, "k", LongType(), required=True),
    NestedField(2, "xs", ListType(3, LongType(), element_required=False)),
    NestedField(4, "m", MapType(5, StringType(), 6, StringType(), value_required=False)),
)


def test_null_list_elements_are_refused_not_dropped() -> None:
    job = build_job_schema(spec_for(["k"]), NULLABLE_ELEMENTS)
    table = pa.Table.from_pylist([{"k": 1, "xs": [1, None, 3], "m": []}], schema=NULLABLE_ELEMENTS.as_arrow())
    with pytest.raises(SourceDataError, match="'xs' holds a null list element"):
        RowEncoder(job.proto).encode(table)


def test_null_map_values_are_refused_not_dropped() -> None:
    job = build_job_schema(spec_for(["k"]), NULLABLE_ELEMENTS)
    table = pa.Table.from_pylist([{"k": 1, "xs": [], "m": [("a", None)]}], schema=NULLABLE_ELEMENTS.as_arrow())
    with pytest.raises(SourceDataError, match="'m' holds a null map value"):
        RowEncoder(job.proto).encode(table)


def test_nullable_elements_without_nulls_encode() -> None:
    roundtrip(NULLABLE_ELEMENTS, ["k"], [{"k": 1, "xs": [1, 2], "m": [("a", "b")]}])


def test_null_in_a_key_column_is_refused() -> None:
    schema = Schema(NestedField(1, "k", LongType(), required=False), NestedField(2, "v", StringType()))
    job = build_job_schema(spec_for(["k"]), schema)
    table = pa.Table.from_pylist([{"k": 1, "v": "a"}, {"k": None, "v": "b"}], schema=schema.as_arrow())
    with pytest.raises(SourceDataError, match="key column 'k' holds 1 null"):
        RowEncoder(job.proto).encode(table)


def test_uuid_from_strings_as_spark_delivers_them() -> None:
    schema = Schema(NestedField(1, "k", LongType(), required=True), NestedField(2, "u", UUIDType()))
    job = build_job_schema(spec_for(["k"]), schema)
    u = uuid.uuid4()
    as_strings = pa.table({"k": pa.array([1, 2]), "u": pa.array([str(u), None])})
    storage = pa.array([u.bytes, None], pa.binary(16))
    as_uuid = pa.table({"k": pa.array([1, 2]), "u": pa.ExtensionArray.from_storage(pa.uuid(), storage)})
    enc = RowEncoder(job.proto)
    assert enc.encode(as_strings).pairs() == enc.encode(as_uuid).pairs()


def test_sliced_batches_encode_like_whole_ones() -> None:
    rows = [_all_types_row(i) for i in range(6)]
    job = build_job_schema(spec_for(["id", "tenant"]), ALL_TYPES)
    table = _arrow(ALL_TYPES, rows)
    enc = RowEncoder(job.proto)
    whole = enc.encode(table).pairs()
    parts = enc.encode(table.slice(2, 3)).pairs()
    assert parts == whole[2:5]


# ---------------------------------------------------------- property based

_PRIMITIVES = [
    (BooleanType(), st.booleans()),
    (IntegerType(), st.integers(-(2**31), 2**31 - 1)),
    (LongType(), st.integers(-(2**63), 2**63 - 1)),
    (FloatType(), st.floats(width=32, allow_nan=False)),
    (DoubleType(), st.floats(allow_nan=False)),
    (
        DecimalType(10, 3),
        st.integers(-(10**10) + 1, 10**10 - 1).map(lambda n: Decimal(n).scaleb(-3)),
    ),
    (DateType(), st.dates(min_value=date(1, 1, 1), max_value=date(9999, 12, 31))),
    (TimeType(), st.times()),
    (TimestampType(), st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30))),
    (
        TimestamptzType(),
        st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)).map(
            lambda d: d.replace(tzinfo=UTC)
        ),
    ),
    (StringType(), st.text(max_size=20)),
    (UUIDType(), st.uuids()),
    (FixedType(3), st.binary(min_size=3, max_size=3)),
    (BinaryType(), st.binary(max_size=20)),
]
_KEYABLE = [
    0,
    1,
    2,
    5,
    6,
    7,
    10,
]  # bool, int, long, decimal, date, time, string (no float, no nested)


@st.composite
def _typed(draw: st.DrawFn, ids: list[int], depth: int) -> tuple[Any, st.SearchStrategy[Any]]:
    """An Iceberg type (fresh field ids from ``ids``) and a strategy for its values."""
    kind = draw(st.sampled_from(["primitive"] * 3 + (["struct", "list", "map"] if depth < 2 else [])))
    if kind == "primitive":
        return draw(st.sampled_from(_PRIMITIVES))
    if kind == "struct":
        n = draw(st.integers(1, 3))
        fields, strategies = [], {}
        for _ in range(n):
            t, s = draw(_typed(ids, depth + 1))
            required = draw(st.booleans())
            fid = ids.pop()
            fields.append(NestedField(fid, f"c{fid}", t, required=required))
            strategies[f"c{fid}"] = s if required else st.none() | s
        return StructType(*fields), st.fixed_dictionaries(strategies)
    if kind == "list":
        t, s = draw(_typed(ids, depth + 1))
        return ListType(ids.pop(), t, element_required=True), st.lists(s, max_size=3)
    key_type, key_strategy = draw(st.sampled_from([_PRIMITIVES[i] for i in (1, 2, 10, 11)]))
    t, s = draw(_typed(ids, depth + 1))
    key_id, value_id = ids.pop(), ids.pop()
    return (
        MapType(key_id, key_type, value_id, t, value_required=True),
        st.lists(st.tuples(key_strategy, s), max_size=3, unique_by=lambda kv: kv[0]),
    )


@st.composite
def tables(draw: st.DrawFn) -> tuple[Schema, list[str], list[dict[str, Any]]]:
    ids = list(range(1000, 100, -1))
    key_type, key_strategy = draw(st.sampled_from([_PRIMITIVES[i] for i in _KEYABLE]))
    fields = [NestedField(1, "k", key_type, required=True)]
    strategies: dict[str, st.SearchStrategy[Any]] = {"k": key_strategy}
    for i in range(draw(st.integers(1, 4))):
        t, s = draw(_typed(ids, 0))
        required = draw(st.booleans())
        fields.append(NestedField(2 + i, f"v{i}", t, required=required))
        strategies[f"v{i}"] = s if required else st.none() | s
    rows = draw(st.lists(st.fixed_dictionaries(strategies), min_size=1, max_size=6))
    return Schema(*fields), ["k"], rows


def test_random_schemas_round_trip() -> None:
    """Random schemas and rows, byte for byte through protobuf's own parser."""
    examples = int(os.environ.get("BULLDOZER_HYPOTHESIS_EXAMPLES", "60"))

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(tables())
    def check(case: tuple[Schema, list[str], list[dict[str, Any]]]) -> None:
        schema, keys, rows = case
        roundtrip(schema, keys, rows)

    check()


def test_list_of_timestamptz_keeps_its_time_zone() -> None:
    """Found by hypothesis: a list element's own Iceberg type decides how it decodes."""
    schema = Schema(
        NestedField(1, "k", LongType(), required=True),
        NestedField(2, "s", StructType(NestedField(3, "ts", ListType(4, TimestamptzType(), element_required=True)))),
        NestedField(5, "naive", ListType(6, TimestampType(), element_required=True)),
    )
    out = roundtrip(
        schema, ["k"], [{"k": 1, "s": {"ts": [datetime(2000, 1, 1, tzinfo=UTC)]}, "naive": [datetime(1999, 1, 1)]}]
    )
    assert out[0]["s"]["ts"][0].tzinfo is not None and out[0]["naive"][0].tzinfo is None


@given(
    st.integers(min_value=0, max_value=18).flatmap(
        lambda scale: st.tuples(
            st.just(scale),
            st.lists(st.one_of(st.none(), st.integers(min_value=-(10**18) + 1, max_value=10**18 - 1)), max_size=60),
        )
    )
)
def test_decimal_strings_are_what_arrow_casts(case: tuple[int, list[int | None]]) -> None:
    """The decimal kernel writes exactly Arrow's string for every valid value, or declines
    (None) when Arrow would use scientific notation; then the encoder casts."""
    from bulldozer.load.encoder.layouts import decimal_strings

    scale, units = case
    arr = pa.array([None if u is None else Decimal(u).scaleb(-scale) for u in units], pa.decimal128(18, scale))
    expected = arr.cast(pa.large_string()).to_pylist()
    got = decimal_strings(arr)
    if got is None:
        scientific = [s for s in expected if s is not None and "E" in s]
        assert scientific or not len(arr), "declined without a value that needs scientific notation"
        return
    assert [g.decode() if e is not None else None for g, e in zip(got.to_pylist(), expected, strict=True)] == expected
    assert not any(got.to_pylist()[i] for i, e in enumerate(expected) if e is None)  # null rows are empty


def test_decimal_strings_decline_wide_decimals_and_read_slices() -> None:
    from bulldozer.load.encoder.layouts import decimal_strings

    wide = pa.array([Decimal("1.5")], pa.decimal128(30, 1))
    assert decimal_strings(wide) is None
    arr = pa.array([Decimal("-1.25"), Decimal("3.50"), None, Decimal("0.07")], pa.decimal128(10, 2))
    got = decimal_strings(arr.slice(1, 3))
    assert got is not None and got.to_pylist() == [b"3.50", b"", b"0.07"]


def test_fixed_size_uuid_bytes_are_viewed_not_copied_and_respect_slices() -> None:
    from bulldozer.load.encoder.encode import _uuid_bytes

    values = [uuid.UUID(int=i * 7919).bytes for i in range(6)]
    arr = pa.array([*values[:2], None, *values[3:]], pa.binary(16))
    for part in (arr, arr.slice(1, 3), arr.slice(4)):
        got = _uuid_bytes(part)
        assert got.to_pylist() == part.cast(pa.large_binary()).to_pylist()
        assert got.null_count == part.null_count
    assert _uuid_bytes(arr).buffers()[2].address == arr.buffers()[1].address  # the same bytes


def test_the_kernels_refuse_a_malformed_layout_instead_of_writing_out_of_place() -> None:
    """Every array a layout names is checked against its row count, and offsets against
    their data: a bad layout is a ValueError, never a write outside the output."""
    from bulldozer import _kernels

    ok = np.array([1, 2], dtype=np.uint64)
    offsets = np.empty(3, dtype=np.uint64)
    bad_layouts = [
        ("v", 3, None, ok, b""),  # 2 values for 3 rows
        ("v", 2, np.ones(3, dtype=np.uint8), ok, b""),  # 3 keep flags for 2 rows
        ("f", 2, None, np.zeros(7, dtype=np.uint8), 4, b""),  # 7 bytes for 2 rows of 4
        ("b", 2, None, np.array([0, 2, 9], dtype=np.uint64), np.zeros(4, dtype=np.uint8), b"\x0a"),  # past the data
        ("b", 2, None, np.array([0, 3, 2], dtype=np.uint64), np.zeros(4, dtype=np.uint8), b""),  # decreasing
        ("g", 2, None, np.array([0, 1, 5], dtype=np.uint64), ("v", 2, None, ok, b"")),  # past the elements
        ("c", 2, None, None, [("v", 3, None, np.zeros(3, dtype=np.uint64), b"")]),  # a part of other rows
        ("x", 2, None),
    ]
    for layout in bad_layouts:
        with pytest.raises(ValueError):
            _kernels.encode(layout, 2, offsets)
    frozen = np.zeros(3, dtype=np.uint64)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        _kernels.encode(("v", 2, None, ok, b""), 2, frozen)


def test_a_run_of_the_encoder_compiles_nothing() -> None:
    """The kernels are compiled at install time: encoding a batch in a fresh interpreter
    loads no JIT (no numba, no llvmlite), so a first run is as fast as the next."""
    code = (
        "import sys, pyarrow as pa\n"
        "from bulldozer.load.encoder.layouts import ConcatRows, VarintRows, BytesRows, GroupedRows, materialize\n"
        "import numpy as np\n"
        "rows = ConcatRows([VarintRows(np.arange(3), None, b'\\x08'), BytesRows(pa.array(['a', 'bc', '']), None, b'\\x12'),"
        " GroupedRows(VarintRows(np.arange(4), None), np.array([1, 0, 3]))], 3)\n"
        "out = materialize(rows).to_pylist()\n"
        "assert out == [b'\\x08\\x00\\x12\\x01a\\x00', b'\\x08\\x01\\x12\\x02bc', b'\\x08\\x02\\x12\\x00\\x01\\x02\\x03'], out\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'llvmlite')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# ------------------------------------------- values a proto type cannot carry to a consumer


def _unchecked_text(values: list[bytes]) -> pa.Array:
    """A string array of these bytes, made without Arrow's UTF-8 check (as a Parquet file a
    writer such as Spark filled with any bytes reads)."""
    offsets = np.cumsum([0, *map(len, values)], dtype=np.int32)
    return pa.Array.from_buffers(
        pa.string(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))]
    )


TEXTS = Schema(
    NestedField(1, "k", LongType(), required=True),
    NestedField(2, "s", StringType()),
    NestedField(3, "xs", ListType(4, StringType(), element_required=True)),
    NestedField(5, "m", MapType(6, StringType(), 7, StringType(), value_required=True)),
    NestedField(8, "st", StructType(NestedField(9, "inner", StringType()))),
)


def _texts(s: pa.Array, xs: pa.Array, m_keys: pa.Array, m_values: pa.Array, inner: pa.Array) -> pa.Table:
    one_each = pa.array([0, 1, 2], pa.int32())
    return pa.table(
        {
            "k": pa.array([1, 2], pa.int64()),
            "s": s,
            "xs": pa.ListArray.from_arrays(one_each, xs),
            "m": pa.MapArray.from_arrays(one_each, m_keys, m_values),
            "st": pa.StructArray.from_arrays([inner], names=["inner"]),
        }
    )


@pytest.mark.parametrize(
    ("where", "place"),
    [
        ("s", "column 's'"),
        ("xs", "an element of column 'xs'"),
        ("m_keys", "a key of map column 'm'"),
        ("m_values", "a value of map column 'm'"),
        ("inner", "column 'st.inner'"),
    ],
)
def test_text_that_is_not_utf8_is_refused_wherever_it_sits(where: str, place: str) -> None:
    """A protobuf string holding bytes that are not UTF-8 makes every consumer's parser
    refuse the whole record (Python's raised ``String field had bad UTF-8`` on a version
    that had loaded, verified and gone live)."""
    job = build_job_schema(spec_for(["k"]), TEXTS)
    good = {name: _unchecked_text([b"a", "café".encode()]) for name in ("s", "xs", "m_keys", "m_values", "inner")}
    RowEncoder(job.proto).encode(_texts(**good))
    bad = {**good, where: _unchecked_text([b"fine", b"caf\xe9"])}  # Latin-1, not UTF-8
    with pytest.raises(SourceDataError, match=rf"^{place} holds text that is not UTF-8 \(e\.g\. b'caf\\xe9'\)"):
        RowEncoder(job.proto).encode(_texts(**bad))


TIMES = Schema(
    NestedField(1, "k", LongType(), required=True),
    NestedField(2, "ts", TimestampType()),
    NestedField(3, "tz", TimestamptzType()),
    NestedField(4, "t", TimeType()),
)


def _times(ts: int | None = 0, tz: int | None = 0, t: int | None = 0) -> pa.Table:
    arrow = TIMES.as_arrow()
    return pa.table(
        {
            "k": pa.array([1], pa.int64()),
            "ts": pa.array([ts], arrow.field("ts").type),
            "tz": pa.array([tz], arrow.field("tz").type),
            "t": pa.array([t], arrow.field("t").type),
        }
    )


LAST_MICROSECOND = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999
FIRST_MICROSECOND = -62_135_596_800_000_000  # 0001-01-01T00:00:00


@pytest.mark.parametrize(
    ("column", "micros", "shown"),
    [
        ("ts", LAST_MICROSECOND + 1, "10000-01-01T00:00:00"),
        ("ts", 2**63 - 1, r"294247-01-10T04:00:54\.775807"),  # Long.MAX_VALUE, a writer's "forever"
        ("tz", FIRST_MICROSECOND - 1, r"0000-12-31T23:59:59\.999999Z"),
    ],
)
def test_a_timestamp_outside_the_years_protobuf_holds_is_refused(column: str, micros: int, shown: str) -> None:
    """google.protobuf.Timestamp holds the years 1 to 9999; protobuf's JSON and every
    language's conversion to its own time refuse any other (``bulldozer get`` raised
    ``Timestamp is not valid``)."""
    job = build_job_schema(spec_for(["k"]), TIMES)
    with pytest.raises(
        SourceDataError, match=rf"^column '{column}' holds a timestamp outside the years 1 to 9999 \({shown}\)"
    ):
        RowEncoder(job.proto).encode(_times(**{column: micros}))


def test_the_first_and_last_timestamps_protobuf_holds_and_null_are_loaded() -> None:
    from google.protobuf.json_format import MessageToDict

    job = build_job_schema(spec_for(["k"]), TIMES)
    _, value_cls = job.classes
    for ts, tz in ((LAST_MICROSECOND, FIRST_MICROSECOND), (None, None)):
        encoded = RowEncoder(job.proto).encode(_times(ts=ts, tz=tz))
        out = MessageToDict(value_cls.FromString(encoded.values[0].as_py()))
        if ts is None:
            assert "ts" not in out and "tz" not in out
        else:
            assert (out["ts"], out["tz"]) == ("9999-12-31T23:59:59.999999Z", "0001-01-01T00:00:00Z")


@pytest.mark.parametrize("micros", [-1, 86_400_000_000, 90_000_000_000])
def test_a_time_outside_a_day_is_refused(micros: int) -> None:
    job = build_job_schema(spec_for(["k"]), TIMES)
    with pytest.raises(SourceDataError, match=rf"^column 't' holds a time outside a day \({micros:,} microseconds"):
        RowEncoder(job.proto).encode(_times(t=micros))
    RowEncoder(job.proto).encode(_times(t=86_399_999_999))
    RowEncoder(job.proto).encode(_times(t=None))


SIZES = Schema(
    NestedField(1, "url", StringType(), required=True),
    NestedField(2, "blob", BinaryType()),
)


def test_a_record_larger_than_the_store_takes_is_refused_naming_its_row() -> None:
    """The DAL refused a batch holding a key or value over its limits with the size alone
    (``a key of 613 bytes is over the limit of 511``: which row?), and gRPC one over 64 MiB
    with its own message; a scheduler retried both. The encoder refuses such a record with
    the row's key, as data no retry loads, given the DAL's limits."""
    from bulldozer.kv.types import BaseCopy, StoreInfo

    job = build_job_schema(spec_for(["url"]), SIZES)
    limits = StoreInfo("embedded", BaseCopy.LAYERED, max_key_bytes=511, max_value_bytes=1_000)

    def rows(url: str, blob: bytes) -> pa.Table:
        return pa.table({"url": pa.array(["a", url, "b"]), "blob": pa.array([b"", blob, b"x" * 900], pa.binary())})

    within = RowEncoder(job.proto, limits=limits).encode(rows("u" * 500, b"y" * 990))
    assert len(within) == 3
    long_url = "https://example.com/" + "x" * 600
    with pytest.raises(SourceDataError) as key:
        RowEncoder(job.proto, limits=limits).encode(rows(long_url, b""))
    said = str(key.value)
    assert said.startswith('the record of key {"url": "https://example.com/xxx') and "…" in said, said
    assert said.endswith(
        "has a key of 623 bytes (as protobuf), and the embedded store takes keys of up to 511 bytes: key the job "
        "on shorter columns (a hash of a long one, say)"
    ), said
    with pytest.raises(SourceDataError, match=r'^the record of key \{"url": "v"\} has a value of 1,003 bytes'):
        RowEncoder(job.proto, limits=limits).encode(rows("v", b"z" * 1_000))
    RowEncoder(job.proto).encode(rows(long_url, b"z" * 10_000))  # no limits: the DAL's to say
    unsaid = StoreInfo("embedded", BaseCopy.LAYERED)  # a DAL too old to say its limits
    RowEncoder(job.proto, limits=unsaid).encode(rows(long_url, b"z" * 10_000))
