"""Decode stored bytes back into values.

* :func:`decode_row` — with the generated schema model: gives the same Python values
  ``pyarrow``'s ``to_pylist`` gives for the source row (Decimal, date, datetime, UUID,
  dicts for structs, lists, lists of ``(key, value)`` tuples for maps). Used by the
  round-trip tests.
* :func:`message_to_json` — with only a message class (from a version's stored
  descriptor set): a JSON-ready dict, used by the CLI's ``get`` and ``scan``.
"""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from bulldozer.schema.model import ProtoField, ProtoMessage

__all__ = ["decode_row", "message_to_json"]

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
    has_presence = f.optional or f.kind == "message" or f.scalar == "timestamp"
    if has_presence and not m.HasField(f.name):
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
