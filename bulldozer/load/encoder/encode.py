"""Arrow record batches → protobuf (key bytes, value bytes), written column by column.

This is the hot path of every load, shared by the local and the Spark engine. Instead of
building one message object per row, it writes the protobuf wire format straight from
Arrow columns: each field becomes a row layout (``bulldozer.load.encoder.layouts``: a tag and a
varint, fixed bytes or a length-delimited payload per row, nested messages and the
elements of repeated fields and maps as trees of those), numpy prepares the values column
by column, and compiled kernels (``bulldozer._kernels``) write every row's bytes straight
into one output buffer per batch. ``bench/encode.py`` compares this with iterating rows.

The output is byte-identical to protobuf's own serializer for these messages (fields in
number order, implicit-presence defaults omitted, packed repeated scalars), which the
tests check, so a key a consumer builds with the generated class finds its row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bulldozer.codec.buffers import binary_view
from bulldozer.codec.protowire import varint
from bulldozer.errors import SourceDataError
from bulldozer.load.encoder.layouts import (
    BytesRows,
    ConcatRows,
    FixedRows,
    GroupedRows,
    Rows,
    VarintRows,
    decimal_strings,
    fixed_rows,
    materialize,
)
from bulldozer.schema.model import DAY_MICROS, TIMESTAMP_SECONDS, ProtoField, ProtoFile, ProtoMessage

if TYPE_CHECKING:
    from bulldozer.kv.types import StoreInfo

__all__ = ["EncodedBatch", "RowEncoder"]

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
_PACKABLE = frozenset({"bool", "int32", "int64", "float", "double", "date", "time"})
_UNIT_DIV = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


@dataclass
class EncodedBatch:
    """Encoded rows of one record batch: ``keys[i]`` and ``values[i]`` belong together."""

    keys: pa.Array  # large_binary, no nulls
    values: pa.Array  # large_binary, no nulls

    def __len__(self) -> int:
        return len(self.keys)

    def pairs(self) -> list[tuple[bytes, bytes]]:
        return list(zip(self.keys.to_pylist(), self.values.to_pylist(), strict=True))


# ------------------------------------------------------------------ wire helpers


def _tag(number: int, wire: int) -> bytes:
    return varint((number << 3) | wire)


def _lengths(arr: pa.Array) -> np.ndarray[Any, Any]:
    offsets, _data = binary_view(arr)
    return np.diff(offsets).astype(np.int64, copy=False)


def _valid(arr: pa.Array) -> np.ndarray[Any, Any]:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _list_parts(arr: pa.Array) -> tuple[pa.Array, np.ndarray[Any, Any]]:
    """The elements a list or map array's rows cover (map: the entries struct) and the
    count per row. Null rows keep whatever range backs them; callers mask those rows."""
    offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    start = int(offsets[0]) if len(offsets) else 0
    end = int(offsets[-1]) if len(offsets) else 0
    return arr.values.slice(start, end - start), np.diff(offsets)


# --------------------------------------------------------------------- scalars


@dataclass
class _Scalar:
    """A column's values ready to write: one of varint / fixed / length-delimited."""

    wire: int
    valid: np.ndarray[Any, Any]
    default: np.ndarray[Any, Any]  # True where the value is the proto3 default
    varints: np.ndarray[Any, Any] | None = None
    fixed: np.ndarray[Any, Any] | None = None
    payload: pa.Array | Rows | None = None  # Rows: a payload laid out, not built


def _ints(arr: pa.Array, dtype: Any) -> np.ndarray[Any, Any]:
    filled = pc.fill_null(arr, 0) if arr.null_count else arr
    return np.asarray(filled.to_numpy(zero_copy_only=False)).astype(dtype, copy=False)


