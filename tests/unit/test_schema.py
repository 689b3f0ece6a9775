"""Schema generation: goldens, stable numbers, refused inputs and the compatibility matrix."""

from __future__ import annotations

from typing import Any

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
)

from bulldozer.errors import SchemaError
from bulldozer.schema import compile_proto, generate_proto, render_proto
from bulldozer.schema.compat import check_compatibility
from bulldozer.schema.job import build_job_schema
from bulldozer.spec import load_spec
from tests.conftest import REPO, update_goldens
from tests.schemas import ALL_TYPES, spec_for

GOLDEN = REPO / "tests" / "golden"


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if update_goldens() or not path.exists():
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"generation drifted from {path}"


def test_sample_table_golden_proto(sample_table: Any) -> None:
    spec = load_spec(REPO / "templates" / "move_data_to_kv_dal.yaml", env={}).spec
    text = render_proto(generate_proto(spec, sample_table.schema(), "lake.sample.user_item_scores"))
    _golden("user_item_scores.proto", text)
    compile_proto(text, "user_item_scores.proto")


def test_all_types_golden_proto() -> None:
    text = render_proto(generate_proto(spec_for(["id", "tenant"], name="all_types"), ALL_TYPES, "db.all_types"))
    _golden("all_types.proto", text)
    compiled = compile_proto(text, "all_types.proto")
    assert "all_types_pb2.py" in compiled.files and "all_types_pb2.pyi" in compiled.files


def test_generation_is_deterministic() -> None:
    spec = spec_for(["id", "tenant"], name="all_types")
    assert render_proto(generate_proto(spec, ALL_TYPES)) == render_proto(generate_proto(spec, ALL_TYPES))


def test_field_numbers_are_iceberg_ids_and_forbidden_ones_are_remapped() -> None:
    proto = generate_proto(spec_for(["id", "tenant"]), ALL_TYPES)
    numbers = {f.name: f.number for f in proto.value.fields}
    assert numbers["b"] == 3 and numbers["ints"] == 26
    assert numbers["forbidden_number"] not in range(19000, 20000)
    assert proto.remapped == {19500: numbers["forbidden_number"]}
    assert "Remapped: iceberg field id 19500" in render_proto(proto)


def test_renames_change_names_not_numbers() -> None:
    plain = generate_proto(spec_for(["id", "tenant"]), ALL_TYPES)
    renamed = generate_proto(spec_for(["id", "tenant"], renames={"s": "label", "id": "user_id"}), ALL_TYPES)
    assert {f.number for f in plain.value.fields} == {f.number for f in renamed.value.fields}
    assert next(f for f in renamed.value.fields if f.number == 14).name == "label"
    assert next(f for f in renamed.key.fields if f.number == 1).name == "user_id"


def test_key_fields_have_explicit_presence() -> None:
    proto = generate_proto(spec_for(["id", "tenant"]), ALL_TYPES)
    assert all(f.optional for f in proto.key.fields)


# ------------------------------------------------------------------ refused


def _schema(*fields: NestedField) -> Schema:
    return Schema(NestedField(1, "k", LongType(), required=True), *fields)


@pytest.mark.parametrize(
    ("key_type", "word"),
    [
        (FloatType(), "float"),
        (DoubleType(), "double"),
        (ListType(9, LongType()), "list"),
        (MapType(9, StringType(), 10, LongType()), "map"),
        (StructType(NestedField(9, "x", LongType())), "struct"),
    ],
)
def test_non_deterministic_key_types_are_refused(key_type: Any, word: str) -> None:
    schema = _schema(NestedField(2, "bad", key_type, required=True))
    with pytest.raises(SchemaError, match=rf"key column 'bad' has type {word}.*must be deterministic"):
        generate_proto(spec_for(["bad"]), schema)


def test_unsupported_type_is_refused_naming_the_column() -> None:
    from pyiceberg.types import UnknownType

    schema = _schema(NestedField(2, "outer", StructType(NestedField(3, "mystery", UnknownType()))))
    with pytest.raises(SchemaError, match=r"column 'outer\.mystery' has type unknown"):
        generate_proto(spec_for(["k"]), schema)


def test_columns_that_collide_after_sanitizing() -> None:
    schema = _schema(NestedField(2, "user-id", StringType()), NestedField(3, "user_id", StringType()))
    with pytest.raises(SchemaError, match="'user-id' and 'user_id' both become the proto field 'user_id'"):
        generate_proto(spec_for(["k"]), schema)


