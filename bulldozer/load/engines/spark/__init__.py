"""``spark``: load with Apache Spark (pyspark 4.1 + Iceberg's Spark runtime).

The driver reads the table at the pinned snapshot through Iceberg's Spark catalog
(``session``), spreads the rows over ``key_value_dal.write.partitions`` write tasks by a
hash of the key columns (default: one task per 64 MiB of data files, at least one per
core), and writes them through the ``bulldozer`` data source (``datasource``), the one
Spark write path: each task encodes with the shared encoder, writes through the DAL
client and reports its rows, digest and null counts; the commit hands them to the
runner, which verifies and flips as for every engine. Rows sharing a key meet in one task
(the partitioning is by key), which names them.

``local[*]`` by default; set ``BULLDOZER_SPARK_MASTER`` (or ``bulldozer run --master``)
to run on a cluster — the executors must reach the catalog's files and the DAL endpoint,
and run Python with Bulldozer installed: ``bulldozer spark package`` builds that
environment as an archive, and ``BULLDOZER_SPARK_ARCHIVE`` ships it with every job
(``package``).

Resume with Spark re-sends every row (partitions are not stable across sessions; puts are
idempotent, so the result is the same).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from types import TracebackType
from typing import Any

from bulldozer.errors import LoadError
from bulldozer.kv.client import KvClient
from bulldozer.load.engines.base import LoadPlan, LoadResult, Progress, SplitDone, SplitResult
from bulldozer.load.engines.local import LocalEngine
from bulldozer.load.engines.spark.datasource import FORMAT, Layout, register, worker_error
from bulldozer.load.engines.spark.session import ICEBERG_RUNTIME, SQLITE_JDBC, spark_session, stop_spark_session

log = logging.getLogger(__name__)

__all__ = ["ICEBERG_RUNTIME", "SQLITE_JDBC", "SparkEngine", "spark_session", "stop_spark_session", "worker_error"]

#: data-file bytes per write task when the spec does not set ``write.partitions``
BYTES_PER_PARTITION = 64 * 1024 * 1024


def write_partitions(plan: LoadPlan, parallelism: int) -> int:
    """How many write tasks: the spec's ``write.partitions``, else one per 64 MiB of the
    snapshot's data files, at least one per core Spark has."""
    chosen = plan.spec.key_value_dal.write.partitions
    if chosen is not None:
        return chosen
    size = 0
    snapshot = plan.table.snapshot_by_id(plan.snapshot_id) if plan.table is not None else None
    if snapshot is not None and snapshot.summary is not None:
        size = int(snapshot.summary.get("total-files-size", "0") or 0)
    return max(parallelism, math.ceil(size / BYTES_PER_PARTITION), 1)


class SparkEngine(LocalEngine):
    name = "spark"
    resumes_splits = False
    runs_sql = False
    writes_partitions = True

    def __init__(self, master: str | None = None, conf: dict[str, str] | None = None) -> None:
        #: the cluster to run on (``spark://host:7077``); default ``BULLDOZER_SPARK_MASTER`` or local[*]
        self.master = master
        #: extra Spark properties (default: the executors' environment archive, if configured)
        self.conf = conf

    def session(self, plan: LoadPlan) -> Any:
        from bulldozer.load.engines.spark.package import archive_conf

        catalog = plan.spec.data_movement.catalog
        conf = self.conf if self.conf is not None else archive_conf()
        return spark_session(catalog.name, dict(catalog.properties) or None, plan.home, self.master, conf)

    def load(self, plan: LoadPlan, client: KvClient, on_split: SplitDone, progress: Progress) -> LoadResult:
        from bulldozer.kv.tls import settings_tls_material
        from bulldozer.settings import load_settings
        from bulldozer.versioning.run_state import ledger_of

        spec = plan.spec
        spark = self.session(plan)
        register(spark)
        identifier = f"{spec.data_movement.catalog.name}.{spec.data_movement.source.table}"
        frame = spark.read.option("versionAsOf", str(plan.snapshot_id)).table(identifier)
        if spec.data_movement.filter:
            frame = frame.where(spec.data_movement.filter)
        keys = [f.column for f in plan.proto.key.fields]
        partitions = write_partitions(plan, spark.sparkContext.defaultParallelism)
        frame = frame.select(*plan.columns).repartition(partitions, *keys)
        tls = settings_tls_material(load_settings()) if client.credentials is not None else None
        layout = Layout(
            plan.proto, client.target, client.token, tls, plan.version, spec.key_value_dal.write, partitions
        )
        write_id = uuid.uuid4().hex[:8]
        log.info("writing %s in %d Spark tasks by key", plan.version, partitions)
        progress(0, 0)
        with _IdleWatch(spark, load_settings().spark_idle_timeout) as watch:
            try:
                (
                    frame.write.format(FORMAT)
                    .mode("overwrite")
                    .option("load_version", plan.version)
                    .option("layout", layout.encode_for_options())
                    .option("write_id", write_id)
                    .save()
                )
            except Exception as exc:
                if watch.fired:
                    raise LoadError(
                        f"no Spark task ran for {watch.timeout:,.0f} s on {spark.sparkContext.master}: the cluster "
                        "has no free cores, or its executors cannot reach this driver (BULLDOZER_SPARK_DRIVER_HOST); "
                        "the version is not flipped"
                    ) from None
                raise worker_error(exc) from None
        result = LoadResult()
        prefix = f"spark-{write_id}-"
        for split_id, data in sorted(ledger_of(client.describe(plan.version)).items()):
            if not split_id.startswith(prefix):
                continue
            split = SplitResult.from_json(split_id, data)
            result.splits[split_id] = split
            on_split(split)
        done = sum(split.rows for split in result.splits.values())
        progress(done, done)  # the tasks report when the write commits: all at once
        if not result.splits:
            raise LoadError(f"the Spark write of {plan.version} committed but recorded no results")
        return result


class _IdleWatch:
    """Cancels the session's Spark jobs when their stages wait ``timeout`` seconds with no
    task running or done — Spark itself waits for ever for executors that never come
    (``fired`` then says so). Spark's public status API: the active stages' task counts."""

    def __init__(self, spark: Any, timeout: float, poll: float = 1.0) -> None:
        self.spark, self.timeout, self.poll = spark, timeout, poll
        self.fired = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="spark-idle-watch", daemon=True)

    def __enter__(self) -> _IdleWatch:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()

    def _starved(self) -> bool:
        """Stages are waiting and none of them has a task running or done (no stage: the
        driver is planning, which is not waiting for executors)."""
        tracker = self.spark.sparkContext.statusTracker()
        infos = [tracker.getStageInfo(stage_id) for stage_id in tracker.getActiveStageIds()]
        infos = [info for info in infos if info is not None]
        return bool(infos) and not any(info.numActiveTasks or info.numCompletedTasks for info in infos)

    def _watch(self) -> None:
        starved_since: float | None = None
        while not self._stop.wait(self.poll):
            if not self._starved():
                starved_since = None
                continue
            now = time.monotonic()
            starved_since = starved_since if starved_since is not None else now
            if now - starved_since >= self.timeout:
                self.fired = True
                self.spark.sparkContext.cancelAllJobs()
                return
