"""Decode stored bytes back into values.

* :func:`decode_row` — with the generated schema model: gives the same Python values
  ``pyarrow``'s ``to_pylist`` gives for the source row (Decimal, date, datetime, UUID,
  dicts for structs, lists, lists of ``(key, value)`` tuples for maps). Used by the
  round-trip tests.
* :class:`ReadableJson` — with only a version's stored descriptor set: the readable JSON
  the CLI's ``get`` and ``scan`` and the console show (see its docstring for the mapping).
* :func:`message_to_json` — protobuf's own JSON mapping of a message.
"""

from __future__ import annotations

import base64
import math
import re
import struct
import uuid
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from google.protobuf import descriptor_pb2, json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from bulldozer.schema.model import DAY_MICROS, ProtoField, ProtoMessage

__all__ = ["ReadableJson", "decode_row", "iceberg_types", "message_to_json", "parse_key", "timestamp_text"]

_EPOCH_DATE = date(1970, 1, 1)
_EPOCH = datetime(1970, 1, 1)


def _scalar(f: ProtoField, kind: str, value: Any) -> Any:
    if kind == "decimal":
        return Decimal(value)
    if kind == "date":
        return _EPOCH_DATE + timedelta(days=value)
    if kind == "time":
        return (datetime.min + timedelta(microseconds=value)).time() if value else time(0)
    if kind == "uuid":
        return uuid.UUID(bytes=bytes(value))
    if kind == "timestamp":
        micros = value.seconds * 1_000_000 + value.nanos // 1_000
        naive = _EPOCH + timedelta(microseconds=micros)
        leaf_type = f.element_type or f.iceberg_type
        return naive.replace(tzinfo=UTC) if leaf_type.startswith("timestamptz") else naive
    return value


def _leaf(f: ProtoField, value: Any) -> Any:
    """One element / map value / singular value of ``f``, already known to be present."""
    if f.kind == "scalar":
        assert f.scalar is not None
        return _scalar(f, f.scalar, value)
    assert f.message is not None
    return _message(f.message, value)


def _message(msg: ProtoMessage, m: Message) -> Any:
    if msg.wrapper:
        return _field(msg.fields[0], m)
    if msg.entry:
        key, value = msg.fields
        return (_field(key, m), _field(value, m))
    return {f.column.rsplit(".", 1)[-1].rstrip("[]{}"): _field(f, m) for f in msg.fields}


def _field(f: ProtoField, m: Message) -> Any:
    value = getattr(m, f.name)
    if f.kind == "map":
        assert f.value is not None and f.scalar is not None
        return [(_scalar(f, f.scalar, k), _leaf(f.value, v)) for k, v in value.items()]
    if f.repeated:
        return [_leaf(f, v) for v in value]
    if f.has_presence and not m.HasField(f.name):
        return None
    return _leaf(f, value)


def decode_row(key_msg: ProtoMessage, value_msg: ProtoMessage, key: Message, value: Message) -> dict[str, Any]:
    """The source row (column → value) that ``key`` and ``value`` were encoded from."""
    row = {f.column: _field(f, key) for f in key_msg.fields}
    row.update({f.column: _field(f, value) for f in value_msg.fields})
    return row


