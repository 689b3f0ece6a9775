"""Iceberg schema → protobuf model.

Two steps, in the style of pyiceberg's own visitors:

1. :class:`_TypeMapper`, a ``SchemaVisitorPerPrimitiveType``, maps every Iceberg type to
   an unnamed shape (:class:`Shape`) bottom-up — this is where the mapping table of
   :mod:`bulldozer.schema.model` lives and where unsupported types are refused, naming
   the column;
2. :class:`_MessageBuilder` walks the shapes top-down, names nested and wrapper
   messages, applies the spec's renames and assigns field numbers (Iceberg ids).
"""

from __future__ import annotations

import keyword
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.schema import Schema, SchemaVisitorPerPrimitiveType, visit
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from bulldozer.errors import SchemaError
from bulldozer.names import did_you_mean
from bulldozer.schema.model import (
    MAP_KEY_OK,
    ProtoField,
    ProtoFile,
    ProtoMessage,
    ScalarKind,
    remap_number,
)
from bulldozer.schema.reader_names import FieldKind, NamedField, NamedMessage, clashes, map_entry_name
from bulldozer.spec.models import PROTO_KEYWORDS, JobSpec

__all__ = ["Shape", "generate_proto", "proto_field_name", "select_columns"]

_FIELD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BAD_KEY_KINDS = frozenset({"float", "double"})


@dataclass
class Shape:
    """An unnamed proto shape for one Iceberg type."""

    kind: str  # "scalar" | "struct" | "list" | "map"
    iceberg_type: str
    scalar: ScalarKind | None = None
    fields: list[tuple[NestedField, Shape]] = field(default_factory=list)
    element: Shape | None = None
    element_id: int = 0
    element_required: bool = True
    key: Shape | None = None
    value: Shape | None = None
    value_required: bool = True


class _TypeMapper(SchemaVisitorPerPrimitiveType[Shape]):
    """Maps each Iceberg type to a Shape; refuses types proto cannot hold soundly."""

    def __init__(self) -> None:
        self.path: list[str] = []

    def before_field(self, field: NestedField) -> None:
        self.path.append(field.name)

    def after_field(self, field: NestedField) -> None:
        self.path.pop()

    def _refuse(self, what: IcebergType) -> Shape:
        column = ".".join(self.path) or "?"
        raise SchemaError(
            f"column {column!r} has type {what}, which Bulldozer cannot map to protobuf; "
            "drop it from value_columns or cast it in a query source"
        )

    def schema(self, schema: Schema, struct_result: Shape) -> Shape:
        return struct_result

    def struct(self, struct: StructType, field_results: list[Shape]) -> Shape:
        return Shape("struct", str(struct), fields=list(zip(struct.fields, field_results, strict=True)))

    def field(self, field: NestedField, field_result: Shape) -> Shape:
        return field_result

    def list(self, list_type: ListType, element_result: Shape) -> Shape:
        return Shape(
            "list",
            str(list_type),
            element=element_result,
            element_id=list_type.element_id,
            element_required=list_type.element_required,
        )

    def map(self, map_type: MapType, key_result: Shape, value_result: Shape) -> Shape:
        return Shape(
            "map",
            str(map_type),
            key=key_result,
            value=value_result,
            value_required=map_type.value_required,
        )

    def _scalar(self, kind: ScalarKind, t: IcebergType) -> Shape:
        return Shape("scalar", str(t), scalar=kind)

    def visit_boolean(self, boolean_type: BooleanType) -> Shape:
        return self._scalar("bool", boolean_type)

    def visit_integer(self, integer_type: IntegerType) -> Shape:
        return self._scalar("int32", integer_type)

    def visit_long(self, long_type: LongType) -> Shape:
        return self._scalar("int64", long_type)

    def visit_float(self, float_type: FloatType) -> Shape:
        return self._scalar("float", float_type)

    def visit_double(self, double_type: DoubleType) -> Shape:
        return self._scalar("double", double_type)

    def visit_decimal(self, decimal_type: DecimalType) -> Shape:
        return self._scalar("decimal", decimal_type)

    def visit_date(self, date_type: DateType) -> Shape:
        return self._scalar("date", date_type)

    def visit_time(self, time_type: TimeType) -> Shape:
        return self._scalar("time", time_type)

    def visit_timestamp(self, timestamp_type: TimestampType) -> Shape:
        return self._scalar("timestamp", timestamp_type)

    def visit_timestamp_ns(self, timestamp_ns_type: TimestampNanoType) -> Shape:
        return self._scalar("timestamp", timestamp_ns_type)

    def visit_timestamptz(self, timestamptz_type: TimestamptzType) -> Shape:
        return self._scalar("timestamp", timestamptz_type)

    def visit_timestamptz_ns(self, timestamptz_ns_type: TimestamptzNanoType) -> Shape:
        return self._scalar("timestamp", timestamptz_ns_type)

    def visit_string(self, string_type: StringType) -> Shape:
        return self._scalar("string", string_type)

    def visit_uuid(self, uuid_type: UUIDType) -> Shape:
        return self._scalar("uuid", uuid_type)

    def visit_fixed(self, fixed_type: FixedType) -> Shape:
        return self._scalar("bytes", fixed_type)

    def visit_binary(self, binary_type: BinaryType) -> Shape:
        return self._scalar("bytes", binary_type)

    def visit_unknown(self, unknown_type: Any) -> Shape:
        return self._refuse(unknown_type)

    def visit_geometry(self, geometry_type: Any) -> Shape:
        return self._refuse(geometry_type)

    def visit_geography(self, geography_type: Any) -> Shape:
        return self._refuse(geography_type)


