"""End-to-end load benchmark, in one run on one table:

* the local engine end to end (Iceberg table → encode → DAL over gRPC → embedded engine,
  verified, alias flipped), rows/s and peak RSS of the runner and of the DAL process;
* the embedded engine's raw write rate for the same pre-encoded records (bulk puts into
  the store, no DAL), and the ratio;
* the Spark engine's rows/s when it is installed (``bulldozer[spark]``), else "n/a".

    .venv/bin/python bench/load.py [--rows 2000000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "templates" / "move_data_to_kv_dal.yaml"


def _run_cli(args: list[str], home: Path) -> tuple[dict[str, object], float, tuple[int, int]]:
    """Run a bulldozer command; (its JSON output, seconds, (peak RSS of the runner, of its
    largest child — the DAL process, or Spark's JVM) in KiB)."""
    started = time.perf_counter()
    code = (
        "import resource, sys, runpy; sys.argv = ['bulldozer'] + sys.argv[1:];"
        "\ntry:\n    runpy.run_module('bulldozer.cli.main', run_name='__main__')"
        "\nfinally:\n    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
        " kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss;"
        " sys.stderr.write(f'\\nRSS {me} {kids}\\n')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "BULLDOZER_HOME": str(home)},
        cwd=REPO,
    )
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"bulldozer {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    rss_line = [line for line in proc.stderr.splitlines() if line.startswith("RSS ")][-1]
    _, me, kids = rss_line.split()
    return json.loads(proc.stdout), seconds, (int(me), int(kids))


def raw_engine_rate(home: Path, rows: int) -> float:
    """Write the same records (pre-encoded from the same table) straight into a fresh store."""
    from bulldozer.kv import create_engine
    from bulldozer.kv.backends.base import NamespaceRecord
    from bulldozer.load.encode import RowEncoder
    from bulldozer.schema.job import build_job_schema
    from bulldozer.spec import load_spec
    from bulldozer.spec.models import CatalogConfig
    from bulldozer.warehouse.catalog import open_catalog

    spec = load_spec(SPEC, env={}).spec
    table = open_catalog(CatalogConfig(), home).load_table("sample.user_item_scores")
    job = build_job_schema(spec, table.schema(), python=False)
    encoder = RowEncoder(job.proto)
    batches = []
    for batch in table.scan(
        selected_fields=tuple(f.column for f in [*job.proto.key.fields, *job.proto.value.fields])
    ).to_arrow_batch_reader():
        enc = encoder.encode(batch)
        keys, values = enc.keys.to_pylist(), enc.values.to_pylist()
        batches += [list(zip(keys[i : i + 2000], values[i : i + 2000], strict=True)) for i in range(0, len(keys), 2000)]
    engine = create_engine({"type": "embedded", "path": tempfile.mkdtemp(prefix="raw-"), "map_size": 64 * 1024**3})
    engine.create_namespace(NamespaceRecord(name="raw__v20000101000000_000000", alias="raw"))
    started = time.perf_counter()
    for b in batches:
        engine.put("raw__v20000101000000_000000", b)
    engine.env.sync(True)  # type: ignore[attr-defined]
    return rows / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark engine")
    args = parser.parse_args()
    rows = 20_000 if args.quick else args.rows
    home = Path(tempfile.mkdtemp(prefix="bulldozer-bench-load-"))

    from bulldozer.warehouse.sample import create_sample_warehouse

    print(f"building the sample table ({rows:,} rows) ...", flush=True)
    create_sample_warehouse(home, rows=rows)
    print("local engine end to end ...", flush=True)
    record, seconds, rss = _run_cli(["run", str(SPEC), "--json", "-q"], home)
    local_rate = rows / seconds
    load_rate = rows / record["timings"]["load"]  # type: ignore[index]
    print("raw engine writes ...", flush=True)
    raw = raw_engine_rate(home, rows)
    try:
        if args.no_spark:
            raise ImportError("skipped with --no-spark")
        import pyspark  # noqa: F401

        print("spark engine end to end ...", flush=True)
        spark_record, spark_seconds, spark_rss = _run_cli(["run", str(SPEC), "--engine", "spark", "--json", "-q"], home)
        spark = (
            f"{rows / spark_seconds:,.0f} end to end incl. Spark start-up; "
            f"{rows / spark_record['timings']['load']:,.0f} load stage; "  # type: ignore[index]
            f"peak RSS driver {spark_rss[0] / 1024:,.0f} MiB, largest child {spark_rss[1] / 1024:,.0f} MiB"
        )
    except ImportError as exc:
        spark = f"n/a ({exc})"

    print(f"\nLoad, sample table ({rows:,} rows, nested), one run\n")
    print("| measure | value |")
    print("|---|---:|")
    print(f"| local engine end to end (command start → alias flipped), rows/s | {local_rate:,.0f} |")
    print(f"| local engine load stage only, rows/s | {load_rate:,.0f} |")
    print(f"| embedded engine raw write of the same encoded records, rows/s | {raw:,.0f} |")
    print(f"| end to end / raw | {local_rate / raw:.2f} (target ≥ 0.5) |")
    print(f"| stage timings, s | {json.dumps(record['timings'])} |")
    print(f"| peak RSS of the runner (local engine), MiB | {rss[0] / 1024:,.0f} |")
    print(f"| peak RSS of the DAL process (LMDB's mapped pages count here), MiB | {rss[1] / 1024:,.0f} |")
    print(f"| Spark engine rows/s | {spark} |")


if __name__ == "__main__":
    main()
