"""The flat feature table both Bulldozer and Feast load in the side-by-side benchmark.

One Iceberg table ``bench.user_features`` in the embedded catalog (what Bulldozer reads)
and the same rows exported as one Parquet file (what Feast's file offline store reads):
an ``INT64`` entity key ``user_id`` and six features of the types Feast serves (double,
long, string, bool, int, float), plus the ``event_ts`` Feast needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

TABLE = "bench.user_features"
FEATURES = ["score", "clicks", "country", "active", "age", "ctr"]


def generate(rows: int, seed: int = 11) -> pa.Table:
    rng = np.random.default_rng(seed)
    countries = np.array(["us", "de", "fr", "jp", "br", "in", "gb", "ca"])
    return pa.table(
        {
            "user_id": pa.array(np.arange(rows, dtype=np.int64)),
            "score": pa.array(rng.random(rows)),
            "clicks": pa.array(rng.integers(0, 100_000, rows, dtype=np.int64)),
            "country": pa.array(countries[rng.integers(0, len(countries), rows)]),
            "active": pa.array(rng.random(rows) < 0.5),
            "age": pa.array(rng.integers(18, 90, rows, dtype=np.int32)),
            "ctr": pa.array(rng.random(rows).astype(np.float32)),
            "event_ts": pa.array(
                np.full(rows, np.datetime64("2026-11-01T00:00:00", "us")), pa.timestamp("us", tz="UTC")
            ),
        }
    )


def _new_table(home: Path, schema: pa.Schema) -> Any:
    """The Iceberg table under ``home``, created empty (replacing any earlier one)."""
    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse.catalog import open_catalog

    catalog = open_catalog(CatalogConfig(), home)
    catalog.create_namespace_if_not_exists("bench")
    if catalog.table_exists(TABLE):
        catalog.drop_table(TABLE)
    return catalog.create_table(TABLE, schema=schema)


def build(home: Path, rows: int, parquet: Path) -> None:
    """Create (or replace) the Iceberg table under ``home`` and write ``parquet``, same rows."""
    data = generate(rows)
    _new_table(home, data.schema).append(data)
    pq.write_table(data, parquet)


def build_files(home: Path, rows: int, files: int, data: pa.Table | None = None) -> None:
    """Create (or replace) the Iceberg table under ``home`` as ``files`` data files of
    consecutive ``user_id`` ranges (one append each), as a table written day by day is
    (``data``: these rows, else ``generate``'s)."""
    data = generate(rows) if data is None else data
    table = _new_table(home, data.schema)
    per = -(-data.num_rows // files)
    for start in range(0, data.num_rows, per):
        table.append(data.slice(start, per))


def upsert(home: Path, rows: int, fraction: float, seed: int) -> tuple[pa.Table, dict[str, int]]:
    """One commit as Flink's upserts write one, through Iceberg's Java API in a Spark
    session (pyiceberg writes no equality delete): an equality delete file by ``user_id`` of
    ``fraction`` of the keys, and a data file of new values for half of them. The table's
    rows after it (as a table built by ``build_files`` from ``generate(rows)``), and the
    keys deleted and upserted."""
    from urllib.parse import urlsplit

    from bulldozer.load.engines.spark.session import spark_session, stop_spark_session
    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse.catalog import open_catalog

    rng = np.random.default_rng(seed)
    deleted = np.sort(rng.choice(rows, max(2, int(rows * fraction)), replace=False))
    schema = open_catalog(CatalogConfig(), home).load_table(TABLE).schema().as_arrow()
    new = generate(rows, seed=seed).take(pa.array(deleted[: len(deleted) // 2])).cast(schema)
    key = schema.field("user_id")
    spark = spark_session("lake", None, str(home), "local[2]")
    try:
        iceberg = spark._jvm.org.apache.iceberg
        java = iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, f"lake.{TABLE}")
        folder = Path(urlsplit(java.location()).path) / "data"
        keys, values = folder / f"upsert-{seed}-deletes.parquet", folder / f"upsert-{seed}-rows.parquet"
        pq.write_table(pa.table({"user_id": deleted}, schema=pa.schema([key])), keys)
        pq.write_table(new, values)
        ids = spark.sparkContext._gateway.new_array(spark._jvm.int, 1)
        ids[0] = int(key.metadata[b"PARQUET:field_id"])
        deletes = (
            iceberg.FileMetadata.deleteFileBuilder(java.spec())
            .ofEqualityDeletes(ids)
            .withPath(keys.as_uri())
            .withFormat("parquet")
            .withFileSizeInBytes(keys.stat().st_size)
            .withRecordCount(len(deleted))
            .build()
        )
        written = (
            iceberg.DataFiles.builder(java.spec())
            .withPath(values.as_uri())
            .withFormat("parquet")
            .withFileSizeInBytes(values.stat().st_size)
            .withRecordCount(new.num_rows)
            .build()
        )
        java.newRowDelta().addRows(written).addDeletes(deletes).commit()
    finally:
        stop_spark_session()
    kept = generate(rows).filter(pa.array(~np.isin(np.arange(rows), deleted)))
    after = pa.concat_tables([kept, new.cast(kept.schema)]).sort_by("user_id")
    return after, {"deleted": len(deleted) - new.num_rows, "upserted": new.num_rows}


def change_one_file(home: Path, rows: int, files: int, which: int, seed: int) -> dict[str, int]:
    """One snapshot changing about ``1 / files`` of the rows, the way a day's corrections do:
    the ``which``-th file's rows rewritten with 40 % of them updated and 30 % deleted, and 30 %
    of a file's worth of new keys appended. Returns the rows updated, deleted and appended."""
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse.catalog import open_catalog

    table = open_catalog(CatalogConfig(), home).load_table(TABLE)
    per = -(-rows // files)
    lo, hi = which * per, min(rows, (which + 1) * per)
    in_file = And(GreaterThanOrEqual("user_id", lo), LessThan("user_id", hi))
    part = table.scan(row_filter=in_file).to_arrow().sort_by("user_id")
    rng = np.random.default_rng(seed)
    draw = rng.random(part.num_rows)
    kept, updated = draw >= 0.3, (draw >= 0.3) & (draw < 0.7)  # 30 % deleted, 40 % updated, 30 % as they were
    score = np.where(updated, part.column("score").to_numpy() + 1.0, part.column("score").to_numpy())
    part = part.set_column(part.schema.get_field_index("score"), "score", pa.array(score)).filter(pa.array(kept))
    fresh = generate(int(0.3 * per), seed=seed)
    start = int(table.scan(selected_fields=("user_id",)).to_arrow().column("user_id").to_numpy().max()) + 1
    fresh = fresh.set_column(0, "user_id", pa.array(np.arange(start, start + fresh.num_rows, dtype=np.int64)))
    with table.transaction() as tx:
        tx.overwrite(part.cast(table.schema().as_arrow()), overwrite_filter=in_file)
        tx.append(fresh.cast(table.schema().as_arrow()))
    return {
        "updated": int(updated.sum()),
        "deleted": int((~kept).sum()),
        "appended": fresh.num_rows,
    }


def write_spec(path: Path, alias: str = "user_features", mode: str = "full", partitions: int | None = None) -> Path:
    """A job spec moving the table into ``alias``; it names no endpoint: a run uses the
    operator's (``BULLDOZER_ENDPOINT``, else the embedded store). ``partitions``: the Spark
    engine's write tasks."""
    write = f"\n  write:\n    partitions: {partitions}" if partitions else ""
    path.write_text(
        f"""apiVersion: bulldozer/v1
kind: MoveDataToKvDal
metadata:
  name: {alias}
  owner: bench@example.com
data_movement:
  catalog:
    name: lake
  source:
    table: {TABLE}
  key_columns: [user_id]
  value_columns: [{", ".join(FEATURES)}]
  mode: {mode}
key_value_dal:
  alias: {alias}{write}
  retention:
    keep_versions: 1
    grace_period: 0s
bulldozer_protobuf:
  package: bench.{alias}
  key_message: KeyMessage
  value_message: ValueMessage
"""
    )
    return path
