"""``spark``: load with Apache Spark (pyspark 4.1 + Iceberg's Spark runtime).

Spark schedules the write tasks; how their rows reach them depends on the snapshot's files
(``write_tasks``):

- **split reads** (the snapshot has at least as many file splits as write tasks, or one
  task per split is faster than the read by key, ``in_place_is_faster``): the
  driver plans the pinned snapshot with pyiceberg, as the local engine does, and hands each
  task a group of splits of about equal bytes; the task reads them with the local engine's
  reader on the executor (``SplitReader``: no JVM decode, no Arrow hand-over from the JVM,
  no shuffle). The tasks run ``BulldozerWriter.write`` in an RDD job and the driver calls
  its ``commit`` with their results. Tasks cannot see each other's keys here: rows sharing
  a key in two tasks are found by the seal's count, and the runner names them.
- **by key** (a few large files, and many more cores: ``in_place_is_faster``): Spark
  reads the table at the snapshot through Iceberg's Spark catalog (``session``), spreads
  the rows over the tasks by a hash of the key columns, and the tasks write them in a
  ``mapInArrow`` job (``BulldozerWriter.write_arrow``) whose results the driver collects
  and commits, as for split reads; rows sharing a key meet in one task, which names them.

Either way the same writer encodes with the shared encoder, writes through the DAL client
and reports each task's rows, digest and null counts (one result per partition, so a retried
or speculative task counts once); the commit hands them to the runner, which verifies and
flips as for every engine. ``key_value_dal.write.partitions`` sets the number of tasks
(default: ``write_tasks``).

``local[*]`` by default; set ``BULLDOZER_SPARK_MASTER`` (or ``bulldozer run --master``)
to run on a cluster — the executors must reach the catalog's files and the DAL endpoint,
and run Python with Bulldozer installed: ``bulldozer spark package`` builds that
environment as an archive, and ``BULLDOZER_SPARK_ARCHIVE`` ships it with every job
(``package``). The Python workers fork from a daemon that has Bulldozer imported
(``daemon``).

A full run starts Spark ahead (``prepare``), in a thread, while the run reads the schema
and creates the version: the driver's context, then a job of one empty task per core that
brings up the executors' Python workers, so the load's own job finds them running. Split
reads need only the context; Spark SQL (the session, Iceberg's catalog) starts for the
by-key path alone.

Resume with Spark re-sends every row (partitions are not stable across sessions; puts are
idempotent, so the result is the same).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Sequence
from types import TracebackType
from typing import Any, ClassVar

from bulldozer.errors import LoadError, SchemaError, UnreadableFilesError
from bulldozer.kv.client import KvClient
from bulldozer.load.engines.base import LoadPlan, LoadResult, Progress, SplitDone, SplitResult
from bulldozer.load.engines.local import LocalEngine, SplitReader, scan_tasks, source_scan
from bulldozer.load.engines.spark.row_filter import spark_row_filter
from bulldozer.load.engines.spark.session import (
    ICEBERG_RUNTIME,
    SQLITE_JDBC,
    spark_context,
    spark_session,
    stop_spark_session,
)
from bulldozer.spec.models import JobSpec
from bulldozer.warehouse.files import snapshot_files, task_files, verify_files

log = logging.getLogger(__name__)

__all__ = ["ICEBERG_RUNTIME", "SQLITE_JDBC", "SparkEngine", "spark_session", "stop_spark_session"]

#: data-file bytes per write task when the spec does not set ``write.partitions``
BYTES_PER_PARTITION = 64 * 1024 * 1024


def write_tasks(
    plan: LoadPlan, parallelism: int, split_sizes: Sequence[int] | None, unreadable: str | None = None
) -> tuple[int, bool]:
    """How many write tasks, and whether they read the snapshot's file splits themselves
    (else Spark reads the table and repartitions its rows by key over them).

    ``split_sizes``: the data-file bytes of each split the tasks could read, None when the
    local reader cannot read the snapshot (Spark's reader then reads it by key).
    ``write.partitions`` when the spec sets it: read in place when there are at least that
    many splits. Else read in place when the splits keep every core Spark has busy, in one
    task per 64 MiB of data files (at most one per split, at least one per core); with fewer
    splits than cores, one task per split when that is the faster way
    (``in_place_is_faster``), a core or more left idle (no split at all: one empty task);
    else one task per 64 MiB, at least one per core, fed by key.

    ``unreadable``: why Spark's own reader cannot read a column the job reads (a time:
    Spark has no time type). The tasks then read the splits themselves, one per split at
    most (fewer than the cores, maybe); a spec asking for more tasks than splits is refused."""
    size = 0
    snapshot = plan.table.snapshot_by_id(plan.snapshot_id) if plan.table is not None else None
    if snapshot is not None and snapshot.summary is not None:
        size = int(snapshot.summary.get("total-files-size", "0") or 0)
    by_size = max(parallelism, math.ceil(size / BYTES_PER_PARTITION), 1)
    splits = len(split_sizes) if split_sizes is not None else 0
    chosen = plan.spec.key_value_dal.write.partitions
    if chosen is not None:
        if unreadable and splits < chosen:
            raise SchemaError(
                f"{unreadable}, so each Spark task reads files itself, and the snapshot has {splits} "
                f"to read: key_value_dal.write.partitions: {chosen} is more tasks than that (lower it, "
                "or leave it out)"
            )
        return chosen, splits >= chosen
    faster = split_sizes is not None and in_place_is_faster(split_sizes, parallelism)
    if splits >= parallelism or unreadable or faster:
        return max(1, min(splits, by_size)), True
    return by_size, False


#: how many times more a row read by key costs than one its task reads in place (Iceberg's
#: JVM read, a shuffle, the hand-over to Python in Arrow, against the local reader), measured
#: on ``local[2]`` with one data file, the load stage without Spark's start: 500,000 flat rows
#: (10 MB) 0.6 s in place on one core against 14 s by key on both, 1,600,000 nested rows
#: (123 MB) 3.5 s against 31-35 s; with the by-key path's own start (about 9 s then: Spark SQL,
#: its planning, the data source's commit; about 4.5 s less since the tasks write in a
#: mapInArrow job) taken out, 16 and 12-14 times the core-seconds
BY_KEY_COST = 12


def in_place_is_faster(split_sizes: Sequence[int], parallelism: int) -> bool:
    """With fewer splits than cores: whether one task per split, the largest setting the
    pace, ends sooner than Spark's read by key spread over every core at ``BY_KEY_COST``
    times the cost a row. Always when no split is larger than a task's worth (64 MiB): the
    by-key path's own start alone costs more. So on this 2-core machine a table of few files
    is always read in place (the sample table in one file, whole command: 5,000 rows 14.7 s
    by key against 5.2 s in place; 1,600,000 rows, 123 MB, 41-45 s against 13.5-14 s); by key
    takes a cluster of more than ``BY_KEY_COST`` cores for one large file."""
    largest = max(split_sizes, default=0)
    return largest <= BYTES_PER_PARTITION or parallelism * largest <= BY_KEY_COST * sum(split_sizes)


class SparkEngine(LocalEngine):
    name = "spark"
    resumes_splits = False
    runs_sql = False
    writes_partitions = True
    #: what Iceberg's Spark reader cannot read (the by-key path): ``write_tasks`` then reads splits
    unreadable_types: ClassVar[dict[str, str]] = {"time": "Spark has no time type"}

    def __init__(self, master: str | None = None, conf: dict[str, str] | None = None) -> None:
        #: the cluster to run on (``spark://host:7077``); default ``BULLDOZER_SPARK_MASTER`` or local[*]
        self.master = master
        #: extra Spark properties (default: the executors' environment archive, if configured)
        self.conf = conf
        self.shared_keys_unchecked = False  # set by each load (see LoadEngine)
        self._starting: _Start | None = None

    def _context_args(self, spec: JobSpec, home: str | None) -> tuple[Any, ...]:
        from bulldozer.load.engines.spark.package import archive_conf
        from bulldozer.warehouse.catalog import catalog_properties

        catalog = spec.data_movement.catalog
        conf = self.conf if self.conf is not None else archive_conf()
        return (catalog.name, catalog_properties(catalog), home, self.master, conf)

    def refuse(self, spec: JobSpec) -> None:
        """A catalog Spark's JVM cannot open (``catalog.refuse_unopenable``)."""
        from bulldozer.load.engines.spark.catalog import refuse_unopenable

        refuse_unopenable(spec.data_movement.catalog)

    def session(self, plan: LoadPlan) -> Any:
        """The SparkSession (Spark SQL, Iceberg's catalog) for ``plan``: the by-key path's."""
        return spark_session(*self._context_args(plan.spec, plan.home))

    def prepare(self, spec: JobSpec, home: str | None) -> None:
        """Start the driver and bring up the executors' Python workers (a job of one empty
        task per core: each executor starts its worker daemon, which imports Bulldozer,
        ``daemon``) in a thread, while the run reads the schema and creates the version.
        Measured on the 2-core machine (2 M nested rows, ``local[2]``): see README."""
        args = self._context_args(spec, home)
        if self._starting is None or self._starting.args != args:
            self._starting = _Start(args)

    def context(self, plan: LoadPlan) -> tuple[Any, _Start | None]:
        """The SparkContext for ``plan``, and the start ``prepare`` began for it if any
        (its workers may still be coming up)."""
        args = self._context_args(plan.spec, plan.home)
        starting, self._starting = self._starting, None
        if starting is not None and starting.args == args:
            return starting.context(), starting
        return spark_context(*args), None

    def load(self, plan: LoadPlan, client: KvClient, on_split: SplitDone, progress: Progress) -> LoadResult:
        spec = plan.spec
        started = time.perf_counter()
        # the context first: the start ``prepare`` began imports pyspark on its thread, and
        # this thread importing pyspark.sql meanwhile made the two imports wait on each
        # other, which importlib ends by handing one of them the half-made module
        # ("cannot import name 'SQLContext' from partially initialized module
        # 'pyspark.sql'": a run failed at random, a small table's load reaching here first)
        context, starting = self.context(plan)
        startup = time.perf_counter() - started
        # pyspark.sql on first use: the executors' worker daemon imports this package before
        # it chooses where pyspark is imported from (``daemon``)
        from bulldozer.kv.tls import settings_tls_material
        from bulldozer.load.engines.spark.datasource import (
            RESULT_SCHEMA,
            BulldozerWriter,
            Layout,
            collected_results,
            worker_error,
        )
        from bulldozer.settings import load_settings
        from bulldozer.versioning.run_state import ledger_of

        scan = source_scan(plan.table, spec, plan.snapshot_id, plan.columns)
        unreadable = self.unreadable(scan.projection().fields)
        try:
            splits, files = scan_tasks(scan), None
        except UnreadableFilesError as exc:
            # the local reader reads no Avro data file, and cannot apply some equality deletes
            # exactly: Iceberg's Spark reader reads it by key, from the files its manifests list
            if unreadable:
                raise SchemaError(
                    f"{unreadable}, so Spark's reader cannot read the table, and it {exc.why}, which pyiceberg's "
                    f"reader cannot: no engine here reads it until they are rewritten ({exc.remedy})"
                ) from exc
            splits, files = [], snapshot_files(scan)
        sizes = [task.file.file_size_in_bytes for task in splits] if files is None else None
        partitions, in_place = write_tasks(plan, context.defaultParallelism, sizes, unreadable)
        tls = client.tls or (settings_tls_material(load_settings()) if client.credentials is not None else None)
        layout = Layout(
            plan.proto, client.target, client.token, tls, plan.version, spec.key_value_dal.write, partitions
        )
        layout.limits = client.describe_store()
        write_id = uuid.uuid4().hex[:8]
        writer = BulldozerWriter(layout, write_id=write_id)
        self.shared_keys_unchecked = in_place
        progress(0, 0)
        with _IdleWatch(context, load_settings().spark_idle_timeout) as watch:
            try:
                # Spark SQL and the read's plan while the executors' Python workers come up:
                # a 5 k-row upserted table by key, whole command 11.2 -> 10.0 s (medians of 3,
                # alternating; Spark's start waited for 3.7 s, then 1.8 s)
                if not in_place:
                    frame = self._by_key(plan, scan, files if files is not None else task_files(splits), partitions)
                if starting is not None:  # the executors' Python workers: part of the start-up
                    waited = time.perf_counter()
                    starting.workers()
                    startup += time.perf_counter() - waited
                if in_place:
                    # the files feed every task: each task reads its own splits with the
                    # local engine's reader (no JVM decode, no Arrow hand-over from the JVM,
                    # no shuffle), in an RDD job driving the writer's write and commit
                    # (no data source planning in Python workers)
                    layout.reader = SplitReader.of(plan.table, scan)
                    groups = split_groups(splits, partitions)
                    log.info("writing %s in %d Spark tasks reading %d splits", plan.version, len(groups), len(splits))
                    tasks = context.parallelize(groups, max(1, len(groups)))  # an empty snapshot: one empty task
                    writer.commit(tasks.mapPartitions(writer.write_splits).collect())
                else:
                    log.info("writing %s in %d Spark tasks by key", plan.version, partitions)
                    # the tasks write in a mapInArrow job and the driver commits what it
                    # collects, as for split reads, in the Python workers the start brought
                    # up (SPARK_SIMPLIFIED_TRACEBACK, session.py). Through the bulldozer data
                    # source, Spark started three Python processes more, one after the other
                    # (its lookup, write planning and commit), each importing pyspark and
                    # Bulldozer, and its tasks' workers from a daemon of their own: a 5 k-row
                    # upserted table by key, whole command 13.9 -> 9.3 s (medians of 3, alternating)
                    rows = frame.mapInArrow(writer.write_arrow, RESULT_SCHEMA).collect()
                    writer.commit(collected_results(rows))
            except Exception as exc:
                if watch.fired:
                    raise LoadError(
                        f"no Spark task ran for {watch.timeout:,.0f} s on {context.master}: the cluster "
                        "has no free cores, or its executors cannot reach this driver (BULLDOZER_SPARK_DRIVER_HOST); "
                        "the version is not flipped"
                    ) from None
                raise worker_error(exc) from None
        result = LoadResult(engine_start=round(startup, 3))
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

    def _by_key(self, plan: LoadPlan, scan: Any, files: Any, partitions: int) -> Any:
        """The by-key path's DataFrame: the snapshot read by Iceberg's Spark reader, the job's
        filter applied, its rows spread over ``partitions`` tasks by a hash of the key."""
        # Iceberg's Spark reader reads the files as they are: each is checked here first
        # (few: this path is taken for fewer files than tasks, or for a snapshot the local
        # reader cannot read: then all of them)
        verify_files(plan.table.io, files)
        spec = plan.spec
        spark = self.session(plan)
        identifier = f"{spec.data_movement.catalog.name}.{spec.data_movement.source.table}"
        frame = spark.read.option("versionAsOf", str(plan.snapshot_id)).table(identifier)
        if spec.data_movement.filter:  # pyiceberg's grammar, never Spark SQL text
            frame = frame.where(spark_row_filter(scan, frame.schema))
        keys = [f.column for f in plan.proto.key.fields]
        return frame.select(*plan.columns).repartition(partitions, *keys)


