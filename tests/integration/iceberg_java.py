"""Commits pyiceberg does not write, made with Iceberg's Java API in a Spark session: equality
delete files (as Flink's upserts and other change-data writers write them) and the data files
committed beside them in one row delta."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq


class JavaTable:
    """An Iceberg table of the Spark session's catalog, through Iceberg's Java API. Files are
    written as Parquet with the Arrow schema's field ids (``PARQUET:field_id``: a pyiceberg
    schema's ``as_arrow()`` has them) into the table's data folder, and committed with their
    metrics, as Flink's writers commit theirs (a reader prunes deletes by their bounds)."""

    def __init__(self, spark: Any, name: str) -> None:
        self.spark = spark
        self.iceberg = spark._jvm.org.apache.iceberg
        self.java = self.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, name)
        self.folder = Path(urlsplit(self.java.location()).path) / "data"

    def spec(self, spec_id: int | None = None) -> Any:
        return self.java.spec() if spec_id is None else self.java.specs().get(spec_id)

    def _written(self, name: str, rows: pa.Table) -> tuple[Path, Any]:
        """The Parquet file of ``rows`` and its metrics as Iceberg's writers record them
        (value and null counts, lower and upper bounds by field id)."""
        path = self.folder / f"{name}.parquet"
        pq.write_table(rows, path)
        source = self.java.io().newInputFile(path.as_uri())
        return path, self.iceberg.parquet.ParquetUtil.fileMetrics(source, self.iceberg.MetricsConfig.getDefault())

    def equality_deletes(self, name: str, rows: pa.Table, spec: Any = None, partition: str | None = None) -> Any:
        """An equality delete file deleting by ``rows``' columns (their field ids) the rows
        equal to one of ``rows``, of ``spec`` (the table's current one by default) and, for a
        partitioned spec, ``partition`` (e.g. ``region=eu``)."""
        path, metrics = self._written(name, rows)
        ids = self.spark.sparkContext._gateway.new_array(self.spark._jvm.int, rows.num_columns)
        for i, field in enumerate(rows.schema):
            ids[i] = int(field.metadata[b"PARQUET:field_id"])
        builder = (
            self.iceberg.FileMetadata.deleteFileBuilder(spec if spec is not None else self.spec())
            .ofEqualityDeletes(ids)
            .withPath(path.as_uri())
            .withFormat("parquet")
            .withFileSizeInBytes(path.stat().st_size)
            .withMetrics(metrics)
        )
        return (builder.withPartitionPath(partition) if partition else builder).build()

    def data_file(self, name: str, rows: pa.Table, spec: Any = None, partition: str | None = None) -> Any:
        """A data file of ``rows``, as ``equality_deletes`` says."""
        path, metrics = self._written(name, rows)
        builder = (
            self.iceberg.DataFiles.builder(spec if spec is not None else self.spec())
            .withPath(path.as_uri())
            .withFormat("parquet")
            .withFileSizeInBytes(path.stat().st_size)
            .withMetrics(metrics)
        )
        return (builder.withPartitionPath(partition) if partition else builder).build()

    def commit(self, rows: Iterable[Any] = (), deletes: Iterable[Any] = ()) -> None:
        """One snapshot adding the data files ``rows`` and the delete files ``deletes``
        (the data files' rows are kept by the deletes of the same commit)."""
        delta = self.java.newRowDelta()
        for file in rows:
            delta = delta.addRows(file)
        for file in deletes:
            delta = delta.addDeletes(file)
        delta.commit()