def _uuid_bytes(arr: pa.Array) -> pa.Array:
    if isinstance(arr.type, pa.BaseExtensionType):
        arr = arr.storage
    if pa.types.is_fixed_size_binary(arr.type):
        # the same bytes seen as large_binary through computed offsets: no copy (a cast
        # copied every value)
        width, start = arr.type.byte_width, arr.offset
        offsets = np.arange(start + len(arr) + 1, dtype=np.int64) * width
        validity, data = arr.buffers()
        return pa.Array.from_buffers(pa.large_binary(), len(arr), [validity, pa.py_buffer(offsets), data], offset=start)
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        text = pc.replace_substring(arr, "-", "")
        ok = pc.fill_null(pc.equal(pc.utf8_length(text), 32), True)
        if not pc.all(ok).as_py():
            raise SourceDataError("a uuid column holds a string that is not a UUID")
        hexes = np.frombuffer(pc.fill_null(text, "0" * 32).cast(pa.large_binary()).buffers()[2], dtype=np.uint8)[
            : 32 * len(arr)
        ].reshape(-1, 32)
        lut = np.zeros(256, dtype=np.uint8)
        for i, c in enumerate(b"0123456789abcdef"):
            lut[c] = i
        for i, c in enumerate(b"ABCDEF"):
            lut[c] = 10 + i
        nib = lut[hexes]
        raw = (nib[:, 0::2] << 4) | nib[:, 1::2]
        return fixed_rows(raw, _valid(arr))
    return arr.cast(pa.large_binary())


def _place(column: str) -> str:
    """Where a value sits, for a message: a column, a list's element or a map's value."""
    if column.endswith("[]"):
        return f"an element of column {column.removesuffix('[]')!r}"
    if column.endswith("{}"):
        return f"a value of map column {column.removesuffix('{}')!r}"
    if column.endswith("{key}"):
        return f"a key of map column {column.removesuffix('{key}')!r}"
    return f"column {column!r}"


def _require_text(arr: pa.Array, column: str) -> None:
    """A protobuf string is UTF-8: every consumer's parser (and the DAL's readers) refuses
    a record holding one that is not. Arrow takes Parquet's strings without checking them
    (a writer such as Spark writes any bytes), so they are checked here: bytes that are all
    ASCII are at once (1M two-letter values: 0.03 ms), others by Arrow's check (3.0 ms)."""
    is_text = pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)
    if is_text:
        offsets, data = binary_view(arr)
        covered = data[int(offsets[0]) : int(offsets[-1])]
        if not len(covered) or int(covered.max()) < 0x80:
            return
    try:
        (arr if is_text else arr.cast(pa.large_string())).validate(full=True)
    except pa.ArrowInvalid:
        bad = next((v for v in arr.cast(pa.large_binary()).to_pylist() if v is not None and not _is_utf8(v)), None)
        if bad is None:
            raise
        raise SourceDataError(
            f"{_place(column)} holds text that is not UTF-8 (e.g. {bad[:32]!r}); a protobuf string must be, "
            "and every consumer's parser refuses a record with one (fix those rows in the source, or filter them out)"
        ) from None


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _require_time_of_day(micros: np.ndarray[Any, Any], column: str) -> None:
    """An Iceberg time is a time of day; a value outside one means nothing to a consumer."""
    if len(micros) and (micros.min() < 0 or micros.max() >= DAY_MICROS):
        bad = micros[(micros < 0) | (micros >= DAY_MICROS)]
        raise SourceDataError(
            f"{_place(column)} holds a time outside a day ({int(bad[0]):,} microseconds after midnight); "
            "a time of day is from 00:00 to 23:59:59.999999 (fix those rows in the source)"
        )


