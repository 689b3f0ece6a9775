"""Feast side of the side-by-side benchmark. Runs inside Feast's own virtual environment
(made by bench/feast_env.py), so it imports nothing from Bulldozer.

    python feast_worker.py materialize --repo DIR --parquet FILE --store sqlite|redis [--redis HOST:PORT]
    python feast_worker.py read --repo DIR --store sqlite|redis [--redis HOST:PORT] --keys N --calls N --max-id N

Prints one JSON object on stdout: for ``materialize`` the rows and seconds of
``FeatureStore.materialize`` (registry set-up excluded) and the process's peak RSS; for
``read`` the per-call latencies of ``get_online_features`` for N entity keys.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

FEATURES = ["score", "clicks", "country", "active", "age", "ctr"]


def _store(repo: Path, store: str, redis: str, parquet: str) -> object:
    from feast import Entity, FeatureStore, FeatureView, Field, FileSource
    from feast.types import Bool, Float32, Float64, Int32, Int64, String
    from feast.value_type import ValueType

    repo.mkdir(parents=True, exist_ok=True)
    online = (
        f"  type: sqlite\n  path: {repo / 'online.db'}\n"
        if store == "sqlite"
        else f"  type: redis\n  connection_string: {redis}\n"
    )
    (repo / "feature_store.yaml").write_text(
        "project: bench\n"
        f"registry: {repo / 'registry.db'}\n"
        "provider: local\n"
        f"online_store:\n{online}"
        "offline_store:\n  type: file\n"
        "entity_key_serialization_version: 3\n"
    )
    fs = FeatureStore(repo_path=str(repo))
    user = Entity(name="user", join_keys=["user_id"], value_type=ValueType.INT64)
    source = FileSource(path=parquet, timestamp_field="event_ts")
    view = FeatureView(
        name="user_features",
        entities=[user],
        ttl=timedelta(days=3650),
        schema=[
            Field(name="user_id", dtype=Int64),
            Field(name="score", dtype=Float64),
            Field(name="clicks", dtype=Int64),
            Field(name="country", dtype=String),
            Field(name="active", dtype=Bool),
            Field(name="age", dtype=Int32),
            Field(name="ctr", dtype=Float32),
        ],
        online=True,
        source=source,
    )
    fs.apply([user, view])
    return fs


def _peak_rss_kib() -> int:
    """VmHWM of this process (``ru_maxrss`` would include the RSS of the process that started it)."""
    from measured_cli import vm_hwm_kib  # beside this script; it imports nothing from Bulldozer

    return vm_hwm_kib("self")


def materialize(args: argparse.Namespace) -> dict[str, object]:
    import pyarrow.parquet as pq

    rows = pq.ParquetFile(args.parquet).metadata.num_rows
    fs = _store(Path(args.repo), args.store, args.redis, args.parquet)
    rss_before = _peak_rss_kib()
    started = time.perf_counter()
    fs.materialize(  # type: ignore[attr-defined]
        start_date=datetime(2000, 1, 1, tzinfo=UTC), end_date=datetime.now(UTC) + timedelta(days=1)
    )
    seconds = time.perf_counter() - started
    return {"rows": rows, "seconds": seconds, "peak_rss_kib": _peak_rss_kib(), "rss_before_kib": rss_before}


def read(args: argparse.Namespace) -> dict[str, object]:
    fs = _store(Path(args.repo), args.store, args.redis, args.parquet)
    rng = random.Random(7)
    refs = [f"user_features:{f}" for f in FEATURES]
    latencies = []
    found = 0
    for i in range(args.calls + args.warmup):
        rows = [{"user_id": rng.randrange(args.max_id)} for _ in range(args.keys)]
        started = time.perf_counter()
        out = fs.get_online_features(features=refs, entity_rows=rows).to_dict()  # type: ignore[attr-defined]
        elapsed = time.perf_counter() - started
        if i >= args.warmup:
            latencies.append(elapsed)
            found += sum(1 for v in out["score"] if v is not None)
    return {"latencies": latencies, "keys": args.keys, "found": found}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["materialize", "read"])
    parser.add_argument("--repo", required=True)
    parser.add_argument("--parquet", required=True)
    parser.add_argument("--store", choices=["sqlite", "redis"], required=True)
    parser.add_argument("--redis", default="127.0.0.1:6379")
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--max-id", type=int, default=1)
    args = parser.parse_args()
    result = materialize(args) if args.mode == "materialize" else read(args)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
