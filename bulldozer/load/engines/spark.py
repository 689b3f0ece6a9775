"""``spark``: load with Apache Spark (pyspark 4.1 + Iceberg's Spark runtime).

The driver reads the table at the pinned snapshot through Iceberg's Spark catalog — for
the embedded warehouse a JDBC catalog on the very SQLite file pyiceberg writes (the
catalog names match: ``lake``). Each partition is encoded with the shared encoder inside
``mapInArrow`` and written from the executor through the DAL client; every partition
returns its rows, digest, null counts and key hashes, which the driver adds up. Task
retries are safe: puts are idempotent by key, and a retried task's result replaces the
failed attempt's.

``local[*]`` by default; set ``BULLDOZER_SPARK_MASTER`` (or ``bulldozer run --master``)
to run on a cluster — the executors must reach the catalog, the warehouse files and the
DAL endpoint, and have ``bulldozer`` installed.

Resume with Spark re-sends every row (partitions are not stable across sessions; puts are
idempotent, so the result is the same).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import numpy as np

from bulldozer.codec.digest import Digest
from bulldozer.kv.client import KvClient
from bulldozer.load.engines.base import LoadPlan, LoadResult, Progress, SplitDone, SplitResult
from bulldozer.load.engines.local import LocalEngine
from bulldozer.settings import load_settings, pyspark_python
from bulldozer.warehouse.catalog import bulldozer_home

log = logging.getLogger(__name__)

__all__ = ["ICEBERG_RUNTIME", "SQLITE_JDBC", "SparkEngine", "spark_session"]

ICEBERG_RUNTIME = "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0"
SQLITE_JDBC = "org.xerial:sqlite-jdbc:3.46.1.3"
_SESSION: Any = None
_SESSION_KEY: tuple[object, ...] = ()


def spark_session(
    catalog_name: str = "lake",
    properties: dict[str, str] | None = None,
    home: str | None = None,
    master: str | None = None,
) -> Any:
    """A SparkSession with the Iceberg catalog configured, reused while the catalog is the
    same (a different catalog or home gets a fresh session: Spark catalogs load once)."""
    global _SESSION, _SESSION_KEY
    key = (catalog_name, tuple(sorted((properties or {}).items())), str(bulldozer_home(home)), master)
    if _SESSION is not None:
        if key == _SESSION_KEY:
            return _SESSION
        _SESSION.stop()
        _SESSION = None
    from pyspark.sql import SparkSession

    pyspark_python()
    settings = load_settings()
    master = master or settings.spark_master
    prefix = f"spark.sql.catalog.{catalog_name}"
    builder = (
        SparkSession.builder.appName("bulldozer")
        .master(master)
        .config("spark.jars.packages", f"{ICEBERG_RUNTIME},{SQLITE_JDBC}")
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config(prefix, "org.apache.iceberg.spark.SparkCatalog")
        .config(f"{prefix}.cache-enabled", "false")  # each run must see the latest snapshots
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", settings.spark_driver_host)
        .config("spark.driver.bindAddress", settings.spark_driver_host)
        # the batches of the Python workers land in jemalloc's pool (bulldozer.cli.process)
        .config("spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.driver.memory", settings.spark_driver_memory)
    )
    if properties:
        for prop, value in properties.items():
            builder = builder.config(f"{prefix}.{prop}", value)
    else:
        root = bulldozer_home(home)
        builder = (
            builder.config(f"{prefix}.type", "jdbc")
            .config(f"{prefix}.uri", f"jdbc:sqlite:{root / 'catalog.db'}")
            .config(f"{prefix}.warehouse", (root / "warehouse").as_uri())
        )
    try:
        _SESSION = builder.getOrCreate()
    except Exception as exc:
        # Seen once under a loaded CI machine: the gateway JVM died silently while starting
        # (nothing on stderr) and the same command passed when run again. Start it once more.
        if "JAVA_GATEWAY_EXITED" not in str(exc):
            raise
        log.warning("the Spark gateway JVM exited while starting (%s); starting it once more", exc)
        _SESSION = builder.getOrCreate()
    _SESSION.sparkContext.setLogLevel("WARN")
    _SESSION_KEY = key
    return _SESSION


def _partition_writer(proto: Any, address: str, token: str | None, version: str, write: dict[str, int]) -> Any:
    """The function each partition runs (shipped to the executors)."""

    def run(batches: Any) -> Any:
        import pyarrow as pa
        from pyspark import TaskContext

        from bulldozer.codec.digest import Digest, digest_and_key_hashes
        from bulldozer.kv.client import KvClient
        from bulldozer.load.encoder.encode import RowEncoder

        encoder = RowEncoder(proto)
        digest = Digest()
        nulls: dict[str, int] = {}
        hashes = []
        rows = 0
        with KvClient(address, token=token, timeout=120) as client, client.writer(version, **write) as writer:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                encoded = encoder.encode(batch)
                writer.add_arrays(encoded.keys, encoded.values)
                batch_digest, batch_hashes = digest_and_key_hashes(encoded.keys, encoded.values)
                digest.add(batch_digest)
                hashes.append(batch_hashes)
                rows += batch.num_rows
                for name in batch.schema.names:
                    if batch.column(name).null_count:
                        nulls[name] = nulls.get(name, 0) + batch.column(name).null_count
        context = TaskContext.get()
        blob = np.concatenate(hashes).tobytes() if hashes else b""
        yield pa.RecordBatch.from_pydict(
            {
                "partition": [context.partitionId() if context else 0],
                "rows": [rows],
                "digest": [str(digest.value)],
                "bytes": [digest.bytes],
                "nulls": [json.dumps(nulls)],
                "hashes": [blob],
            },
            schema=pa.schema(
                [
                    ("partition", pa.int64()),
                    ("rows", pa.int64()),
                    ("digest", pa.string()),
                    ("bytes", pa.int64()),
                    ("nulls", pa.string()),
                    ("hashes", pa.binary()),
                ]
            ),
        )

    return run


def worker_error(exc: Exception) -> Exception:
    """The error a failed Spark job stands for: the Bulldozer error an executor raised (bad
    data, a DAL refusal), as the local engine raises it, with its one-line message; else
    ``exc`` itself. Spark hands the executor's error back as a PythonException whose text
    ends with the worker's traceback; its last ``module.Class: message`` line of
    Bulldozer's tree is the error."""
    from bulldozer.errors import BulldozerError, error_class_by_name

    for line in reversed(str(exc).splitlines()):
        match = _TRACEBACK_ERROR.match(line.strip())
        if match is None:
            continue
        cls = error_class_by_name(match.group(1))
        if cls is not None and issubclass(cls, BulldozerError):
            try:
                return cls(match.group(2))
            except TypeError:  # a class with a richer constructor: keep Spark's error
                return exc
    return exc