def _no_rows(rows: Any) -> list[Any]:
    """The warm-up task: nothing (its worker, forked from the daemon, is then idle for the load's tasks)."""
    return []


class _Start:
    """A Spark start ``SparkEngine.prepare`` runs in a thread: the context for ``args``
    (``spark_context``), then a job of one empty task per core, which starts each
    executor's Python worker daemon and forks its workers. ``context`` and ``workers``
    wait for each step and raise what it raised."""

    def __init__(self, args: tuple[Any, ...]) -> None:
        self.args = args
        self._context: Any = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spark-start", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._context = spark_context(*self.args)
            self._ready.set()
            cores = self._context.defaultParallelism
            self._context.setJobDescription("bulldozer: start the executors' Python workers")  # this thread's jobs
            self._context.parallelize(range(cores), cores).mapPartitions(_no_rows).collect()
        except BaseException as exc:  # handed to the load, which raises it
            self._error = exc
        finally:
            self._ready.set()

    def context(self) -> Any:
        while not self._ready.wait(0.5):  # woken: a SIGTERM taken by another thread is handled here
            pass
        if self._context is None:
            assert self._error is not None
            raise self._error
        return self._context

    def workers(self) -> None:
        while self._thread.is_alive():  # as in ``context``
            self._thread.join(0.5)
        if self._error is not None:
            raise self._error


