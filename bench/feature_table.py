"""The flat feature table both Bulldozer and Feast load in the side-by-side benchmark.

One Iceberg table ``bench.user_features`` in the embedded catalog (what Bulldozer reads)
and the same rows exported as one Parquet file (what Feast's file offline store reads):
an ``INT64`` entity key ``user_id`` and six features of the types Feast serves (double,
long, string, bool, int, float), plus the ``event_ts`` Feast needs."""

from __future__ import annotations

from pathlib import Path

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


def build(home: Path, rows: int, parquet: Path) -> None:
    """Create (or replace) the Iceberg table under ``home`` and write ``parquet``, same rows."""
    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse.catalog import open_catalog

    data = generate(rows)
    catalog = open_catalog(CatalogConfig(), home)
    catalog.create_namespace_if_not_exists("bench")
    if catalog.table_exists(TABLE):
        catalog.drop_table(TABLE)
    table = catalog.create_table(TABLE, schema=data.schema)
    table.append(data)
    pq.write_table(data, parquet)


def write_spec(path: Path, alias: str = "user_features") -> Path:
    """A job spec moving the table into ``alias``; the endpoint comes from $BULLDOZER_ENDPOINT."""
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
key_value_dal:
  endpoint: ${{BULLDOZER_ENDPOINT:-embedded}}
  alias: {alias}
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
