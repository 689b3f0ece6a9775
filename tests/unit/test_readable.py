"""Readable JSON from a version's stored descriptor set alone, checked against the exact
decoder (the generated model) on every Iceberg type."""

from __future__ import annotations

import base64
import json
import math
import uuid
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

from bulldozer.load.encoder.encode import RowEncoder
from bulldozer.schema.decode import ReadableJson, decode_row, iceberg_types
from bulldozer.schema.job import build_job_schema
from tests.schemas import ALL_TYPES, spec_for
from tests.unit.test_encode import _all_types_row, _arrow


def _expected(value: Any, iceberg: str = "") -> Any:
    """The readable form of a value the exact decoder gives."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else ("NaN" if math.isnan(value) else "Infinity")
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        text = value.replace(tzinfo=None).isoformat()
        return text + "Z" if value.tzinfo is not None else text
    if isinstance(value, (date, time)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: _expected(v) for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):
        return {str(_expected(k)): _expected(v) for k, v in value}
    if isinstance(value, list):
        return [_expected(v) for v in value]
    raise AssertionError(type(value))


def test_every_type_reads_as_the_table_would_show_it() -> None:
    job = build_job_schema(spec_for(["id", "tenant"]), ALL_TYPES)
    rows = [_all_types_row(i) for i in range(4)]
    encoded = RowEncoder(job.proto).encode(_arrow(ALL_TYPES, rows))
    key_cls, value_cls = job.classes
    readable = ReadableJson(job.descriptor_set)
    seen = 0
    for k, v in encoded.pairs():
        key_msg, value_msg = key_cls.FromString(k), value_cls.FromString(v)
        exact = decode_row(job.proto.key, job.proto.value, key_msg, value_msg)
        got = {**readable(key_msg), **readable(value_msg)}
        json.dumps(got)  # JSON-ready
        want = {_field_name(job, c): _expected(x) for c, x in exact.items()}
        # maps with empty values print as {} (a map, not a list of pairs)
        for name in ("by_name", "map_of_map", "map_of_list", "by_uuid", "list_of_map"):
            want[name] = _empty_maps(want[name], got[name])
        assert got == want
        seen += 1
    assert seen == 4
    one = ReadableJson(job.descriptor_set)(value_cls.FromString(next(iter(encoded.pairs()))[1]))
    assert isinstance(one["l"], int)  # int64 is a number, not protobuf's string
    assert one["day"] == "1900-01-01" and one["u"] == "00000000-0000-0000-0000-000000000000"
    assert one["tod"] == "00:00:00" and one["ts"] == "1950-06-01T12:00:00.000001"
    assert one["tstz"] == "2300-01-01T00:00:00Z" and one["ts_ns"] is None


def _field_name(job: Any, column: str) -> str:
    return {f.column: f.name for f in [*job.proto.key.fields, *job.proto.value.fields]}[column]


def _empty_maps(want: Any, got: Any) -> Any:
    """The exact decoder gives [] for an empty map; the readable form is {}."""
    if want == [] and got == {}:
        return {}
    if isinstance(want, dict) and isinstance(got, dict):
        return {k: _empty_maps(v, got.get(k)) for k, v in want.items()}
    if isinstance(want, list) and isinstance(got, list):
        return [_empty_maps(w, g) for w, g in zip(want, got, strict=False)]
    return want


def test_the_types_come_from_the_stored_comments_only() -> None:
    job = build_job_schema(spec_for(["id", "tenant"]), ALL_TYPES)
    types = iceberg_types(job.descriptor_set)
    package = job.proto.package
    assert types[f"{package}.ValueMessage.day"] == "date"
    assert types[f"{package}.ValueMessage.ByUuidEntry.key"] == "uuid"
    assert types[f"{package}.ValueMessage.forbidden_number"] == "string"  # the remap note is not the type
    # only the generated file keeps comments (the imports' would only grow every version)
    from google.protobuf import descriptor_pb2

    files = descriptor_pb2.FileDescriptorSet.FromString(job.descriptor_set).file
    assert [f.name for f in files if f.source_code_info.location] == [job.compiled.proto_name]


def test_a_version_stored_without_comments_still_reads() -> None:
    from google.protobuf import descriptor_pb2

    job = build_job_schema(spec_for(["id", "tenant"]), ALL_TYPES)
    fds = descriptor_pb2.FileDescriptorSet.FromString(job.descriptor_set)
    for f in fds.file:
        f.ClearField("source_code_info")
    bare = ReadableJson(fds.SerializeToString())
    encoded = RowEncoder(job.proto).encode(_arrow(ALL_TYPES, [_all_types_row(2)]))
    _, value_cls = job.classes
    value = bare(value_cls.FromString(next(iter(encoded.pairs()))[1]))
    assert value["day"] == (date(1902, 1, 1) - date(1970, 1, 1)).days  # the stored number
    assert value["tstz"] == "2300-01-01T00:00:00Z"
    assert value["by_name"] == {"a": {"v": 2}, "b": {"v": -2}}


def test_a_stored_descriptor_renders_back_to_an_equivalent_proto() -> None:
    from bulldozer.schema.compat import check_compatibility
    from bulldozer.schema.compile import compile_proto
    from bulldozer.schema.render import render_descriptor

    job = build_job_schema(spec_for(["id", "tenant"]), ALL_TYPES)
    text = render_descriptor(job.descriptor_set, job.value_full_name)
    assert "optional int32 day = 9;  // day: date" in text and "map<string, bool> entries = 1;" in text
    again = compile_proto(text, job.compiled.proto_name, python=False)
    assert check_compatibility(job.descriptor_set, again.descriptor_set).differences == []
    assert check_compatibility(again.descriptor_set, job.descriptor_set).differences == []
    assert render_descriptor(job.descriptor_set, "no.such.Message") == ""


def test_values_no_run_stores_now_read_as_text_or_one_line() -> None:
    """A version stored by another tool, or by a release that did not refuse them, may hold
    a date, a timestamp or a time Python's types cannot hold, or text that is not UTF-8:
    ``bulldozer get`` raised OverflowError, ``Timestamp is not valid`` or protobuf's
    DecodeError for them."""
    import pytest
    from pyiceberg.schema import Schema
    from pyiceberg.types import DateType, LongType, NestedField, StringType, TimestampType, TimestamptzType, TimeType

    from bulldozer.errors import UnreadableRecordError

    schema = Schema(
        NestedField(1, "k", LongType(), required=True),
        NestedField(2, "day", DateType(), required=True),
        NestedField(3, "at", TimestampType()),
        NestedField(4, "at_utc", TimestamptzType()),
        NestedField(5, "t", TimeType()),
        NestedField(6, "name", StringType()),
    )
    job = build_job_schema(spec_for(["k", "day"]), schema)
    key_cls, value_cls = job.classes
    readable = ReadableJson(job.descriptor_set)
    value = value_cls(t=90_000_000_000, name="XY")
    value.at.seconds = 2**63 // 1_000_000
    value.at.nanos = 775_807_000
    value.at_utc.seconds = -62_135_596_801
    assert readable.decode(value_cls, value.SerializeToString()) == {
        "at": "294247-01-10T04:00:54.775807",
        "at_utc": "0000-12-31T23:59:59Z",
        "t": 90_000_000_000,  # a time outside a day, as its number
        "name": "XY",
    }
    for days, text in ((2_932_897, "10000-01-01"), (-719_893, "-0001-01-01"), (2**31 - 1, "5881580-07-11")):
        key = key_cls(k=1, day=days).SerializeToString()
        assert readable.decode(key_cls, key) == {"k": 1, "day": text}
        assert readable.key_bytes(key_cls, {"k": 1, "day": text}) == key  # what get --key takes
    not_utf8 = value_cls(name="XY").SerializeToString().replace(b"XY", b"\xff\xfe")
    with pytest.raises(
        UnreadableRecordError, match=r"^a stored record does not parse with its version's schema: .*UTF-8"
    ):
        readable.decode(value_cls, not_utf8)