def message_to_json(message: Message) -> dict[str, Any]:
    """A JSON-ready dict with the proto field names (decimals stay exact strings)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


# ---------------------------------------------------------------- readable JSON

_TIMESTAMP = "google.protobuf.Timestamp"
#: a generated field's comment: ``column: iceberg type`` and, when remapped, `` (iceberg id N)``
_COMMENT = re.compile(r"^\s*(?P<column>[^:]+): (?P<type>.+?)(?: \(iceberg id \d+\))?\s*$")
_WRAPPER_SUFFIXES = ("List", "Map", "Item", "Value")


def iceberg_types(descriptor_set: bytes) -> dict[str, str]:
    """Each generated field's Iceberg type by the field's full proto name, read from the
    comments the descriptor set keeps (:func:`bulldozer.schema.compile.compile_proto`);
    empty for a version stored without them."""
    from bulldozer.schema.compile import stored_files

    files = stored_files(descriptor_set)
    types: dict[str, str] = {}
    for file_proto in files:
        comments = {tuple(loc.path): loc.trailing_comments for loc in file_proto.source_code_info.location}
        todo: list[tuple[descriptor_pb2.DescriptorProto, str, tuple[int, ...]]] = [
            (msg, file_proto.package, (4, i)) for i, msg in enumerate(file_proto.message_type)
        ]
        while comments and todo:
            msg, scope, path = todo.pop()
            for j, f in enumerate(msg.field):
                m = _COMMENT.match(comments.get((*path, 2, j), ""))
                if m:
                    types[f"{scope}.{msg.name}.{f.name}"] = m.group("type")
            todo += [(nested, f"{scope}.{msg.name}", (*path, 3, k)) for k, nested in enumerate(msg.nested_type)]
    return types


def _type_args(text: str) -> list[str]:
    """The top-level arguments of ``list<…>`` / ``map<…, …>``."""
    inner = text[text.index("<") + 1 : -1]
    args, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "," and depth == 0:
            args.append(inner[start:i].strip())
            start = i + 1
    args.append(inner[start:].strip())
    return args


def parse_key(text: str) -> Any:
    """A key written as JSON (``get --key``, the console's lookup), parsed; raises
    InvalidArgumentError saying why it is not one (also for nesting too deep to parse, and
    for a field named twice: which of its values was meant is not known)."""
    import json

    from bulldozer.config_files import RepeatedKey, load_json
    from bulldozer.errors import InvalidArgumentError

    try:
        return load_json(text)
    except RepeatedKey as exc:
        raise InvalidArgumentError(f"the key names {exc.key!r} more than once") from None
    except json.JSONDecodeError as exc:
        raise InvalidArgumentError(f"the key is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidArgumentError("the key is nested too deeply to be a key") from None


class ReadableJson:
    """A version's keys and values as readable JSON, from its stored descriptor set alone.

    The protobuf JSON mapping, except where it is not readable for the source's types:

    ========================= ===================================================
    Iceberg type              JSON
    ========================= ===================================================
    int, long                 number (protobuf's mapping writes int64 as a string;
                              beyond 2^53 a JavaScript reader loses precision)
    date                      ``"2024-05-01"`` (stored as days since 1970-01-01)
    time                      ``"13:45:00.250000"`` (stored as microseconds)
    timestamp(_ns)            ``"2024-05-01T13:45:00.25"``: no zone, as in the table
    timestamptz(_ns)          ``"2024-05-01T13:45:00.25Z"`` (UTC)
    uuid                      ``"3f2c…-…"``, the canonical text
    decimal                   the exact text, ``"12.30"``
    fixed, binary             base64 (standard alphabet), as protobuf's mapping
    float, double             number; ``"NaN"``, ``"Infinity"``, ``"-Infinity"``
    struct                    object, every field present (``null`` when unset)
    list                      array (a null list is ``null``, an empty one ``[]``)
    map                       object, keys as text; a map whose keys are structs is
                              an array of ``{"key": …, "value": …}``
    ========================= ===================================================

    A version stored before its descriptor kept the fields' types (no comments) gets the
    same mapping with dates, times and uuids as their stored numbers and bytes.
    """

    def __init__(self, descriptor_set: bytes) -> None:
        self.types = iceberg_types(descriptor_set)

    def key_bytes(self, key_cls: Any, data: Any) -> bytes:
        """The stored bytes of the key ``data`` (a JSON object of every key field, written as
        this class prints keys: ISO dates, uuids as text…). Raises InvalidArgumentError
        naming what is wrong."""
        from bulldozer.errors import InvalidArgumentError

        desc = key_cls.DESCRIPTOR
        if not isinstance(data, dict):
            raise InvalidArgumentError(f"a key is a JSON object of the key fields ({_names(desc)})")
        unknown = [name for name in data if name not in desc.fields_by_name]
        if unknown:
            from bulldozer.names import did_you_mean

            hint = f" ({hint})" if (hint := did_you_mean(str(unknown[0]), desc.fields_by_name)) else ""
            raise InvalidArgumentError(f"the key has no field {unknown[0]!r}{hint}; its fields are {_names(desc)}")
        missing = [f.name for f in desc.fields if f.name not in data]
        if missing:
            raise InvalidArgumentError(f"the key needs every key field ({_names(desc)}); missing: {', '.join(missing)}")
        if nulls := [name for name, value in data.items() if value is None]:
            # protobuf's parser takes null as unset: a key no row has, said as "no value"
            raise InvalidArgumentError(
                f"the key's {nulls[0]!r} is null; no key field is (a key with a null is not loaded)"
            )
        proto_json = {}
        for name, value in data.items():
            f = desc.fields_by_name.get(name)
            proto_json[name] = self._key_value(f, value) if f is not None and isinstance(value, str) else value
        try:
            return bytes(json_format.ParseDict(proto_json, key_cls()).SerializeToString())
        except json_format.ParseError as exc:
            raise InvalidArgumentError(f"the key does not match {desc.full_name}: {exc}") from None

    def _key_value(self, f: FieldDescriptor, text: str) -> Any:
        """A key field given as readable text, in protobuf's JSON mapping."""
        iceberg = self.types.get(f.full_name, "")
        try:
            if iceberg == "date":
                return _date_days(text)
            if iceberg == "time":
                t = time.fromisoformat(text)
                return ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond
            if iceberg == "uuid":
                return base64.b64encode(uuid.UUID(text).bytes).decode("ascii")
            if iceberg in ("timestamp", "timestamp_ns") and not text.endswith("Z"):
                return text + "Z"
        except ValueError:
            return text  # protobuf's parser names the field and the problem
        return text

    def __call__(self, message: Message) -> dict[str, Any]:
        # the class's: a version loaded before such names were refused may have a field
        # DESCRIPTOR, which hides the message's own (bulldozer.schema.reader_names)
        out: dict[str, Any] = self._message(type(message).DESCRIPTOR, message)
        return out

    def decode(self, cls: Any, data: bytes) -> dict[str, Any]:
        """The stored bytes ``data`` of a ``cls`` (a version's key or value class), readable;
        UnreadableRecordError, one line, when they do not parse as one."""
        from google.protobuf.message import DecodeError

        from bulldozer.errors import UnreadableRecordError

        try:
            message = cls.FromString(data)
        except DecodeError as exc:
            raise UnreadableRecordError(f"a stored record does not parse with its version's schema: {exc}") from None
        return self(message)

    def _message(self, desc: Any, m: Message) -> Any:
        return {f.name: self._field(f, m) for f in desc.fields}

    def _field(self, f: FieldDescriptor, m: Message) -> Any:
        iceberg = self.types.get(f.full_name, "")
        value = getattr(m, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key_f, value_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            k_type, v_type = _type_args(iceberg) if iceberg.startswith("map<") else ("", "")
            return {_key_text(self._leaf(key_f, k, k_type)): self._leaf(value_f, v, v_type) for k, v in value.items()}
        if f.is_repeated:
            element = _type_args(iceberg)[0] if iceberg.startswith("list<") else ""
            items = [self._leaf(f, v, element) for v in value]
            if f.message_type is not None and _is_entry(f.message_type):
                return _entries(items)
            return items
        if f.has_presence and not m.HasField(f.name):
            return None
        return self._leaf(f, value, iceberg)

    def _leaf(self, f: FieldDescriptor, value: Any, iceberg: str) -> Any:
        msg = f.message_type
        if msg is not None:
            if msg.full_name == _TIMESTAMP:
                text = timestamp_text(value.seconds, value.nanos)
                return text[:-1] if iceberg in ("timestamp", "timestamp_ns") else text
            if _is_wrapper(msg):
                return self._field(msg.fields[0], value)
            if _is_entry(msg):
                return (self._field(msg.fields_by_name["key"], value), self._field(msg.fields_by_name["value"], value))
            return self._message(msg, value)
        if iceberg == "date" and f.type == FieldDescriptor.TYPE_INT32:
            return _date_text(value)
        if iceberg == "time" and f.type == FieldDescriptor.TYPE_INT64:
            # a time outside a day (stored by a release that did not refuse one) as its number
            return (
                (datetime.min + timedelta(microseconds=value)).time().isoformat() if 0 <= value < DAY_MICROS else value
            )
        if f.type == FieldDescriptor.TYPE_BYTES:
            if iceberg == "uuid" and len(value) == 16:
                return str(uuid.UUID(bytes=bytes(value)))
            return base64.b64encode(value).decode("ascii")
        if isinstance(value, float):
            if not math.isfinite(value):
                return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
            return _shortest_float32(value) if f.type == FieldDescriptor.TYPE_FLOAT else value
        return value


_ORDINAL_1970 = _EPOCH_DATE.toordinal()
_DAYS_PER_400_YEARS = 146_097  # the Gregorian calendar repeats every 400 years, to the weekday
_EXTENDED_DATE = re.compile(r"(-?)(\d{4,})-(\d{2})-(\d{2})")


def _date_text(days: int) -> str:
    """An Iceberg date (days since 1970-01-01) as ISO 8601 text. A year past 9999 or before
    1, which an Iceberg date holds and Python's cannot, gets as many digits as it needs and
    a sign when negative (``"10000-01-01"``, ``"0000-12-31"``, ``"-0001-01-01"``)."""
    ordinal = _ORDINAL_1970 + days
    cycles = (ordinal - 1) // _DAYS_PER_400_YEARS if not 1 <= ordinal <= date.max.toordinal() else 0
    day = date.fromordinal(ordinal - cycles * _DAYS_PER_400_YEARS)
    year = day.year + 400 * cycles
    return f"{'-' if year < 0 else ''}{abs(year):04d}-{day.month:02d}-{day.day:02d}"


def _date_days(text: str) -> int:
    """The days since 1970-01-01 of a date :func:`_date_text` writes; ValueError if it is none."""
    m = _EXTENDED_DATE.fullmatch(text)
    if not m:
        raise ValueError(text)
    year = int(m.group(2)) * (-1 if m.group(1) else 1)
    cycles = (year - 1) // 400
    in_range = date(year - 400 * cycles, int(m.group(3)), int(m.group(4)))
    return in_range.toordinal() + cycles * _DAYS_PER_400_YEARS - _ORDINAL_1970


def timestamp_text(seconds: int, nanos: int) -> str:
    """A google.protobuf.Timestamp as protobuf's JSON writes it (``Z``; 0, 3, 6 or 9
    digits of fraction). One outside the years 1 to 9999, which protobuf refuses to write
    (a run refuses to store one; another tool may have), with its date as :func:`_date_text`
    writes dates."""
    from google.protobuf.timestamp_pb2 import Timestamp

    try:
        return str(Timestamp(seconds=seconds, nanos=nanos).ToJsonString())
    except ValueError:
        days, second = divmod(seconds, 86_400)
        text = f"{_date_text(days)}T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}"
        if nanos:
            digits = 3 if nanos % 1_000_000 == 0 else 6 if nanos % 1_000 == 0 else 9
            text += "." + f"{nanos:09d}"[:digits]
        return text + "Z"


def _shortest_float32(value: float) -> float:
    """The shortest decimal that reads back as the same 32-bit float (0.1, not 0.10000000149)."""
    packed = struct.pack("<f", value)
    for digits in range(6, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.pack("<f", candidate) == packed:
            return candidate
    return value


def _names(desc: Descriptor) -> str:
    return ", ".join(f.name for f in desc.fields)


def _is_wrapper(msg: Descriptor) -> bool:
    """A generated ``<Field>List`` / ``Map`` / ``Item`` / ``Value`` message: one field, 1,
    named ``values`` or ``entries`` (a struct's fields carry Iceberg ids, never 1 there)."""
    return (
        msg.name.endswith(_WRAPPER_SUFFIXES)
        and len(msg.fields) == 1
        and msg.fields[0].number == 1
        and msg.fields[0].name in ("values", "entries")
    )


def _is_entry(msg: Descriptor) -> bool:
    """A generated ``<Field>Entry``: the entry of a map proto's own maps cannot hold."""
    return msg.name.endswith("Entry") and [(f.name, f.number) for f in msg.fields] == [("key", 1), ("value", 2)]


def _key_text(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


def _entries(pairs: list[Any]) -> Any:
    """A map's ``(key, value)`` pairs as an object, or as ``[{key, value}]`` when a key is not text-like."""
    if all(not isinstance(k, (dict, list)) for k, _v in pairs):
        return {_key_text(k): v for k, v in pairs}
    return [{"key": k, "value": v} for k, v in pairs]
