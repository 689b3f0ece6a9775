"""The Spark engine's read by key keeps exactly the rows pyiceberg's own scan keeps, for a
spec filter over every column type, nulls and NaNs included: the filter is built as Spark
Columns from pyiceberg's bound expression (bulldozer.load.engines.spark.row_filter), never
handed to Spark SQL as text."""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bulldozer.spec.models import CatalogConfig
from bulldozer.warehouse.catalog import open_catalog

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROWS = 60
FILTERS = [
    "i < 20",
    "i >= 20 and i != 33",
    "not (i > 10)",
    "i in (1, 2, 3, 40)",
    "i not in (1, 2, 3, 40)",
    "l = 7 or l is null",
    "f > 1.5",
    "f <= 1.5",
    "f is nan",
    "f is not nan",
    "not (f is nan)",
    "d > 0.25",
    "d < 2.5 and d != 1.0",
    "d in (0.5, 1.0)",
    "d not in (0.5, 1.0)",
    "s = 'name-3'",
    "s like 'name-1%'",
    "s not like 'name-1%'",
    "s in ('name-1', 'name-5')",
    "s not in ('name-1', 'name-5')",
    "s is null",
    "s > 'name-4'",
    "dt >= '2024-03-15'",
    "dt = '2024-03-10'",
    "ts < '2024-01-01T00:00:30'",
    "ts >= '2024-01-01T00:00:10.000001'",
    "tstz > '2024-01-01T00:00:20+00:00'",
    "tstz <= '2024-01-01T01:00:20+01:00'",
    "dec > 2.50",
    "dec = 1.25",
    "b = true",
    "b = false",
    "not (b = true)",
    "st.x < 10",
    "st.y like 'y-2%'",
    "st.x is null",
    "i is null",
    "i is not null and f is not nan and not (s is null)",
    "true",
    "false",
]


def _table(home: Path) -> Any:
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
        LongType,
        NestedField,
        StringType,
        StructType,
        TimestampType,
        TimestamptzType,
        UUIDType,
    )

    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "i", IntegerType()),
        NestedField(3, "l", LongType()),
        NestedField(4, "f", FloatType()),
        NestedField(5, "d", DoubleType()),
        NestedField(6, "s", StringType()),
        NestedField(7, "dt", DateType()),
        NestedField(8, "ts", TimestampType()),
        NestedField(9, "tstz", TimestamptzType()),
        NestedField(10, "dec", DecimalType(10, 2)),
        NestedField(11, "b", BooleanType()),
        NestedField(12, "bin", BinaryType()),
        NestedField(13, "u", UUIDType()),
        NestedField(14, "st", StructType(NestedField(15, "x", LongType()), NestedField(16, "y", StringType()))),
    )

    def maybe(n: int, value: Any) -> Any:
        return None if n % 7 == 3 else value

    start = datetime.datetime(2024, 1, 1)
    rows = range(ROWS)
    data = {
        "id": list(rows),
        "i": [maybe(n, n) for n in rows],
        "l": [maybe(n + 1, n % 9) for n in rows],
        "f": [float("nan") if n % 11 == 5 else maybe(n + 2, n * 0.1) for n in rows],
        "d": [float("nan") if n % 13 == 4 else maybe(n + 3, n * 0.05) for n in rows],
        "s": [maybe(n + 4, f"name-{n}") for n in rows],
        "dt": [maybe(n + 5, datetime.date(2024, 3, 1) + datetime.timedelta(days=n)) for n in rows],
        "ts": [maybe(n + 6, start + datetime.timedelta(seconds=n, microseconds=n % 2)) for n in rows],
        "tstz": [maybe(n, (start + datetime.timedelta(seconds=n)).replace(tzinfo=datetime.UTC)) for n in rows],
        "dec": [maybe(n + 1, decimal.Decimal(n) / 4) for n in rows],
        "b": [maybe(n + 2, n % 3 == 0) for n in rows],
        "bin": [maybe(n + 3, bytes([n])) for n in rows],
        "u": [maybe(n + 4, uuid.UUID(int=n).bytes) for n in rows],
        "st": [maybe(n + 5, {"x": maybe(n + 6, n), "y": f"y-{n}"}) for n in rows],
    }
    catalog = open_catalog(CatalogConfig(), home)
    catalog.create_namespace("typed")
    table = catalog.create_table("typed.values", schema)
    arrow = schema.as_arrow()
    table.append(pa.Table.from_pydict(data, schema=arrow))
    return table


@pytest.fixture(scope="module")
def typed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    from bulldozer.load.engines.spark import spark_session, stop_spark_session

    home = tmp_path_factory.mktemp("typed")
    table = _table(home)
    spark = spark_session("lake", None, str(home), "local[2]")
    yield table, spark
    stop_spark_session()


@pytest.mark.parametrize("text", FILTERS)
def test_spark_keeps_the_rows_pyicebergs_scan_keeps(typed: tuple[Any, Any], text: str) -> None:
    from bulldozer.load.engines.spark.row_filter import spark_row_filter

    table, spark = typed
    scan = table.scan(row_filter=text)
    expected = sorted(scan.to_arrow()["id"].to_pylist())
    frame = spark.read.table("lake.typed.values")
    kept = sorted(row.id for row in frame.where(spark_row_filter(scan, frame.schema)).select("id").collect())
    assert kept == expected
    if text not in ("true", "false"):
        assert 0 < len(expected) < ROWS, "a filter that keeps all rows or none tells nothing"