def test_rename_resolves_a_sanitizing_collision() -> None:
    schema = _schema(NestedField(2, "user-id", StringType()), NestedField(3, "user_id", StringType()))
    proto = generate_proto(spec_for(["k"], renames={"user-id": "user_id_text"}), schema)
    assert {f.name for f in proto.value.fields} == {"user_id_text", "user_id"}


def test_a_columns_name_cannot_write_lines_into_the_schema() -> None:
    """A column's name is the table owner's text and is shown in each field's comment: a line
    break, a quote or ``*/`` in it, or in a struct's field name, stays inside that comment."""
    from google.protobuf import descriptor_pb2

    from bulldozer.schema.decode import iceberg_types

    schema = _schema(
        NestedField(2, "note\nmessage Evil { string x = 1; }\n//", StringType()),
        NestedField(3, "s", StructType(NestedField(4, 'in\n}\nimport "other.proto";\nmessage E2 {', LongType()))),
        NestedField(5, 'a: b"""*/', DoubleType()),
        NestedField(6, "plain name", IntegerType()),
    )
    text = render_proto(generate_proto(spec_for(["k"]), schema))
    fields = [line for line in text.splitlines() if " = " in line and not line.startswith(("syntax", "option"))]
    assert len(fields) == 6 and all(line.count("//") == 1 for line in fields), text
    assert "  // plain name: int" in text  # a plain name reads as before
    compiled = compile_proto(text, "t.proto")
    (fd,) = [
        f for f in descriptor_pb2.FileDescriptorSet.FromString(compiled.descriptor_set).file if f.name == "t.proto"
    ]
    assert [m.name for m in fd.message_type] == ["KeyMessage", "ValueMessage"] and not fd.dependency
    value = fd.message_type[1]
    assert [n.name for n in value.nested_type] == ["S"] and len(value.field) == 4
    assert [f.name for f in value.nested_type[0].field] == ["in___import__other_proto___message_E2__"]
    types = iceberg_types(compiled.descriptor_set)
    assert types["bulldozer.test.t.ValueMessage.a__b_____"] == "double"
    assert types["bulldozer.test.t.ValueMessage.S.in___import__other_proto___message_E2__"] == "long"


def test_proto_keyword_column_is_refused_with_a_rename_hint() -> None:
    schema = _schema(NestedField(2, "message", StringType()))
    with pytest.raises(SchemaError, match=r"'message'.*reserved word; rename it in data_movement.renames"):
        generate_proto(spec_for(["k"]), schema)
    proto = generate_proto(spec_for(["k"], renames={"message": "msg"}), schema)
    assert proto.value.fields[0].name == "msg"


def test_rename_onto_an_existing_name_is_refused() -> None:
    schema = _schema(NestedField(2, "a", StringType()), NestedField(3, "b", StringType()))
    with pytest.raises(Exception, match="clashes with the column 'b'"):
        spec_for(["k"], values=["a", "b"], renames={"a": "b"})
    # without value_columns the spec cannot know; generation catches it
    with pytest.raises(SchemaError, match="both become the proto field 'b'"):
        generate_proto(spec_for(["k"], renames={"a": "b"}), schema)


def test_missing_columns_get_a_did_you_mean() -> None:
    with pytest.raises(SchemaError, match=r"'tenent' \(did you mean 'tenant'\?\)"):
        generate_proto(spec_for(["id", "tenent"]), ALL_TYPES)


def test_nested_names_that_collide_are_refused() -> None:
    schema = _schema(
        NestedField(2, "foo_bar", StructType(NestedField(4, "x", LongType()))),
        NestedField(3, "fooBar", StructType(NestedField(5, "y", LongType()))),
    )
    with pytest.raises(SchemaError, match="collide"):
        generate_proto(spec_for(["k"]), schema)


# ------------------------------------------------------------ compatibility

V1 = Schema(
    NestedField(1, "k", LongType(), required=True),
    NestedField(2, "name", StringType()),
    NestedField(3, "count", IntegerType()),
    NestedField(4, "tags", ListType(5, StringType(), element_required=True), required=True),
    NestedField(6, "ratio", FloatType()),
    NestedField(7, "info", StructType(NestedField(8, "a", LongType()), NestedField(9, "b", StringType()))),
)


def _descriptor(schema: Schema, keys: list[str] = ["k"], previous: bytes | None = None) -> bytes:  # noqa: B006
    return build_job_schema(spec_for(keys), schema, previous_descriptor_set=previous, python=False).descriptor_set


def _replace(schema: Schema, field_id: int, new: NestedField | None) -> Schema:
    fields = (
        [f for f in schema.fields if f.field_id != field_id]
        if new is None
        else [new if f.field_id == field_id else f for f in schema.fields]
    )
    return Schema(*fields)


