"""Iceberg schemas and specs the schema/encoder tests share."""

from __future__ import annotations

from typing import Any

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
    TimestampNanoType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from bulldozer.spec import JobSpec


def spec_for(
    keys: list[str],
    values: list[str] | None = None,
    renames: dict[str, str] | None = None,
    name: str = "t",
) -> JobSpec:
    data: dict[str, Any] = {
        "apiVersion": "bulldozer/v1",
        "kind": "MoveDataToKvDal",
        "metadata": {"name": name, "owner": "tests"},
        "data_movement": {
            "source": {"table": "db.t"},
            "key_columns": keys,
            "renames": renames or {},
        },
        "key_value_dal": {"alias": name},
        "bulldozer_protobuf": {"package": f"bulldozer.test.{name}"},
    }
    if values is not None:
        data["data_movement"]["value_columns"] = values
    return JobSpec.model_validate(data)


def F(id_: int, name: str, t: Any, required: bool = False) -> NestedField:
    return NestedField(id_, name, t, required=required)


ALL_TYPES = Schema(
    F(1, "id", LongType(), True),
    F(2, "tenant", StringType(), True),
    F(3, "b", BooleanType()),
    F(4, "i", IntegerType()),
    F(5, "l", LongType(), True),
    F(6, "f", FloatType()),
    F(7, "d", DoubleType(), True),
    F(8, "dec", DecimalType(38, 10)),
    F(9, "day", DateType()),
    F(10, "tod", TimeType()),
    F(11, "ts", TimestampType()),
    F(12, "tstz", TimestamptzType(), True),
    F(13, "ts_ns", TimestampNanoType()),
    F(14, "s", StringType()),
    F(15, "u", UUIDType()),
    F(16, "fx", FixedType(4)),
    F(17, "bin", BinaryType()),
    F(
        18,
        "nested",
        StructType(
            F(30, "inner", StructType(F(31, "x", IntegerType(), True), F(32, "y", StringType()))),
            F(33, "tag", StringType(), True),
        ),
    ),
    F(19, "tags", ListType(34, StringType(), element_required=True), True),
    F(
        20,
        "matrix",
        ListType(35, ListType(36, DoubleType(), element_required=True), element_required=True),
    ),
    F(
        21,
        "by_name",
        MapType(37, StringType(), 38, StructType(F(39, "v", LongType(), True)), value_required=True),
    ),
    F(
        22,
        "map_of_map",
        MapType(
            40,
            StringType(),
            41,
            MapType(42, StringType(), 43, IntegerType(), value_required=True),
            value_required=True,
        ),
    ),
    F(
        23,
        "map_of_list",
        MapType(
            44,
            LongType(),
            45,
            ListType(46, StringType(), element_required=True),
            value_required=True,
        ),
    ),
    F(24, "by_uuid", MapType(47, UUIDType(), 48, StringType(), value_required=True)),
    F(
        25,
        "list_of_map",
        ListType(
            49,
            MapType(50, StringType(), 51, BooleanType(), value_required=True),
            element_required=True,
        ),
    ),
    F(26, "ints", ListType(52, IntegerType(), element_required=True)),
    F(19500, "forbidden_number", StringType()),
)