def _timestamp_payload(arr: pa.Array, column: str, checked: bool) -> Rows:
    """google.protobuf.Timestamp bytes (seconds = 1, nanos = 2, zeros omitted) per row."""
    unit = arr.type.unit if pa.types.is_timestamp(arr.type) else "us"
    raw = _ints(arr.cast(pa.int64()) if not pa.types.is_integer(arr.type) else arr, np.int64)
    div = _UNIT_DIV[unit]
    seconds = np.floor_divide(raw, div)
    low, high = TIMESTAMP_SECONDS
    if checked and len(seconds) and (seconds.min() < low or seconds.max() > high):
        from bulldozer.schema.decode import timestamp_text

        at = int(np.flatnonzero((seconds < low) | (seconds > high))[0])
        shown = timestamp_text(int(seconds[at]), int(raw[at] - seconds[at] * div) * (1_000_000_000 // div))
        if pa.types.is_timestamp(arr.type) and arr.type.tz is None:
            shown = shown.removesuffix("Z")
        raise SourceDataError(
            f"{_place(column)} holds a timestamp outside the years 1 to 9999 "
            f"({shown}), which google.protobuf.Timestamp cannot hold: "
            "consumers' conversions and protobuf's JSON refuse them (fix those rows in the source, "
            "e.g. write the greatest time meant as 9999-12-31 or as a null)"
        )
    nanos = (raw - seconds * div) * (1_000_000_000 // div)
    sec_rows = VarintRows(seconds.view(np.uint64), seconds != 0, _tag(1, _VARINT))
    nano_rows = VarintRows(nanos.view(np.uint64), nanos != 0, _tag(2, _VARINT))
    return ConcatRows([sec_rows, nano_rows], len(arr))


def _scalar(kind: str, arr: pa.Array, column: str, checked: bool) -> _Scalar:
    """The values of ``arr`` (of ``column``) ready to write; with ``checked``, values its
    proto type cannot carry to a consumer are refused (SourceDataError)."""
    valid = _valid(arr)
    if kind == "bool":
        v = _ints(arr.cast(pa.uint8()), np.uint64)
        return _Scalar(_VARINT, valid, v == 0, varints=v)
    if kind in ("int32", "date"):
        v = _ints(arr.cast(pa.int32()) if kind == "date" else arr, np.int64)
        return _Scalar(_VARINT, valid, v == 0, varints=v.view(np.uint64))
    if kind in ("int64", "time"):
        v = _ints(arr.cast(pa.int64()) if kind == "time" else arr, np.int64)
        if kind == "time" and checked:
            _require_time_of_day(v[valid] if arr.null_count else v, column)
        return _Scalar(_VARINT, valid, v == 0, varints=v.view(np.uint64))
    if kind in ("float", "double"):
        dtype, utype, width = (np.float32, np.uint32, 4) if kind == "float" else (np.float64, np.uint64, 8)
        v = _ints(arr, dtype)
        bits = v.view(utype)
        return _Scalar(
            _FIXED32 if width == 4 else _FIXED64,
            valid,
            bits == 0,
            fixed=v.astype("<" + np.dtype(dtype).str[1:], copy=False).view(np.uint8).reshape(-1, width),
        )
    if kind == "timestamp":
        payload = _timestamp_payload(arr, column, checked)
        return _Scalar(_LEN, valid, np.zeros(len(arr), dtype=bool), payload=payload)
    if kind == "string" and checked:
        _require_text(arr, column)
    # Length-delimited payloads are used as they come (string or binary, 32- or 64-bit
    # offsets): the kernels read them in place, and null rows are never written.
    if kind == "decimal":
        fast = decimal_strings(arr)
        payload = fast if fast is not None else arr.cast(pa.large_string())
    elif kind == "uuid":
        payload = _uuid_bytes(arr)
    elif _is_binary_like(arr.type):
        payload = arr
    else:
        payload = arr.cast(pa.large_binary())
    return _Scalar(_LEN, valid, _lengths(payload) == 0, payload=payload)


def _is_binary_like(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
    )


def _scalar_field_rows(s: _Scalar, keep: np.ndarray[Any, Any], number: int) -> Rows:
    tag = _tag(number, s.wire)
    if s.wire == _VARINT:
        assert s.varints is not None
        return VarintRows(s.varints, keep, tag)
    if s.wire in (_FIXED32, _FIXED64):
        assert s.fixed is not None
        return FixedRows(s.fixed, keep, tag)
    if isinstance(s.payload, Rows):
        return ConcatRows([s.payload], len(keep), keep, tag)
    assert s.payload is not None
    return BytesRows(s.payload, keep, tag)


def _scalar_element_payload(s: _Scalar) -> Rows:
    """Packed encoding of each element (no tag)."""
    if s.wire == _VARINT:
        assert s.varints is not None
        return VarintRows(s.varints, None)
    assert s.fixed is not None
    return FixedRows(s.fixed, None)


# --------------------------------------------------------------------- encoder


class RowEncoder:
    """Encodes record batches into (key, value) bytes for one generated schema.

    ``columns`` maps each top-level proto field's source column to the name it has in the
    batches (identity by default; a query may deliver renamed columns).

    ``threads``: how many threads write a batch's bytes at most (0: one per core). The
    local engine's encoder is the one busy thread of its process and takes every core;
    a Spark task runs beside as many others as its executor has cores, and takes one.

    ``checked``: refuse values the proto type cannot carry to a consumer (text that is not
    UTF-8, a timestamp outside the years 1 to 9999, a time outside a day). Only the rows a
    version already holds are encoded unchecked: a delta's removed files, whose records
    must come out as the base stored them (by a release that did not refuse them, maybe)
    for their digest to subtract, and whose values the delta replaces or deletes.

    ``limits``: the DAL's (``KvClient.describe_store``): a record whose key or value is larger
    than the store takes is refused here, naming its row, as data no retry can load; sent,
    the DAL refused the whole batch with a size and nothing else (past 64 MiB, gRPC did).
    """

    def __init__(
        self, proto: ProtoFile, threads: int = 0, checked: bool = True, limits: StoreInfo | None = None
    ) -> None:
        self.proto = proto
        self.threads = threads
        self.checked = checked
        self.limits = limits

    def encode(self, batch: pa.RecordBatch | pa.Table) -> EncodedBatch:
        keys = self.encode_message(self.proto.key, batch, top_level=True, is_key=True)
        values = self.encode_message(self.proto.value, batch, top_level=True)
        encoded = EncodedBatch(materialize(keys, self.threads), materialize(values, self.threads))
        if self.limits is not None:
            self._within_limits(batch, encoded, self.limits)
        return encoded

    def _within_limits(self, batch: pa.RecordBatch | pa.Table, encoded: EncodedBatch, limits: StoreInfo) -> None:
        """Refuse the first record whose key or value is larger than the store takes."""
        for what, array, limit in (
            ("key", encoded.keys, limits.max_key_bytes),
            ("value", encoded.values, limits.max_value_bytes),
        ):
            if not limit or not len(array):
                continue
            sizes = np.diff(binary_view(array)[0])
            over = np.flatnonzero(sizes > limit)
            if not len(over):
                continue
            row = int(over[0])
            key = {f.column: _column(batch, f.column)[row].as_py() for f in self.proto.key.fields}
            shown = json.dumps(key, default=str, ensure_ascii=False)
            shown = shown if len(shown) <= 200 else f"{shown[:200]}…"
            hint = (
                "key the job on shorter columns (a hash of a long one, say)"
                if what == "key"
                else "leave its largest columns out of value_columns, or trim them in a query"
            )
            raise SourceDataError(
                f"the record of key {shown} has a {what} of {int(sizes[row]):,} bytes (as protobuf), and the "
                f"{limits.engine} store takes {what}s of up to {limit:,} bytes: {hint}"
                + (f" ({len(over)} records of this batch are as large)" if len(over) > 1 else "")
            )

    def encode_keys(self, batch: pa.RecordBatch | pa.Table) -> pa.Array:
        """The keys alone of ``batch``'s rows (it needs the key columns only)."""
        return materialize(self.encode_message(self.proto.key, batch, top_level=True, is_key=True), self.threads)

    # -- messages ---------------------------------------------------------------

    def encode_message(
        self,
        msg: ProtoMessage,
        data: Any,
        top_level: bool = False,
        is_key: bool = False,
        keep: np.ndarray[Any, Any] | None = None,
        prefix: bytes | None = None,
    ) -> Rows:
        """The layout of ``msg``'s bytes per row. ``data`` is a batch (top level) or a StructArray.
        With ``prefix`` (a field's tag), each row kept comes out as that field, length-delimited
        (see ``ConcatRows``)."""
        n = data.num_rows if top_level else len(data)
        if top_level:
            children = {f.name: _column(data, f.column) for f in msg.fields}
        else:
            flat = data.flatten()
            children = {f.name: a for f, a in zip(msg.fields, flat, strict=True)}
        parts = []
        for f in msg.sorted_fields():
            arr = children[f.name]
            if is_key and arr.null_count:
                raise SourceDataError(
                    f"key column {f.column!r} holds {arr.null_count} null value(s); "
                    "keys may not be null (filter them out or fill them in the source)"
                )
            parts.append(self.field_rows(f, arr))
        return ConcatRows(parts, n, keep, prefix)

    # -- fields -----------------------------------------------------------------

    def field_rows(self, f: ProtoField, arr: pa.Array) -> Rows:
        """Every row's full encoding of field ``f`` (tags included; empty when absent)."""
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if f.kind == "map":
            return self._map_rows(f, arr)
        if f.repeated:
            return self._repeated_rows(f, arr)
        valid = _valid(arr)
        if f.kind == "scalar":
            assert f.scalar is not None
            s = _scalar(f.scalar, arr, f.column, self.checked)
            # Timestamps are messages: present whenever not null, like every message field.
            keep = valid if (f.optional or f.scalar == "timestamp") else valid & ~s.default
            return _scalar_field_rows(s, keep, f.number)
        assert f.message is not None
        return self.message_rows(f.message, arr, valid, _tag(f.number, _LEN))

    def message_rows(self, msg: ProtoMessage, arr: pa.Array, keep: np.ndarray[Any, Any] | None, tag: bytes) -> Rows:
        """Message ``msg`` of each value of ``arr`` (struct or wrapped data) as a
        length-delimited field with ``tag``, for the rows kept (the others empty)."""
        if msg.wrapper:
            return ConcatRows([self.field_rows(msg.fields[0], arr)], len(arr), keep, tag)
        return self.encode_message(msg, arr, keep=keep, prefix=tag)

    def _element_rows(self, f: ProtoField, values: pa.Array, number: int) -> Rows:
        """Each element of a non-packed repeated field, encoded as field ``number``."""
        if values.null_count:
            what = "map value" if f.column.endswith("{}") else "list element"
            raise SourceDataError(
                f"column {f.column.removesuffix('{}')!r} holds a null {what}; protobuf "
                "repeated fields and maps cannot hold nulls (filter or fill them in the source)"
            )
        if f.kind == "scalar":
            assert f.scalar is not None
            s = _scalar(f.scalar, values, f.column if f.column.endswith("{}") else f.column + "[]", self.checked)
            return _scalar_field_rows(s, np.ones(len(values), dtype=bool), number)
        assert f.message is not None
        return self.message_rows(f.message, values, None, _tag(number, _LEN))

    def _repeated_rows(self, f: ProtoField, arr: pa.Array) -> Rows:
        values, counts = _list_parts(arr)
        valid = _valid(arr)
        if f.kind == "scalar" and f.scalar in _PACKABLE:
            if values.null_count:
                raise SourceDataError(
                    f"column {f.column!r} holds a null list element; protobuf repeated fields "
                    "cannot hold nulls (filter or fill them in the source)"
                )
            packed = GroupedRows(
                _scalar_element_payload(_scalar(f.scalar, values, f.column + "[]", self.checked)), counts
            )
            return ConcatRows([packed], len(arr), valid & (counts > 0), _tag(f.number, _LEN))
        return GroupedRows(self._element_rows(f, values, f.number), counts, _masked(valid))

    def _map_rows(self, f: ProtoField, arr: pa.Array) -> Rows:
        assert f.value is not None and f.scalar is not None
        pairs, counts = _list_parts(arr)
        keys, items = pairs.flatten()
        key_rows = _scalar_field_rows(
            _scalar(f.scalar, keys, f.column + "{key}", self.checked), np.ones(len(keys), dtype=bool), 1
        )
        value_rows = self._element_rows(f.value, items, 2)
        entries = ConcatRows([key_rows, value_rows], len(keys), prefix=_tag(f.number, _LEN))
        return GroupedRows(entries, counts, _masked(_valid(arr)))


def _masked(valid: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
    """The rows to keep (those not null in the source), or None for all of them."""
    return None if valid.all() else valid


def _column(batch: Any, name: str) -> pa.Array:
    try:
        col = batch.column(name)
    except KeyError:
        raise SourceDataError(f"the batch has no column {name!r}") from None
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return col