#: ``bulldozer.errors.SourceDataError: message`` (the module path is optional)
_TRACEBACK_ERROR = re.compile(r"^(?:[\w.]+\.)?([A-Z]\w*Error): (.+)$")


class SparkEngine(LocalEngine):
    name = "spark"
    resumes_splits = False
    runs_sql = False

    def __init__(self, master: str | None = None) -> None:
        #: the cluster to run on (``spark://host:7077``); default ``BULLDOZER_SPARK_MASTER`` or local[*]
        self.master = master

    def load(self, plan: LoadPlan, client: KvClient, on_split: SplitDone, progress: Progress) -> LoadResult:
        spec = plan.spec
        catalog = spec.data_movement.catalog
        spark = spark_session(catalog.name, dict(catalog.properties) or None, plan.home, self.master)
        identifier = f"{catalog.name}.{spec.data_movement.source.table}"
        frame = spark.read.option("versionAsOf", str(plan.snapshot_id)).table(identifier)
        if spec.data_movement.filter:
            frame = frame.where(spec.data_movement.filter)
        frame = frame.select(*plan.columns)
        write = spec.key_value_dal.write
        writer_options = {
            "batch_records": write.batch_size,
            "batch_bytes": write.max_batch_bytes,
            "in_flight": write.in_flight_batches,
        }
        fn = _partition_writer(plan.proto, client.target, spec.key_value_dal.token, plan.version, writer_options)
        schema = "partition long, rows long, digest string, bytes long, nulls string, hashes binary"
        progress(0, 0)
        try:
            results = frame.mapInArrow(fn, schema).collect()
        except Exception as exc:
            raise worker_error(exc) from None
        result = LoadResult()
        done = 0
        for row in results:
            split = SplitResult(
                f"spark-{row['partition']}",
                int(row["rows"]),
                Digest(int(row["rows"]), int(row["digest"]), int(row["bytes"])),
                json.loads(row["nulls"]),
            )
            result.splits[split.split_id] = split
            result.key_hashes.append(np.frombuffer(bytes(row["hashes"]), dtype=np.uint64))
            on_split(split)
            done += split.rows
            progress(done, done)
        return result