def shape_of(schema: Schema) -> Shape:
    """The Shape of a whole table schema (a struct)."""
    return visit(schema, _TypeMapper())


def pascal(name: str) -> str:
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", name) if p]
    out = "".join(p[:1].upper() + p[1:] for p in parts) or "Field"
    return out if not out[0].isdigit() else "F" + out


def proto_field_name(column: str) -> str:
    """The proto field name for a column: invalid characters become ``_``."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", column)
    if not name or name[0].isdigit():
        name = "_" + name
    return name


def _check_name(name: str, column: str, top_level: bool) -> None:
    if name in PROTO_KEYWORDS or keyword.iskeyword(name):
        hint = (
            f"; rename it in data_movement.renames (e.g. {column}: {name}_)"
            if top_level
            else "; rename the nested field in the table"
        )
        raise SchemaError(f"column {column!r} becomes the field {name!r}, a reserved word{hint}")
    if not _FIELD_RE.fullmatch(name):
        raise SchemaError(f"column {column!r} cannot become a proto field name ({name!r})")


class _MessageBuilder:
    def __init__(self) -> None:
        self.remapped: dict[int, int] = {}

    def number(self, iceberg_id: int) -> int:
        n = remap_number(iceberg_id)
        if n != iceberg_id:
            self.remapped[iceberg_id] = n
        return n

    def message(
        self,
        name: str,
        parent: ProtoMessage | None,
        members: list[tuple[NestedField, Shape, str]],
        column_prefix: str,
        explicit_presence: bool = False,
    ) -> ProtoMessage:
        """A message with one field per ``(iceberg field, shape, proto name)``."""
        msg = ProtoMessage(name, parent=parent)
        if parent is not None:
            parent.nested.append(msg)
        seen: dict[str, str] = {}
        numbers: dict[int, str] = {}
        for nf, shape, fname in members:
            column = f"{column_prefix}{nf.name}"
            _check_name(fname, column, top_level=not column_prefix)
            if fname in seen:
                raise SchemaError(
                    f"columns {seen[fname]!r} and {column!r} both become the proto field "
                    f"{fname!r}; rename one in data_movement.renames"
                )
            seen[fname] = column
            number = self.number(nf.field_id)
            if number in numbers:
                raise SchemaError(f"field number {number} of {column!r} collides with {numbers[number]!r}")
            numbers[number] = column
            f = self.field(msg, fname, number, nf.field_id, column, shape, not nf.required)
            if explicit_presence and f.kind == "scalar" and not f.repeated:
                f.optional = True
            msg.fields.append(f)
        _check_nested_names(msg, column_prefix)
        _check_reader_names(msg, top_level=not column_prefix)
        return msg

    def field(
        self,
        owner: ProtoMessage,
        name: str,
        number: int,
        iceberg_id: int,
        column: str,
        shape: Shape,
        nullable: bool,
        base: str | None = None,
    ) -> ProtoField:
        """The field ``name`` of ``owner`` holding a value of ``shape``; nested messages it
        needs are defined in ``owner`` and named from ``base`` (default: ``name``)."""
        base = base or pascal(name)
        if shape.kind == "scalar":
            return ProtoField(
                name,
                number,
                "scalar",
                iceberg_id,
                column,
                scalar=shape.scalar,
                optional=nullable,
                iceberg_type=shape.iceberg_type,
            )
        if shape.kind == "struct":
            nested = self.message(
                base,
                owner,
                [(nf, s, proto_field_name(nf.name)) for nf, s in shape.fields],
                column + ".",
            )
            return ProtoField(
                name,
                number,
                "message",
                iceberg_id,
                column,
                message=nested,
                optional=nullable,
                iceberg_type=shape.iceberg_type,
            )
        if nullable:
            # repeated / map fields have no presence: wrap them so null != empty.
            suffix = "List" if shape.kind == "list" else "Map"
            wrapper = ProtoMessage(base + suffix, parent=owner, wrapper=True)
            owner.nested.append(wrapper)
            inner_name = "values" if shape.kind == "list" else "entries"
            wrapper.fields.append(self.field(owner, inner_name, 1, 0, column, shape, False, base))
            return ProtoField(
                name,
                number,
                "message",
                iceberg_id,
                column,
                message=wrapper,
                optional=True,
                iceberg_type=shape.iceberg_type,
            )
        if shape.kind == "list":
            assert shape.element is not None
            elem = self.leaf(owner, base + "Item", shape.element, column + "[]", shape.element_id)
            elem.name, elem.number, elem.iceberg_id, elem.column = name, number, iceberg_id, column
            elem.repeated = True
            elem.optional = False
            elem.element_type = elem.iceberg_type
            elem.iceberg_type = shape.iceberg_type
            elem.elements_nullable = not shape.element_required
            return elem
        assert shape.key is not None and shape.value is not None
        key_kind = shape.key.scalar if shape.key.kind == "scalar" else None
        value = self.leaf(owner, base + "Value", shape.value, column + "{}", 0)
        if key_kind in MAP_KEY_OK:
            return ProtoField(
                name,
                number,
                "map",
                iceberg_id,
                column,
                scalar=key_kind,
                value=value,
                iceberg_type=shape.iceberg_type,
                elements_nullable=not shape.value_required,
            )
        # proto maps cannot have this key type: repeated entries instead.
        entry = ProtoMessage(base + "Entry", parent=owner, entry=True)
        owner.nested.append(entry)
        key = self.leaf(entry, "Key", shape.key, column + "{key}", 0)
        key.name, key.number = "key", 1
        value_in_entry = self.leaf(entry, "Value", shape.value, column + "{}", 0)
        value_in_entry.name, value_in_entry.number = "value", 2
        value_in_entry.optional = (
            not shape.value_required and value_in_entry.kind != "map" and not value_in_entry.repeated
        )
        entry.fields.extend([key, value_in_entry])
        return ProtoField(
            name,
            number,
            "message",
            iceberg_id,
            column,
            message=entry,
            repeated=True,
            iceberg_type=shape.iceberg_type,
        )

    def leaf(self, owner: ProtoMessage, wrapper_name: str, shape: Shape, column: str, iceberg_id: int) -> ProtoField:
        """A list element or map value: scalars and structs directly, lists and maps wrapped."""
        if shape.kind == "scalar":
            return ProtoField(
                "",
                0,
                "scalar",
                iceberg_id,
                column,
                scalar=shape.scalar,
                iceberg_type=shape.iceberg_type,
            )
        if shape.kind == "struct":
            nested = self.message(
                wrapper_name,
                owner,
                [(nf, s, proto_field_name(nf.name)) for nf, s in shape.fields],
                column + ".",
            )
            return ProtoField(
                "",
                0,
                "message",
                iceberg_id,
                column,
                message=nested,
                iceberg_type=shape.iceberg_type,
            )
        wrapper = ProtoMessage(wrapper_name, parent=owner, wrapper=True)
        owner.nested.append(wrapper)
        inner_name = "values" if shape.kind == "list" else "entries"
        wrapper.fields.append(self.field(owner, inner_name, 1, 0, column, shape, False, wrapper_name))
        return ProtoField("", 0, "message", iceberg_id, column, message=wrapper, iceberg_type=shape.iceberg_type)


def _check_nested_names(msg: ProtoMessage, column_prefix: str) -> None:
    names = Counter([n.name for n in msg.nested] + [f.name for f in msg.fields])
    dupes = sorted(n for n, count in names.items() if count > 1)
    if dupes:
        where = column_prefix.rstrip(".") or msg.name
        raise SchemaError(
            f"in {where!r}, the generated names {dupes} collide (fields whose names differ only "
            "in case or punctuation); rename one of them"
        )


def _field_kind(f: ProtoField) -> FieldKind:
    """How the generated accessors see ``f`` (a timestamp is a message to them)."""
    if f.kind == "map":
        return "map"
    if f.kind == "message" or f.scalar == "timestamp":
        return "repeated_message" if f.repeated else "message"
    if f.repeated:
        return "repeated"
    return "string" if f.scalar in ("string", "decimal") else "scalar"


def _named_message(msg: ProtoMessage) -> NamedMessage:
    """``msg`` as the client-name rules take it (``reader_names.clashes``): its nested
    messages named with the columns they were made for, the entries protoc makes for its
    map fields among them."""
    enclosing: list[str] = []
    parent = msg.parent
    while parent is not None:
        enclosing.insert(0, parent.name)
        parent = parent.parent
    made_for: dict[int, str] = {}
    entries: list[tuple[str, str]] = []
    for f in msg.fields:
        for holder in (f, f.value):
            if holder is not None and holder.message is not None:
                made_for.setdefault(id(holder.message), f.column)
        if f.kind == "map":
            entries.append((map_entry_name(f.name), f.column))
    nested = tuple((n.name, made_for.get(id(n), n.name)) for n in msg.nested) + tuple(entries)
    fields = tuple(NamedField(f.name, _field_kind(f), f.column) for f in msg.fields)
    return NamedMessage(msg.name, tuple(enclosing), fields, nested)


def _check_reader_names(msg: ProtoMessage, top_level: bool) -> None:
    """Refuse names a generated client could not use (``bulldozer.schema.reader_names``)."""
    found = clashes(_named_message(msg))
    if found:
        if top_level:
            which = "them" if len(found) > 1 else "one of them" if len(found[0].columns) > 1 else "it"
            hint = f"rename {which} in data_movement.renames"
        else:
            hint = "rename the nested field in the table"
        raise SchemaError("; ".join(c.text for c in found) + f": {hint}")


def select_columns(spec: JobSpec, schema: Schema) -> tuple[list[NestedField], list[NestedField]]:
    """The key and value columns of ``schema`` the spec selects, in spec order. Raises
    SchemaError naming each column that does not exist (with a "did you mean")."""
    names = [f.name for f in schema.fields]
    by_name = {f.name: f for f in schema.fields}
    dm = spec.data_movement
    value_names = (
        list(dm.value_columns) if dm.value_columns is not None else [n for n in names if n not in set(dm.key_columns)]
    )
    missing = []
    for col in [*dm.key_columns, *value_names]:
        if col not in by_name:
            hint = did_you_mean(col, names)
            missing.append(f"{col!r}" + (f" ({hint})" if hint else ""))
    if missing:
        raise SchemaError(f"no such column in the table: {', '.join(missing)}")
    return [by_name[c] for c in dm.key_columns], [by_name[c] for c in value_names]


def generate_proto(spec: JobSpec, schema: Schema, source: str = "") -> ProtoFile:
    """The key and value messages for ``spec`` over the table ``schema``."""
    keys, values = select_columns(spec, schema)
    shapes = {nf.field_id: shape for nf, shape in shape_of(schema).fields}
    renames = spec.data_movement.renames
    for nf in keys:
        shape = shapes[nf.field_id]
        if shape.kind != "scalar" or shape.scalar in _BAD_KEY_KINDS:
            raise SchemaError(
                f"key column {nf.name!r} has type {nf.field_type}; "
                "key bytes must be deterministic, "
                "so keys may not be float, double, struct, list or map"
            )
    builder = _MessageBuilder()
    proto = spec.bulldozer_protobuf

    def members(cols: list[NestedField]) -> list[tuple[NestedField, Shape, str]]:
        return [(nf, shapes[nf.field_id], renames.get(nf.name, proto_field_name(nf.name))) for nf in cols]

    key = builder.message(proto.key_message, None, members(keys), "", explicit_presence=True)
    value = builder.message(proto.value_message, None, members(values), "")
    options = {}
    if proto.output.java_package:
        options["java_package"] = proto.output.java_package
        options["java_multiple_files"] = "true"
    if proto.output.go_package:
        options["go_package"] = proto.output.go_package
    return ProtoFile(proto.package, key, value, options=options, remapped=dict(builder.remapped), source=source)
