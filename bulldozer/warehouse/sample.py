"""A realistic sample table, generated vectorized with numpy and pyarrow.

``sample.user_item_scores`` has a composite key (``user_id`` long, ``item_id`` int,
``locale`` string) and value columns covering every type Bulldozer maps: boolean, float,
double, decimal, date, timestamp, timestamptz, binary, uuid, nullable columns, a struct of
struct, a list of struct, a map of string to struct and a map of string to map.

``variant`` shifts the values (not the keys), so a second load of the same table produces
a visibly different version.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
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
    UUIDType,
)

from bulldozer.spec.models import CatalogConfig
from bulldozer.warehouse.catalog import open_catalog

__all__ = [
    "SAMPLE_NAMESPACE",
    "SAMPLE_SCHEMA",
    "SAMPLE_TABLE",
    "create_sample_warehouse",
    "generate_sample",
]

SAMPLE_NAMESPACE = "sample"
SAMPLE_TABLE = "sample.user_item_scores"
LOCALES = np.array(["en_US", "de_DE", "fr_FR", "ja_JP", "pt_BR"])
CITIES = np.array(["Lisbon", "Berlin", "Paris", "Osaka", "Recife", "Austin", "Zürich"])
TIERS = np.array(["free", "basic", "premium"])
ITEMS_PER_USER = 10

SAMPLE_SCHEMA = Schema(
    NestedField(1, "user_id", LongType(), required=True),
    NestedField(2, "item_id", IntegerType(), required=True),
    NestedField(3, "locale", StringType(), required=True),
    NestedField(4, "is_active", BooleanType(), required=True),
    NestedField(5, "score", FloatType(), required=False),
    NestedField(6, "rating", DoubleType(), required=True),
    NestedField(7, "price", DecimalType(12, 2), required=True),
    NestedField(8, "signup_date", DateType(), required=True),
    NestedField(9, "updated_at", TimestampType(), required=True),
    NestedField(10, "event_time", TimestamptzType(), required=False),
    NestedField(11, "payload", BinaryType(), required=False),
    NestedField(12, "session_id", UUIDType(), required=True),
    NestedField(13, "nickname", StringType(), required=False),
    NestedField(
        14,
        "profile",
        StructType(
            NestedField(
                15,
                "address",
                StructType(
                    NestedField(16, "city", StringType(), required=True),
                    NestedField(17, "zip", StringType(), required=False),
                ),
                required=False,
            ),
            NestedField(18, "tier", StringType(), required=True),
        ),
        required=False,
    ),
    NestedField(
        19,
        "recent_orders",
        ListType(
            20,
            StructType(
                NestedField(21, "order_id", LongType(), required=True),
                NestedField(22, "amount", DecimalType(12, 2), required=True),
                NestedField(23, "ordered_at", TimestamptzType(), required=False),
            ),
            element_required=True,
        ),
        required=False,
    ),
    NestedField(
        24,
        "attributes",
        MapType(
            25,
            StringType(),
            26,
            StructType(
                NestedField(27, "value", StringType(), required=True),
                NestedField(28, "weight", DoubleType(), required=False),
            ),
            value_required=True,
        ),
        required=False,
    ),
    NestedField(
        29,
        "counters",
        MapType(
            30,
            StringType(),
            31,
            MapType(32, StringType(), 33, LongType(), value_required=True),
            value_required=True,
        ),
        required=False,
    ),
    identifier_field_ids=[1, 2, 3],
)


def _mask(n: int, every: int, offset: int = 0) -> np.ndarray[Any, Any]:
    mask: np.ndarray[Any, Any] = ((np.arange(n) + offset) % every) == 0
    return mask


def _offsets(lengths: np.ndarray[Any, Any]) -> pa.Array:
    return pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))


def _decimal(unscaled: np.ndarray[Any, Any], precision: int, scale: int) -> pa.Array:
    """A decimal128 array from unscaled int64 values (two's complement, little endian)."""
    low = unscaled.astype(np.int64)
    words = np.empty((len(low), 2), dtype=np.int64)
    words[:, 0] = low
    words[:, 1] = np.where(low < 0, -1, 0)
    return pa.Array.from_buffers(pa.decimal128(precision, scale), len(low), [None, pa.py_buffer(words.tobytes())])


def generate_sample(rows: int = 100_000, seed: int = 7, variant: int = 0, start: int = 0) -> pa.Table:
    """The sample table's rows ``start .. start+rows`` as Arrow, typed as the Iceberg schema."""
    rng = np.random.default_rng(seed + 1000 * variant + start)
    i = np.arange(start, start + rows, dtype=np.int64)
    n = rows
    user_id = 1_000_000 + i // ITEMS_PER_USER
    item_id = (i % ITEMS_PER_USER).astype(np.int32) * 7 + 1
    locale = LOCALES[(i // ITEMS_PER_USER) % len(LOCALES)]

    base_us = np.int64(1_700_000_000_000_000) + variant * 86_400_000_000
    updated = base_us + i * 1_000_003
    event_null = _mask(n, 13, 5)
    payload_len = (i % 24).astype(np.int64)
    payload_bytes = rng.integers(0, 256, int(payload_len.sum()), dtype=np.uint8)

    # struct of struct
    city = CITIES[(i + variant) % len(CITIES)]
    zip_code = np.char.zfill(((i * 37) % 100_000).astype(str), 5)
    address = pa.StructArray.from_arrays([pa.array(city), pa.array(zip_code, mask=_mask(n, 9))], names=["city", "zip"])
    profile = pa.StructArray.from_arrays(
        [address, pa.array(TIERS[i % len(TIERS)])],
        names=["address", "tier"],
        mask=pa.array(_mask(n, 11, 3)),
    )

    # list of struct: 0..3 orders per row
    order_len = (i % 4).astype(np.int64)
    m = int(order_len.sum())
    j = np.arange(m, dtype=np.int64)
    orders = pa.StructArray.from_arrays(
        [
            pa.array(j + start * 4 + 1),
            _decimal(rng.integers(100, 100_000, m) + variant * 100, 12, 2),
            pa.array(base_us - j * 60_000_000, pa.timestamp("us", tz="UTC")),
        ],
        names=["order_id", "amount", "ordered_at"],
    )
    recent_orders = pa.ListArray.from_arrays(_offsets(order_len), orders, mask=pa.array(_mask(n, 15, 2)))

    # map of string to struct: 0..2 entries
    attr_len = (i % 3).astype(np.int64)
    k = int(attr_len.sum())
    keys = np.array(["color", "size"])[np.arange(k) % 2]
    attr_values = pa.StructArray.from_arrays(
        [
            pa.array(np.char.add("v", (np.arange(k) % 97 + variant).astype(str))),
            pa.array(rng.random(k), mask=_mask(k, 5)),
        ],
        names=["value", "weight"],
    )
    attributes = pa.MapArray.from_arrays(_offsets(attr_len), pa.array(keys), attr_values)

    # map of string to map of string to long: 1 outer entry, 0..2 inner entries
    inner_len = (i % 3).astype(np.int64)
    q = int(inner_len.sum())
    inner = pa.MapArray.from_arrays(
        _offsets(inner_len),
        pa.array(np.array(["views", "clicks"])[np.arange(q) % 2]),
        pa.array(rng.integers(0, 10_000, q) + variant),
    )
    counters = pa.MapArray.from_arrays(_offsets(np.ones(n, dtype=np.int64)), pa.array(np.full(n, "daily")), inner)

    columns: dict[str, pa.Array] = {
        "user_id": pa.array(user_id),
        "item_id": pa.array(item_id),
        "locale": pa.array(locale),
        "is_active": pa.array((i + variant) % 5 != 0),
        "score": pa.array(rng.random(n, dtype=np.float32), mask=_mask(n, 17)),
        "rating": pa.array(np.round(rng.random(n) * 5, 3) + variant),
        "price": _decimal(rng.integers(0, 10_000_000, n) + variant, 12, 2),
        "signup_date": pa.array((18_000 + i % 2_000).astype(np.int32), pa.date32()),
        "updated_at": pa.array(updated, pa.timestamp("us")),
        "event_time": pa.array(updated + 17, pa.timestamp("us", tz="UTC"), mask=event_null),
        "payload": pa.BinaryArray.from_buffers(
            pa.binary(),
            n,
            [
                None,
                pa.py_buffer(_offsets(payload_len).to_numpy().tobytes()),
                pa.py_buffer(payload_bytes.tobytes()),
            ],
        ),
        "session_id": pa.ExtensionArray.from_storage(
            pa.uuid(),
            pa.FixedSizeBinaryArray.from_buffers(
                pa.binary(16),
                n,
                [None, pa.py_buffer(rng.integers(0, 256, 16 * n, dtype=np.uint8).tobytes())],
            ),
        ),
        "nickname": pa.array(np.char.add("user", (user_id % 9973).astype(str)), mask=_mask(n, 5, 1)),
        "profile": profile,
        "recent_orders": recent_orders,
        "attributes": attributes,
        "counters": counters,
    }
    target = SAMPLE_SCHEMA.as_arrow()
    arrays = [columns[f.name].cast(f.type) for f in target]
    return pa.Table.from_arrays(arrays, schema=target)


def create_sample_warehouse(
    home: str | os.PathLike[str] | None = None,
    rows: int = 100_000,
    seed: int = 7,
    variant: int = 0,
    replace: bool = True,
    chunk_rows: int = 1_000_000,
) -> Any:
    """Create (or replace) ``sample.user_item_scores`` in the embedded catalog; return the table.

    Large sizes are written in chunks of ``chunk_rows`` in one transaction-free append each,
    so memory stays bounded.
    """
    catalog = open_catalog(CatalogConfig(), home)
    catalog.create_namespace_if_not_exists(SAMPLE_NAMESPACE)
    if catalog.table_exists(SAMPLE_TABLE):
        if not replace:
            return catalog.load_table(SAMPLE_TABLE)
        catalog.purge_table(SAMPLE_TABLE) if hasattr(catalog, "purge_table") else catalog.drop_table(SAMPLE_TABLE)
    table = catalog.create_table(SAMPLE_TABLE, schema=SAMPLE_SCHEMA)
    written = 0
    while written < rows or rows == 0:
        size = min(chunk_rows, rows - written)
        table.append(_as_table_schema(table, generate_sample(size, seed=seed, variant=variant, start=written)))
        written += size
        if rows == 0:
            break
    return table


def overwrite_sample(table: Any, rows: int, seed: int = 7, variant: int = 1) -> None:
    """Replace the sample table's rows with another variant (a new snapshot)."""
    table.overwrite(_as_table_schema(table, generate_sample(rows, seed=seed, variant=variant)))


def _as_table_schema(table: Any, data: pa.Table) -> pa.Table:
    """Relabel ``data`` with the table's own field ids (pyiceberg assigns fresh ids on create),
    keeping only the columns the table still has and leaving columns added since null."""
    target = table.schema().as_arrow()
    columns = [data.column(f.name) if f.name in data.column_names else pa.nulls(data.num_rows, f.type) for f in target]
    return pa.Table.from_arrays(columns, names=target.names).cast(target)
