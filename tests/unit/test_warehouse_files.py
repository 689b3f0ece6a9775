"""Which files a table may list as its data: under its location or a root the operator lists."""

from __future__ import annotations

import pytest

from bulldozer.warehouse.files import outside

TABLE = "file:///lake/warehouse/db.db/t"


@pytest.mark.parametrize(
    "path",
    [
        "file:///lake/warehouse/db.db/t/data/00000-0.parquet",
        "file:/lake/warehouse/db.db/t/data/a.parquet",  # Spark's spelling of a local file
        "file://localhost/lake/warehouse/db.db/t/data/a.parquet",
        "/lake/warehouse/db.db/t/data/a.parquet",
        "file:///lake/warehouse/db.db/t/data/../metadata/x.parquet",  # still inside
        "file:///mnt/hive/part-0.parquet",  # an operator's root
    ],
)
def test_files_a_table_may_list(path: str) -> None:
    assert outside(TABLE, [path], ["/mnt/hive/"]) is None


@pytest.mark.parametrize(
    "path",
    [
        "file:///lake/warehouse/db.db/other/data/a.parquet",  # another table's
        "file:///lake/warehouse/db.db/t2/data/a.parquet",  # a name that only starts alike
        "file:///lake/warehouse/db.db/t/../other/data/a.parquet",  # out through ..
        "file:///lake/warehouse/db.db/t/data/../../../../../etc/x.parquet",
        "/etc/passwd",
        "s3://lake/warehouse/db.db/t/data/a.parquet",  # the same path in another store
        "file://otherhost/lake/warehouse/db.db/t/data/a.parquet",
        "file:///mnt/hive2/part-0.parquet",
        "/lake/warehouse/db.db/t#x/data/a.parquet",  # a plain path is opened whole: beside the table
        "/lake/warehouse/db.db/t?x/data/a.parquet",
    ],
)
def test_files_a_table_may_not_list(path: str) -> None:
    assert outside(TABLE, ["file:///lake/warehouse/db.db/t/data/ok.parquet", path], ["/mnt/hive"]) == path


def test_object_stores_compare_by_bucket_and_key() -> None:
    table = "s3://lake/warehouse/db.db/t"
    assert outside(table, ["s3a://lake/warehouse/db.db/t/data/a.parquet"], []) is None
    assert outside(table, ["s3://other/warehouse/db.db/t/data/a.parquet"], []) is not None
    assert outside(table, ["gs://lake/warehouse/db.db/t/data/a.parquet"], []) is not None
    assert outside(table, ["s3://other/x.parquet"], ["*"]) is None  # the operator allows anywhere
