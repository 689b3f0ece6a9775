"""A small model of the generated protobuf schema.

The visitor in :mod:`bulldozer.schema.iceberg` builds it from an Iceberg schema; the
renderer turns it into ``.proto`` text; the encoder walks it next to Arrow columns; the
compatibility check compares two of them (or their descriptors).

Type mapping (Iceberg → proto3), one table for every primitive:

============== ============================ ==============================================
Iceberg        proto                        value on the wire
============== ============================ ==============================================
boolean        bool                         varint 0/1
int            int32                        varint (negatives sign-extended, 10 bytes)
long           int64                        varint
float          float                        fixed32 IEEE 754
double         double                       fixed64 IEEE 754
decimal(p,s)   string                       canonical text with exactly ``s`` digits after
                                            the point (``"-12.30"``): exact, any precision
date           int32                        days since 1970-01-01
time           int64                        microseconds since midnight
timestamp      google.protobuf.Timestamp    wall-clock time written as if it were UTC
timestamptz    google.protobuf.Timestamp    the instant (UTC)
timestamp_ns   google.protobuf.Timestamp    as timestamp, nanosecond precision
timestamptz_ns google.protobuf.Timestamp    as timestamptz, nanosecond precision
string         string                       UTF-8
uuid           bytes                        the 16 bytes, big endian (RFC 4122 order)
fixed(n)       bytes                        the n bytes
binary         bytes                        the bytes
============== ============================ ==============================================

A value its proto type cannot carry to every consumer is refused by the encoder, never
stored: text that is not UTF-8, a timestamp outside ``TIMESTAMP_SECONDS`` (the years 1 to
9999), a time outside ``DAY_MICROS``.

Nested types: a struct becomes a nested message; a list becomes ``repeated``; a map
becomes ``map<K, V>`` when proto allows it. Where proto cannot nest directly, wrapper
messages with predictable names are generated (``Field`` is the field name in PascalCase):

* ``<Field>List``  — a nullable list (``optional <Field>List f``; ``repeated values`` = 1),
  so a null list differs from an empty one;
* ``<Field>Map``   — a nullable map (``entries`` = 1);
* ``<Field>Item``  — the element of a list whose elements are lists or maps;
* ``<Field>Value`` — the value of a map whose values are lists or maps;
* ``<Field>Entry`` — an entry (``key`` = 1, ``value`` = 2) of a map whose key type proto
  maps cannot have (bytes, message, float) — the map becomes ``repeated <Field>Entry``.

Field numbers are Iceberg field ids; the few ids protobuf forbids (19000–19999 and above
536 870 911) are remapped deterministically and the remap is recorded in the model and
in a comment of the rendered file. Key messages use explicit presence (``optional``) on
every field so that a key's bytes never depend on whether a value happens to be zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "DAY_MICROS",
    "FORBIDDEN_NUMBERS",
    "MAX_FIELD_NUMBER",
    "TIMESTAMP",
    "TIMESTAMP_SECONDS",
    "ProtoField",
    "ProtoFile",
    "ProtoMessage",
    "ScalarKind",
    "remap_number",
]

MAX_FIELD_NUMBER = 536_870_911
FORBIDDEN_NUMBERS = range(19_000, 20_000)
TIMESTAMP = "google.protobuf.Timestamp"
#: the seconds a google.protobuf.Timestamp holds: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z
#: (protobuf's JSON mapping and its conversions to a language's time refuse any other)
TIMESTAMP_SECONDS = (-62_135_596_800, 253_402_300_799)
#: an Iceberg time is a time of day: microseconds in [00:00, 24:00)
DAY_MICROS = 86_400_000_000

#: How a leaf value is converted from Arrow before it is written.
ScalarKind = Literal[
    "bool",
    "int32",
    "int64",
    "float",
    "double",
    "string",
    "bytes",
    "decimal",
    "date",
    "time",
    "timestamp",
    "uuid",
]

#: proto scalar type name for each ScalarKind (timestamps are the well-known message).
PROTO_TYPE: dict[str, str] = {
    "bool": "bool",
    "int32": "int32",
    "int64": "int64",
    "float": "float",
    "double": "double",
    "string": "string",
    "bytes": "bytes",
    "decimal": "string",
    "date": "int32",
    "time": "int64",
    "timestamp": TIMESTAMP,
    "uuid": "bytes",
}

#: Types proto allows as map keys.
MAP_KEY_OK = frozenset({"bool", "int32", "int64", "string", "date", "time", "decimal"})


def remap_number(iceberg_id: int) -> int:
    """The proto field number for an Iceberg field id (identity except forbidden ranges)."""
    if 1 <= iceberg_id <= MAX_FIELD_NUMBER and iceberg_id not in FORBIDDEN_NUMBERS:
        return iceberg_id
    # Deterministic band far above any id a table realistically reaches; collisions are
    # checked by the builder.
    return 500_000_000 + (iceberg_id % 36_000_000)


@dataclass
class ProtoField:
    """One field of a generated message.

    ``kind`` says how the value is represented:

    * ``scalar`` — ``scalar`` holds the ScalarKind;
    * ``message`` — ``message`` is the (nested) message the value is;
    * ``map`` — a proto ``map<map_key, map_value>``: ``scalar`` is the key kind and the
      value is described by ``value`` (a ProtoField without a number);

    ``repeated`` marks a list. ``optional`` marks explicit presence.
    """

    name: str
    number: int
    kind: Literal["scalar", "message", "map"]
    iceberg_id: int
    column: str
    scalar: ScalarKind | None = None
    message: ProtoMessage | None = None
    value: ProtoField | None = None
    repeated: bool = False
    optional: bool = False
    #: Iceberg type string (for reports and the compatibility check).
    iceberg_type: str = ""
    #: Whether Arrow may hold nulls for elements / map values at this position.
    elements_nullable: bool = False
    #: For a repeated field: the Iceberg type of one element (``iceberg_type`` is the list's).
    element_type: str = ""

    @property
    def has_presence(self) -> bool:
        """Whether a record says the field is absent (its column null): an ``optional``
        scalar, a message (a struct, a wrapper of a nullable list or map), a timestamp."""
        return self.optional or self.kind == "message" or self.scalar == "timestamp"

    def type_name(self, scope: str = "") -> str:
        if self.kind == "map":
            assert self.value is not None and self.scalar is not None
            return f"map<{PROTO_TYPE[self.scalar]}, {self.value.type_name(scope)}>"
        if self.kind == "message":
            assert self.message is not None
            return self.message.qualified_name(scope)
        assert self.scalar is not None
        return PROTO_TYPE[self.scalar]


@dataclass
class ProtoMessage:
    """A generated message; ``nested`` holds messages defined inside it."""

    name: str
    fields: list[ProtoField] = field(default_factory=list)
    nested: list[ProtoMessage] = field(default_factory=list)
    parent: ProtoMessage | None = field(default=None, repr=False)
    reserved: list[int] = field(default_factory=list)
    reserved_names: list[str] = field(default_factory=list)
    #: A wrapper holds one field (number 1) with the same data as the field that uses it.
    wrapper: bool = False
    #: An entry (``key`` = 1, ``value`` = 2) of a map proto cannot express natively.
    entry: bool = False

    @property
    def path(self) -> str:
        return f"{self.parent.path}.{self.name}" if self.parent else self.name

    def qualified_name(self, scope: str = "") -> str:
        """Name relative to ``scope`` (the path of the message that refers to it)."""
        path = self.path
        if scope and path.startswith(scope + "."):
            return path[len(scope) + 1 :]
        return path

    def sorted_fields(self) -> list[ProtoField]:
        return sorted(self.fields, key=lambda f: f.number)


@dataclass
class ProtoFile:
    """The generated file: package, options and the key and value messages."""

    package: str
    key: ProtoMessage
    value: ProtoMessage
    options: dict[str, str] = field(default_factory=dict)
    #: ``{iceberg field id: proto number}`` for every id that had to be remapped.
    remapped: dict[int, int] = field(default_factory=dict)
    #: ``{column: (iceberg id, iceberg type)}`` of the source columns, for reports.
    source: str = ""

    @property
    def uses_timestamp(self) -> bool:
        def walk(m: ProtoMessage) -> bool:
            for f in m.fields:
                leaf = f.value if f.kind == "map" else f
                if leaf is not None and leaf.kind == "scalar" and leaf.scalar == "timestamp":
                    return True
            return any(walk(n) for n in m.nested)

        return walk(self.key) or walk(self.value)
