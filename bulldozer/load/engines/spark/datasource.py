"""The ``bulldozer`` Spark data source: the one way Spark writes a version.

``df.write.format("bulldozer").mode("overwrite")`` with either ``option("spec", path)``
(a job spec: alias, endpoint, token, write tuning, gates, retention, protobuf naming, key
and value columns) or options naming the job directly (``alias``, ``key_columns``, and
optionally ``value_columns``, ``endpoint``, ``token``, ``table``, ``min_rows``,
``max_row_count_change``, ``keep_versions``, ``owner`` — default: the driver's user)
writes the DataFrame as a new version of the
alias and flips the alias to it:

- ``writer`` (on the driver) derives the schema from the DataFrame's (field numbers from
  the Iceberg table the spec or ``table`` names, where a column is that table's column,
  else derived from the column's name, as for a query), checks it against the live version's
  and creates the LOADING version; a missing key column or a key of a refused type (float,
  struct...) is refused here, before anything is written;
- ``write`` (one per task, on the executors) encodes its Arrow batches with the shared
  encoder, writes them through the DAL client, refuses rows sharing a key within the task,
  and returns its rows, digest and null counts as the commit message;
- ``commit`` (on the driver, once every task succeeded) adds the messages up — one per
  partition, from the attempt Spark committed, so a retried or speculative duplicate task
  is counted once (its writes were idempotent puts of the same records) — seals the
  version with that count and digest (the DAL measures what it holds: rows sharing a key
  across tasks show up here as fewer records than were sent), applies the quality gates
  and flips the alias by compare-and-set; any failure marks the version FAILED;
- ``abort`` (on the driver, when a task failed for good) marks the version FAILED. A
  driver killed at any point leaves a LOADING or SEALED version the alias never pointed at.

``bulldozer run --engine spark`` writes with the same writer (``SparkEngine``), for the
version the runner created, not through this source: in a ``mapInArrow`` job when Spark
reads the table (``BulldozerWriter.write_arrow``), or in an RDD job whose tasks read their
file splits themselves (``BulldozerWriter.write_splits``); the driver hands the tasks'
results to ``commit``, which records them on the version for the runner, which verifies
and flips as for every engine (so scheduled runs keep their separate verify and flip
stages). A write through the source costs three Python processes more on the driver, one
after the other (Spark's lookup of the source, its write planning and its commit), each
importing pyspark and Bulldozer.

The source is found by name (``format("bulldozer")``) once ``register(spark)`` ran, or
without it when ``bulldozer`` is installed (not editable) where Spark's Python runs:
Spark looks up top-level ``pyspark_*`` modules, and ``pyspark_bulldozer`` is one.
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from bulldozer.errors import BulldozerError, InvalidArgumentError, LoadError, SpecError, error_class_by_name
from bulldozer.kv.tls import TlsMaterial
from bulldozer.kv.types import StoreInfo
from bulldozer.schema.model import ProtoFile
from bulldozer.spec.models import WriteTuning

log = logging.getLogger(__name__)

__all__ = [
    "FORMAT",
    "RESULT_SCHEMA",
    "BulldozerDataSource",
    "BulldozerWriter",
    "PartitionResult",
    "collected_results",
    "register",
    "worker_error",
]

#: ``df.write.format(FORMAT)``
FORMAT = "bulldozer"
#: The options a DataFrame write takes (``spec`` alone, or the job's own options).
JOB_OPTIONS = (
    "spec",
    "alias",
    "key_columns",
    "value_columns",
    "endpoint",
    "token",
    "table",
    "min_rows",
    "max_row_count_change",
    "keep_versions",
    "owner",
)


@dataclass
class PartitionResult(WriterCommitMessage):
    """What one write task sent: the commit message."""

    partition: int
    rows: int
    digest: int
    bytes: int
    null_counts: dict[str, int] = field(default_factory=dict)


#: The schema of ``BulldozerWriter.write_arrow``'s rows: a task's ``PartitionResult`` as JSON.
RESULT_SCHEMA = "result string"


def collected_results(rows: list[Any]) -> list[WriterCommitMessage | None]:
    """The ``PartitionResult``s of the rows a ``write_arrow`` job collected."""
    import json

    return [PartitionResult(**json.loads(row.result)) for row in rows]


@dataclass
class Layout:
    """What every write task needs, made on the driver and pickled into the tasks."""

    proto: ProtoFile
    target: str
    token: str | None
    tls: TlsMaterial | None
    version: str
    tuning: WriteTuning
    #: write tasks sharing ``tuning.records_per_second`` (each sends at most its share)
    tasks: int = 1
    #: set when the tasks read the table's files themselves (``SparkEngine``'s split
    #: reads, ``BulldozerWriter.write_splits``): the ``SplitReader`` of the scan
    reader: Any = None
    #: the DAL's (``KvClient.describe_store``), asked once on the driver: the tasks refuse a
    #: record larger than it takes (``RowEncoder``)
    limits: StoreInfo | None = None

    @property
    def key_columns(self) -> list[str]:
        return [f.column for f in self.proto.key.fields]

    def client(self) -> Any:
        from bulldozer.kv.client import KvClient

        return KvClient(self.target, token=self.token, timeout=120, tls=self.tls)

    def writer(self, client: Any) -> Any:
        tuning = self.tuning
        return client.writer(
            self.version,
            batch_records=tuning.batch_size,
            batch_bytes=tuning.max_batch_bytes,
            in_flight=tuning.in_flight_batches,
        )


@dataclass
class _Job:
    """The run a DataFrame write is part of (job mode), carried from ``writer`` to ``commit``."""

    spec_text: str
    spec_source: str
    record: str  # RunRecord JSON
    live: str | None


class BulldozerWriter(DataSourceArrowWriter):
    def __init__(self, layout: Layout, job: _Job | None = None, write_id: str = "") -> None:
        self.layout, self.job, self.write_id = layout, job, write_id

    # -- on the executors -------------------------------------------------------

    def write_splits(self, splits: Iterator[Any]) -> Iterator[PartitionResult]:
        """``write`` for a task handed Iceberg file-scan task lists (an RDD's partition)
        instead of rows: it reads them with the layout's ``reader``, as the local engine
        does, a few batches ahead of the encoder."""
        from bulldozer.load.engines.local import READ_AHEAD, with_next_file
        from bulldozer.load.prefetch import read_ahead

        tasks = with_next_file([task for group in splits for task in group])

        def batches() -> Iterator[Any]:
            for task, then in tasks:
                yield from self.layout.reader.batches(task, then)

        with read_ahead(batches(), READ_AHEAD, "split-reader") as stream:
            yield self.write(stream)

    def write_arrow(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``write`` as a ``DataFrame.mapInArrow`` function (``SparkEngine``'s by-key job):
        the task's result as one row of ``RESULT_SCHEMA``, for the driver to collect and
        hand to ``commit``."""
        import json
        from dataclasses import asdict

        import pyarrow as pa

        result = json.dumps(asdict(self.write(batches)))
        yield pa.RecordBatch.from_arrays([pa.array([result], pa.string())], names=["result"])

    def write(self, iterator: Iterator[Any]) -> PartitionResult:
        from pyspark import TaskContext

        from bulldozer.codec.digest import Digest, digest_and_key_hashes, duplicate_hashes
        from bulldozer.load.encoder.encode import RowEncoder
        from bulldozer.load.engines.local import Throttle

        layout = self.layout
        rate = layout.tuning.records_per_second
        throttle = Throttle(max(1, rate // layout.tasks) if rate else None)
        encoder = RowEncoder(layout.proto, threads=1, limits=layout.limits)  # beside the executor's other tasks
        digest = Digest()
        nulls: dict[str, int] = {}
        hashes, keys = [], []
        rows = 0
        with layout.client() as client, layout.writer(client) as writer:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                throttle.wait(batch.num_rows)
                encoded = encoder.encode(batch)
                writer.add_arrays(encoded.keys, encoded.values)
                batch_digest, batch_hashes = digest_and_key_hashes(encoded.keys, encoded.values)
                digest.add(batch_digest)
                hashes.append(batch_hashes)
                keys.append(batch.select(layout.key_columns))
                rows += batch.num_rows
                for name in batch.schema.names:
                    count = batch.column(name).null_count
                    if count:
                        nulls[name] = nulls.get(name, 0) + count
        duplicated = duplicate_hashes(hashes)
        if duplicated:
            from bulldozer.load.runner import duplicate_key_error

            raise duplicate_key_error(_rows_with(hashes, keys, duplicated))
        context = TaskContext.get()
        return PartitionResult(context.partitionId() if context else 0, rows, digest.value, digest.bytes, nulls)

    # -- on the driver ----------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        from bulldozer.codec.digest import Digest
        from bulldozer.load.engines.base import LoadResult, SplitResult

        result = LoadResult()
        for message in messages:
            if not isinstance(message, PartitionResult):  # Spark sends one per task that succeeded
                raise LoadError("a Spark write task reported no result; the version is not verified")
            split = SplitResult(
                f"spark-{self.write_id}-{message.partition}",
                message.rows,
                Digest(message.rows, message.digest, message.bytes),
                dict(message.null_counts),
            )
            result.splits[split.split_id] = split
        with self.layout.client() as client:
            if self.job is None:
                from bulldozer.versioning.run_state import ledger_label

                # the runner (SparkEngine.load) reads this back and verifies as for any engine
                client.set_labels(self.layout.version, ledger_label({k: s.to_json() for k, s in result.splits.items()}))
                return
            run = self._run(client)
            try:
                with run.stage("load"):
                    run.record_load(result)
                with run.stage("verify"):
                    _verify(run, result)
                with run.stage("flip"):
                    run.flip()
                with run.stage("retention"):
                    run.retention_after_flip()
                record = run.finish()
                if run.lineage is not None:
                    run.lineage.complete(record)
            except BaseException as exc:
                run.failed(exc)
                run.lineage_fail()
                raise

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.job is None:
            return  # the runner records the failure (and may resume the version)
        with self.layout.client() as client:
            run = self._run(client)
            with run.stage("load"):
                pass
            run.failed(LoadError("a Spark write task failed (the Spark job's error says which)"))
            run.lineage_fail()

    def _run(self, client: Any) -> Any:
        """The job's run, as ``writer`` left it."""
        from bulldozer.load.runner import JobRun
        from bulldozer.spec.loader import load_spec_text
        from bulldozer.versioning.run_state import RunRecord

        assert self.job is not None
        loaded = load_spec_text(self.job.spec_text, self.job.spec_source)
        run = JobRun(loaded, client, engine="spark")
        run.record = RunRecord.from_json(self.job.record)
        run.stage.record = run.record
        run.version_created = True
        run.live = client.describe(self.job.live) if self.job.live else None
        return run


def _verify(run: Any, result: Any) -> None:
    """The verify stage of a DataFrame write, naming rows that share a key across tasks
    (which a task cannot see) instead of a bare count mismatch."""
    from bulldozer.errors import VerificationError

    try:
        run.verify()
    except VerificationError:
        stored = run.client.describe(run.record.version).record_count
        if stored and stored < result.rows:
            from bulldozer.errors import DuplicateKeyError

            raise DuplicateKeyError(
                f"{result.rows - stored:,} of the DataFrame's {result.rows:,} rows share a key with a row in another "
                "partition; deduplicate the DataFrame (rows with one key must be one row)"
            ) from None
        raise


def _rows_with(hashes: list[Any], keys: list[Any], wanted: set[int], limit: int = 3) -> list[dict[str, Any]]:
    """Key values (column → value) of rows whose key hash is in ``wanted``."""
    import numpy as np

    found: list[dict[str, Any]] = []
    seen: set[int] = set()
    targets = np.fromiter(wanted, dtype=np.uint64)
    for batch_hashes, batch_keys in zip(hashes, keys, strict=True):
        for i in np.flatnonzero(np.isin(batch_hashes, targets)):
            h = int(batch_hashes[i])
            if h in seen:
                continue
            seen.add(h)
            found.append(batch_keys.slice(int(i), 1).to_pylist()[0])
            if len(found) >= limit:
                return found
    return found


class BulldozerDataSource(DataSource):
    """``format("bulldozer")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def writer(self, schema: Any, overwrite: bool) -> BulldozerWriter:
        options = {str(k).lower(): str(v) for k, v in self.options.items() if k.lower() != "path"}
        if not overwrite:
            raise InvalidArgumentError(
                'write with .mode("overwrite"): every write makes a whole new version of the alias and replaces '
                "what readers see at the flip (rows are never appended to the live version)"
            )
        unknown = sorted(set(options) - set(JOB_OPTIONS))
        if unknown:
            raise InvalidArgumentError(
                f"unknown option(s): {', '.join(unknown)}; the bulldozer format takes {', '.join(JOB_OPTIONS)}"
            )
        return _job_writer(options, schema)


def _spec_from_options(options: dict[str, str]) -> Any:
    """The job spec a DataFrame write describes: ``spec`` (a file) or the job's own options."""
    import getpass

    import yaml

    from bulldozer.spec.loader import load_spec, load_spec_text

    if "spec" in options:
        extra = sorted(set(options) - {"spec"})
        if extra:
            raise InvalidArgumentError(
                f"option(s) {', '.join(extra)} given with spec: set them in the spec file instead"
            )
        return load_spec(options["spec"])
    missing = [name for name in ("alias", "key_columns") if not options.get(name)]
    if missing:
        raise InvalidArgumentError(
            f"the bulldozer format needs option spec, or alias and key_columns (missing: {', '.join(missing)})"
        )
    alias = options["alias"]

    def columns(name: str) -> list[str]:
        return [c.strip() for c in options[name].split(",") if c.strip()]

    def number(name: str, kind: type) -> Any:
        try:
            return kind(options[name])
        except ValueError:
            raise InvalidArgumentError(f"option {name}={options[name]!r} is not a number") from None

    dal: dict[str, Any] = {"alias": alias}
    if "endpoint" in options:
        dal["endpoint"] = options["endpoint"]
    if "token" in options:
        dal["token"] = options["token"]
    if "keep_versions" in options:
        dal["retention"] = {"keep_versions": number("keep_versions", int)}
    gates: dict[str, Any] = {}
    if "min_rows" in options:
        gates["min_rows"] = number("min_rows", int)
    if "max_row_count_change" in options:
        gates["max_row_count_change"] = number("max_row_count_change", float)
    if gates:
        dal["quality_gates"] = gates
    movement: dict[str, Any] = {
        "source": {"table": options.get("table", "spark.dataframe")},
        "key_columns": columns("key_columns"),
    }
    if "value_columns" in options:
        movement["value_columns"] = columns("value_columns")
    document = {
        "apiVersion": "bulldozer/v1",
        "kind": "MoveDataToKvDal",
        "metadata": {"name": alias, "owner": options.get("owner") or getpass.getuser()},
        "data_movement": movement,
        "key_value_dal": dal,
        "bulldozer_protobuf": {"package": f"bulldozer.jobs.{alias}"},
    }
    # the text goes through the spec loader like any spec: one set of rules and messages
    return load_spec_text(yaml.safe_dump(document, sort_keys=False), "the bulldozer format's options", env={})


#: fields of data_movement that read a table; a DataFrame write has read it already
_READING_FIELDS = {
    "filter": "filter the DataFrame",
    "snapshot_id": "read the table at that snapshot",
    "ref": "read the table at that branch or tag",
    "duplicate_keys": "deduplicate the DataFrame",
}


def _job_writer(options: dict[str, str], schema: Any) -> BulldozerWriter:
    from pyspark.sql.pandas.types import to_arrow_schema

    from bulldozer.kv.client import KvClient
    from bulldozer.kv.connect import checked_endpoint, endpoint_issues, spec_token
    from bulldozer.kv.tls import settings_tls_material
    from bulldozer.load.runner import JobRun
    from bulldozer.load.source import output_schema
    from bulldozer.settings import load_settings

    loaded = _spec_from_options(options)
    spec = loaded.spec
    dm = spec.data_movement
    # a spec file's endpoint is the spec's (untrusted); an ``endpoint`` option is the program's own
    issues = endpoint_issues(loaded) if "spec" in options else []
    if dm.source.query is not None:
        issues.append(
            loaded.issue(("data_movement", "source", "query"), "a DataFrame write has no query: run it in Spark")
        )
    reading = {
        "filter": dm.filter,
        "snapshot_id": dm.snapshot_id,
        "ref": dm.ref,
        "duplicate_keys": dm.duplicate_keys.order_by,
    }
    for name, instead in _READING_FIELDS.items():
        if reading[name] is not None:
            issues.append(
                loaded.issue(("data_movement", name), f"a DataFrame write does not read the table: {instead}")
            )
    if spec.key_value_dal.write.records_per_second is not None:
        issues.append(
            loaded.issue(
                ("key_value_dal", "write", "records_per_second"),
                "a DataFrame write's rate is its parallelism: repartition it (or coalesce) to send slower",
            )
        )
    if spec.key_value_dal.write.partitions is not None:
        issues.append(
            loaded.issue(
                ("key_value_dal", "write", "partitions"), "a DataFrame write keeps its partitions: repartition it"
            )
        )
    if issues:
        raise SpecError(issues)
    settings = load_settings()
    named = spec.key_value_dal.endpoint
    target = checked_endpoint(named or settings.dal_endpoint())  # a typo: one line now, not a 60 s wait
    if target == "embedded":
        raise InvalidArgumentError(
            "a DataFrame write needs a DAL the executors reach (host:port): set the spec's endpoint or "
            "BULLDOZER_ENDPOINT (start one with `bulldozer serve`)"
        )
    token = spec_token(loaded, target, operator_endpoint=named is None)
    tls = settings_tls_material(settings)
    arrow_schema = to_arrow_schema(schema)
    sources = []
    source_name = "DataFrame"
    if "table" in options or "spec" in options:
        from bulldozer.warehouse.catalog import load_source_table

        # the table the DataFrame comes from gives its columns' field numbers: it must be
        # found (numbering them from their names instead would break the alias's readers)
        assert dm.source.table is not None
        sources = [load_source_table(dm.catalog, None, dm.source.table).schema()]
        source_name = f"DataFrame from {dm.catalog.name}.{dm.source.table}"
    iceberg_schema = output_schema(arrow_schema, sources, uuid_as_text=True)  # Spark reads uuid as text
    client = KvClient(target, token=token, timeout=60, tls=tls)
    with client:
        run = JobRun(loaded, client, engine="spark")
        try:
            with run.stage("schema"):
                job = run.schema_of(iceberg_schema, source_name)
            run.lineage_start()
            with run.stage("create"):
                version = run.create(None)
        except BaseException as exc:
            run.failed(exc)
            run.lineage_fail()
            raise
        finally:
            # this process only plans the write (its tasks and commit run elsewhere, with
            # their own DAL calls), and its client closes on return: no heartbeat from here
            run.stop_beating()
        layout = Layout(job.proto, target, token, tls, version, spec.key_value_dal.write)
        layout.limits = client.describe_store()
        state = _Job(loaded.text, loaded.source, run.record.to_json(), run.live.name if run.live else None)
        log.info("writing the DataFrame into %s", version)
        return BulldozerWriter(layout, state, write_id=run.record.run_id)


def register(spark: Any) -> None:
    """Make ``format("bulldozer")`` known to ``spark`` (once per session). Spark also
    finds the source without this where ``pyspark_bulldozer`` is installed, but runs it
    with the interpreter it started with, by path — which a cluster's executors do not
    have when they run a shipped environment (``package.archive_conf``); registering here
    runs it with the session's interpreter, whatever it is."""
    if spark not in _REGISTERED:
        spark.dataSource.register(BulldozerDataSource)
        _REGISTERED.add(spark)


#: sessions ``register`` registered the source on
_REGISTERED: weakref.WeakSet[Any] = weakref.WeakSet()


def worker_error(exc: Exception) -> Exception:
    """The error a failed Spark job stands for: the Bulldozer error a Python worker raised
    (bad data, a DAL refusal, a refused spec), with its one-line message; else ``exc``
    itself. Spark hands the worker's error back with the worker's traceback in its text;
    its last ``module.Class: message`` line of Bulldozer's tree is the error."""
    lines = str(exc).splitlines()
    for index in range(len(lines) - 1, -1, -1):
        match = _TRACEBACK_ERROR.match(lines[index].strip())
        if match is None:
            continue
        cls = error_class_by_name(match.group(1))
        if cls is None or not issubclass(cls, BulldozerError):
            continue
        # a message of several lines (a spec's issues) runs on until Spark's own text
        message = [match.group(2)]
        for more in lines[index + 1 :]:
            if not more.strip() or more.startswith(("\tat ", "JVM stacktrace", " SQLSTATE")) or "SQLSTATE:" in more:
                break
            message.append(more.strip())
        try:
            return cls("\n".join(message))
        except TypeError:  # a class with a richer constructor: keep Spark's error
            return exc
    return _job_failure(exc, lines)


def _job_failure(exc: Exception, lines: list[str]) -> Exception:
    """A Spark job that failed for another reason (a Python worker's own exception, a worker
    or executor that died) as one line: which tasks failed, and the Python exception or
    Spark's cause (its full text, with both stack traces, is logged at debug level); else
    ``exc`` itself."""
    stage = next((m for m in map(_STAGE_FAILURE.search, lines) if m is not None), None)
    if stage is None:
        return _driver_failure(exc)
    log.debug("the Spark job failed: %s", exc)
    cause = stage.group(2) or ""
    traceback = next((i for i, line in enumerate(lines) if "PythonException: Traceback" in line), None)
    if traceback is not None:  # the Python worker's own exception: the traceback's last line
        cause = next((line for line in lines[traceback + 1 :] if _PYTHON_ERROR.match(line)), cause)
    cause = cause.strip()
    cause = cause if len(cause) <= 300 else cause[:297] + "..."
    return LoadError(f"the Spark job failed ({stage.group(1)}): {cause or 'Spark gave no cause'}")


def _driver_failure(exc: Exception) -> Exception:
    """A Java exception Spark's driver raised (planning the read, opening a table's files)
    as one line: the exception and its root cause, each as ``Class: first line of its
    message`` (Py4J's text is both with every stack frame, run together: 20 KB for a file
    system Hadoop does not have); the full text is logged at debug level. Else ``exc``."""
    java = getattr(exc, "java_exception", None)  # py4j.protocol.Py4JJavaError's
    if java is None:
        return exc
    try:
        chain: list[str] = []
        while java is not None and len(chain) < 32:
            message = str(java.getMessage() or "").strip().splitlines()
            chain.append(f"{java.getClass().getSimpleName()}: {message[0] if message else ''}".rstrip(": "))
            java = java.getCause()
    except Exception:  # the JVM went away: nothing more to ask it
        return exc
    log.debug("the Spark job failed: %s", exc)
    shown = [line if len(line) <= 300 else line[:297] + "..." for line in (chain[0], chain[-1])]
    cause = f" (its cause: {shown[1]})" if len(chain) > 1 else ""
    return LoadError(f"the Spark job failed: {shown[0]}{cause}")


#: ``bulldozer.errors.SourceDataError: message`` (the module path is optional)
_TRACEBACK_ERROR = re.compile(r"^(?:[\w.]+\.)?([A-Z]\w*Error): (.+)$")
#: ``Job aborted due to stage failure: Task 1 in stage 0.0 failed 4 times, most recent
#: failure: Lost task 1.3 in stage 0.0 (TID 7) (host executor 0): org.apache.…Exception: cause``
_STAGE_FAILURE = re.compile(
    r"Job aborted due to stage failure: (Task \S+ in stage \S+ failed \d+ times?)"
    r"(?:, most recent failure: Lost task .*?\(TID \d+\) \(.*?\): (?:[\w.$]+: )?(.*))?"
)
#: the last line of a Python traceback: ``AttributeError: message`` (not indented)
_PYTHON_ERROR = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b")