def split_groups(splits: list[Any], count: int) -> list[list[Any]]:
    """``splits`` in ``count`` groups of about equal bytes (largest first, each to the
    lightest group so far), each group in file order."""
    groups: list[list[Any]] = [[] for _ in range(count)]
    sizes = [0] * count
    for task in sorted(splits, key=lambda t: -int(t.file.file_size_in_bytes)):
        lightest = sizes.index(min(sizes))
        groups[lightest].append(task)
        sizes[lightest] += int(task.file.file_size_in_bytes)
    return [sorted(group, key=lambda t: t.file.file_path) for group in groups if group]


class _IdleWatch:
    """Cancels the session's Spark jobs when their stages wait ``timeout`` seconds with no
    task running or done — Spark itself waits for ever for executors that never come
    (``fired`` then says so). Spark's public status API: the active stages' task counts."""

    def __init__(self, context: Any, timeout: float, poll: float = 1.0) -> None:
        self.context, self.timeout, self.poll = context, timeout, poll
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
        tracker = self.context.statusTracker()
        infos = [tracker.getStageInfo(stage_id) for stage_id in tracker.getActiveStageIds()]
        infos = [info for info in infos if info is not None]
        return bool(infos) and not any(info.numActiveTasks or info.numCompletedTasks for info in infos)

    def _watch(self) -> None:
        try:
            self._watch_until_stopped()
        except Exception as exc:  # the driver went away under it (its run ended: a time limit, a signal)
            log.debug("the Spark idle watch stopped: %s", exc)  # the run says what ended it, in its one line

    def _watch_until_stopped(self) -> None:
        starved_since: float | None = None
        while not self._stop.wait(self.poll):
            if not self._starved():
                starved_since = None
                continue
            now = time.monotonic()
            starved_since = starved_since if starved_since is not None else now
            if now - starved_since >= self.timeout:
                self.fired = True
                self.context.cancelAllJobs()
                return