CASES = {
    "add a value field": (
        Schema(*V1.fields, NestedField(10, "extra", StringType())),
        ["k"],
        "field added",
        "allowed",
    ),
    "drop a value field": (_replace(V1, 2, None), ["k"], "field dropped", "allowed"),
    "rename a value field": (
        _replace(V1, 2, NestedField(2, "title", StringType())),
        ["k"],
        "field renamed",
        "allowed",
    ),
    "widen int to long": (
        _replace(V1, 3, NestedField(3, "count", LongType())),
        ["k"],
        "type widened",
        "allowed",
    ),
    "make a field required": (
        _replace(V1, 2, NestedField(2, "name", StringType(), required=True)),
        ["k"],
        "presence changed",
        "allowed",
    ),
    "add a nested field": (
        _replace(
            V1,
            7,
            NestedField(
                7,
                "info",
                StructType(
                    NestedField(8, "a", LongType()),
                    NestedField(9, "b", StringType()),
                    NestedField(11, "c", LongType()),
                ),
            ),
        ),
        ["k"],
        "field added",
        "allowed",
    ),
    "float to double": (
        _replace(V1, 6, NestedField(6, "ratio", DoubleType())),
        ["k"],
        "type changed",
        "refused",
    ),
    "string to long": (
        _replace(V1, 2, NestedField(2, "name", LongType())),
        ["k"],
        "type changed",
        "refused",
    ),
    "list to scalar": (
        _replace(V1, 4, NestedField(4, "tags", StringType(), required=True)),
        ["k"],
        "repeated changed",
        "refused",
    ),
    "nested type change": (
        _replace(
            V1,
            7,
            NestedField(
                7,
                "info",
                StructType(NestedField(8, "a", StringType()), NestedField(9, "b", StringType())),
            ),
        ),
        ["k"],
        "type changed",
        "refused",
    ),
    "key type change": (
        _replace(V1, 1, NestedField(1, "k", IntegerType(), required=True)),
        ["k"],
        "type changed",
        "refused",
    ),
    "key rename": (
        _replace(V1, 1, NestedField(1, "key", LongType(), required=True)),
        ["key"],
        "field renamed",
        "allowed",
    ),
    "key column added": (V1, ["k", "name"], "key field added", "refused"),
}


@pytest.mark.parametrize("case", sorted(CASES), ids=sorted(CASES))
def test_compatibility_matrix(case: str) -> None:
    new_schema, keys, change, verdict = CASES[case]
    old = _descriptor(V1, ["k"])
    values = [f.name for f in new_schema.fields if f.name not in keys]
    new = build_job_schema(spec_for(keys, values=values), new_schema, previous_descriptor_set=old, python=False)
    assert new.compat is not None
    found = [(d.change, d.verdict) for d in new.compat.differences]
    assert (change, verdict) in found, found
    assert new.compat.breaking == (verdict == "refused" or any(v == "refused" for _, v in found))


def test_no_change_has_no_differences() -> None:
    old = _descriptor(V1)
    assert check_compatibility(old, _descriptor(V1)).differences == []


def test_dropped_fields_are_reserved_and_reuse_is_refused() -> None:
    old = _descriptor(V1)
    dropped = build_job_schema(spec_for(["k"]), _replace(V1, 2, None), previous_descriptor_set=old, python=False)
    assert "reserved 2;" in dropped.text and 'reserved "name";' in dropped.text
    # a later schema puts a different field on number 2: refused against the one that reserved it
    reused = Schema(*_replace(V1, 2, None).fields, NestedField(2, "other", LongType()))
    report = check_compatibility(dropped.descriptor_set, _descriptor(reused))
    assert ("reused reserved number", "refused") in [(d.change, d.verdict) for d in report.differences]


def test_a_stored_schema_that_does_not_load_is_a_schema_error() -> None:
    """A version another tool made, or an older DAL took, may hold a descriptor set its
    readers cannot load: ``get`` and ``scan`` printed protobuf's DecodeError as a traceback."""
    from bulldozer.errors import SchemaError
    from bulldozer.schema.compile import load_message_classes

    with pytest.raises(
        SchemaError, match=r"^the version's stored schema cannot be read: it does not parse as a protobuf"
    ):
        load_message_classes(b"garbage\xff", "a.K")
    with pytest.raises(SchemaError, match=r"^the version's stored schema cannot be read: it has no message 'a\.K'$"):
        load_message_classes(b"", "a.K")
