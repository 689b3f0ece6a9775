"""Encoder throughput: rows/s on one core for the nested sample table and a flat table
(5 scalar columns), next to merely iterating the same Arrow batches in Python, and next to
building one protobuf message per row with the generated classes — all in one run; and
the encoder as the local engine runs it, its bytes written on every core.

    .venv/bin/python -m bench.encode [--rows 200000] [--repeat 5] [--quick]

Prints a markdown table of medians. Single process, so each rate is per core.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import BooleanType, DoubleType, IntegerType, LongType, NestedField, StringType

from bulldozer.load.encoder.encode import RowEncoder
from bulldozer.schema.job import build_job_schema
from bulldozer.spec import JobSpec
from bulldozer.warehouse.sample import SAMPLE_SCHEMA, generate_sample

FLAT = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "a", IntegerType()),
    NestedField(3, "b", DoubleType()),
    NestedField(4, "c", StringType()),
    NestedField(5, "d", BooleanType()),
)


def _spec(keys: list[str]) -> JobSpec:
    return JobSpec.model_validate(
        {
            "apiVersion": "bulldozer/v1",
            "kind": "MoveDataToKvDal",
            "metadata": {"name": "bench", "owner": "bench"},
            "data_movement": {"source": {"table": "a.b"}, "key_columns": keys},
            "key_value_dal": {"alias": "bench"},
            "bulldozer_protobuf": {"package": "bench"},
        }
    )


def flat_table(n: int) -> pa.Table:
    i = np.arange(n)
    return pa.Table.from_arrays(
        [
            pa.array(i),
            pa.array((i * 7 % 1000).astype(np.int32)),
            pa.array(np.random.default_rng(1).random(n)),
            pa.array(np.char.add("s", (i % 5000).astype(str))),
            pa.array(i % 2 == 0),
        ],
        schema=FLAT.as_arrow(),
    )


def _median_rate(n: int, repeat: int, fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return n / statistics.median(times)


def _iterate(table: pa.Table) -> None:
    for batch in table.to_batches(max_chunksize=65_536):
        for _row in zip(*(c.to_pylist() for c in batch.columns), strict=True):
            pass


def _per_row(table: pa.Table, job: Any) -> None:
    key_cls, value_cls = job.classes
    keys = [f for f in job.proto.key.fields]
    values = [f for f in job.proto.value.fields]
    for batch in table.to_batches(max_chunksize=65_536):
        for row in batch.to_pylist():
            key_cls(**{f.name: row[f.column] for f in keys}).SerializeToString()
            value_cls(**{f.name: row[f.column] for f in values if row[f.column] is not None}).SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the benchmark runs")
    args = parser.parse_args()
    rows, repeat = (2_000, 1) if args.quick else (args.rows, args.repeat)

    flat = flat_table(rows)
    flat_job = build_job_schema(_spec(["id"]), FLAT)
    sample = generate_sample(rows)
    sample_job = build_job_schema(_spec(["user_id", "item_id", "locale"]), SAMPLE_SCHEMA)

    results = []
    for name, table, job in (
        ("flat (5 scalar columns)", flat, flat_job),
        ("sample (nested)", sample, sample_job),
    ):
        encoder, every_core = RowEncoder(job.proto, threads=1), RowEncoder(job.proto)
        batches = table.to_batches(max_chunksize=65_536)
        encode = _median_rate(rows, repeat, lambda e=encoder, b=batches: [e.encode(x) for x in b])
        cores = _median_rate(rows, repeat, lambda e=every_core, b=batches: [e.encode(x) for x in b])
        iterate = _median_rate(rows, repeat, lambda t=table: _iterate(t))
        per_row = (
            _median_rate(rows, max(1, repeat // 2), lambda t=table, j=job: _per_row(t, j))
            if name.startswith("flat")
            else float("nan")
        )
        results.append((name, encode, iterate, per_row, cores))

    print(f"\nEncoder, {rows:,} rows, median of {repeat}, one core (the last column: every core)\n")
    print(
        "| table | columnar encode rows/s | iterate Arrow rows in Python rows/s | message per row rows/s "
        "| encode / iterate | encode, bytes written on every core, rows/s |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, encode, iterate, per_row, cores in results:
        per_row_text = f"{per_row:,.0f}" if per_row == per_row else "n/a"
        print(f"| {name} | {encode:,.0f} | {iterate:,.0f} | {per_row_text} | {encode / iterate:.2f}× | {cores:,.0f} |")
    print("\nTarget: ≥ 300,000 flat rows/s per core.")


if __name__ == "__main__":
    main()
